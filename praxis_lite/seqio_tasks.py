"""Pieces for registering LM SeqIO Tasks: vocabularies, Pax's LM preprocessors, registration.

Used by the experiments in ``tasks/`` (C4, text files) to build their Tasks the way
Pax's ``c4.py`` does: tokenize, concatenate documents, split into targets-length pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import seqio
import tensorflow as tf

from praxis_lite.base_input import InputConfigError

_AUTOTUNE = tf.data.AUTOTUNE


def make_vocabulary(vocab_path: str | None) -> seqio.Vocabulary:
    """A SentencePiece vocabulary at ``vocab_path``, or bytes (``ByteVocabulary``) if None."""
    if vocab_path is None:
        return seqio.ByteVocabulary()
    return seqio.SentencePieceVocabulary(vocab_path)


def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128, **unused: Any
) -> tf.data.Dataset:
    """Concatenates the tokens of every ``batch_size`` consecutive examples into one.

    T5's preprocessor of that name: keeps only ``feature_key``; padding (0) is dropped.
    """
    del unused
    ds = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=_AUTOTUNE)
    ds = ds.padded_batch(batch_size, padded_shapes={feature_key: [None]})

    def concat(x):
        tokens = tf.reshape(x[feature_key], [-1])
        return {feature_key: tf.boolean_mask(tokens, tf.not_equal(tokens, 0))}

    return ds.map(concat, num_parallel_calls=_AUTOTUNE)


def split_tokens_to_targets_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None,
    output_features: Mapping[str, seqio.Feature],
    feature_key: str = "targets",
    **unused: Any,
) -> tf.data.Dataset:
    """Splits each example's tokens into consecutive pieces of the targets length.

    T5's preprocessor of that name: the pieces leave room for an EOS when the
    feature adds one; the last piece of an example may be shorter.
    """
    del unused
    if not sequence_length or feature_key not in sequence_length:
        raise ValueError(
            f"split_tokens_to_targets_length needs sequence_length[{feature_key!r}]; pass "
            "task_feature_lengths when reading the task."
        )
    length = sequence_length[feature_key] - int(output_features[feature_key].add_eos)

    def split(x):
        tokens = x[feature_key]
        n = tf.size(tokens)
        pieces = (n + length - 1) // length
        padded = tf.pad(tokens, [[0, pieces * length - n]])
        sizes = tf.minimum(length, n - tf.range(pieces) * length)
        return {"tokens": tf.reshape(padded, [pieces, length]), "size": sizes}

    ds = dataset.map(split, num_parallel_calls=_AUTOTUNE).unbatch()
    return ds.map(lambda x: {feature_key: x["tokens"][: x["size"]]}, num_parallel_calls=_AUTOTUNE)


def lm_preprocessors(text_key: str, concat_batch_size: int = 128) -> list[Callable]:
    """Pax's C4 LM recipe: text -> targets, tokenize, concatenate, split, append EOS."""
    return [
        lambda ds: ds.map(lambda x: {"targets": x[text_key]}, num_parallel_calls=_AUTOTUNE),
        seqio.preprocessors.tokenize,
        lambda ds: reduce_concat_tokens(ds, batch_size=concat_batch_size),
        split_tokens_to_targets_length,
        seqio.preprocessors.append_eos_after_trim,
    ]


# Task name -> the settings this module registered it with.
_REGISTERED_SETTINGS: dict[str, Mapping[str, Any]] = {}


def register_task_once(
    name: str, settings: Mapping[str, Any], make_task: Callable[[str], seqio.Task]
) -> seqio.Task:
    """Registers ``make_task(name)`` unless it is already registered with ``settings``.

    Idempotent: the same settings return the registered task; different settings
    (say, a new vocabulary path) replace it. A name that other code registered is
    an error rather than silently replaced.
    """
    if name in seqio.TaskRegistry.names():
        if _REGISTERED_SETTINGS.get(name) == dict(settings):
            return seqio.TaskRegistry.get(name)
        if name not in _REGISTERED_SETTINGS:
            raise InputConfigError(
                f"SeqIO task {name!r} is already registered by other code; pick another "
                "task name (the experiment's *_TASK_NAME knob)."
            )
        seqio.TaskRegistry.remove(name)
    task = make_task(name)
    seqio.TaskRegistry.add_provider(name, task)
    _REGISTERED_SETTINGS[name] = dict(settings)
    return task
