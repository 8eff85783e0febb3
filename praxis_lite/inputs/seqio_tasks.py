"""Pieces for registering LM SeqIO Tasks: vocabularies, Pax's LM preprocessors, registration.

Used by the experiments in ``tasks/`` (C4, text files) to build their Tasks the way
Pax's ``c4.py`` does: tokenize, concatenate documents, split into targets-length pieces.

Vocabularies: bytes, a SentencePiece model (seqio's own: id 0 is padding, 1 EOS), or a
Hugging Face model directory's tokenizer (:class:`HfVocabulary`: the model's own ids, in
which id 0 is a real token, e.g. "!" for Llama 3, Qwen and GPT-2). Code that tells padding
by ``id == 0`` asks :func:`zero_is_padding` first; ``SeqIOInput`` shifts HF ids past 0
around seqio's feature converters (see its module docstring).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import seqio
import tensorflow as tf

from praxis_lite.inputs.base_input import InputConfigError, InputDataError
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer, TokenizerError

_AUTOTUNE = tf.data.AUTOTUNE


def make_vocabulary(vocab_path: str | None) -> seqio.Vocabulary:
    """The vocabulary at ``vocab_path``: a directory is a Hugging Face model's tokenizer
    (:class:`HfVocabulary`), a file a SentencePiece model; None: bytes (``ByteVocabulary``)."""
    if vocab_path is None:
        return seqio.ByteVocabulary()
    if os.path.isdir(vocab_path):
        return HfVocabulary(vocab_path)
    return seqio.SentencePieceVocabulary(vocab_path)


class HfVocabulary(seqio.Vocabulary):
    """A SeqIO vocabulary over a Hugging Face model directory's tokenizer (``HfTokenizer``).

    Its ids are the model's own: unlike seqio's vocabularies, id 0 is a real token and
    ``pad_id`` is the tokenizer's (None if it has none); padding is told by lengths and
    weights, never by ``id == 0`` (:func:`zero_is_padding`). ``encode`` adds no special
    tokens (the task appends EOS; the input puts :attr:`start_id` before each sequence);
    ``decode`` stops after the first EOS (seqio's rule) and leaves special tokens out.
    The tokenizer is read on first use, so registering a task reads no file.
    """

    def __init__(self, directory: str):
        super().__init__(extra_ids=0)
        self.directory = directory
        self._tokenizer: HfTokenizer | None = None

    @property
    def tokenizer(self) -> HfTokenizer:
        """The directory's tokenizer; InputDataError if it has none or a malformed one."""
        if self._tokenizer is None:
            try:
                self._tokenizer = HfTokenizer.from_dir(self.directory)
            except TokenizerError as e:
                raise InputDataError(str(e)) from None
        return self._tokenizer

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def eos_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int | None:  # type: ignore[override]
        return self.tokenizer.pad_token_id

    @property
    def unk_id(self) -> None:
        return None  # (seqio would map ids past the vocabulary to it.)

    @property
    def start_id(self) -> int:
        """The id put before each sequence (where seqio's converters put 0): BOS, else EOS.

        A tokenizer without BOS (Qwen2/3) starts each sequence with its EOS, the token
        that separates documents in its pretraining (``<|endoftext|>`` for the base
        models), as Hugging Face's fine-tuning recipes for them do; it is never a label.
        """
        start = self.bos_id if self.bos_id is not None else self.eos_id
        if start is None:
            raise InputConfigError(
                f"The tokenizer in {self.directory} names neither a BOS nor an EOS token, "
                "so sequences have no start token; set bos_token in its tokenizer_config.json."
            )
        return start

    @property
    def _base_vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def _encode(self, s: str) -> list[int]:
        return self.tokenizer.encode(s, add_special_tokens=False)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        def encode(text: bytes) -> np.ndarray:
            return np.asarray(self._encode(text.decode("utf-8")), np.int32)

        ids = tf.numpy_function(encode, [s], tf.int32, stateful=False)
        return tf.ensure_shape(ids, [None])

    def _decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        def decode(rows: np.ndarray) -> np.ndarray:
            flat = rows.reshape(-1, rows.shape[-1])
            texts = [self.decode([int(i) for i in row]).encode("utf-8") for row in flat]
            return np.asarray(texts, object).reshape(rows.shape[:-1])

        return tf.numpy_function(decode, [ids], tf.string, stateful=False)

    def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        """Rows of ``ids [..., T]`` -> their texts ``[...]``, each up to its first EOS."""
        return self._decode_tf(ids)  # (seqio's would pad after EOS with pad_id, maybe None.)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HfVocabulary) and other.directory == self.directory

    def __hash__(self) -> int:
        return hash((HfVocabulary, self.directory))


def zero_is_padding(vocabulary: seqio.Vocabulary) -> bool:
    """Whether id 0 is padding (seqio's vocabularies) rather than a token (HfVocabulary)."""
    return not isinstance(vocabulary, HfVocabulary)


def reduce_concat_tokens(
    dataset: tf.data.Dataset,
    feature_key: str = "targets",
    batch_size: int = 128,
    output_features: Mapping[str, seqio.Feature] | None = None,
    **unused: Any,
) -> tf.data.Dataset:
    """Concatenates the tokens of every ``batch_size`` consecutive examples into one.

    T5's preprocessor of that name: keeps only ``feature_key``; padding (0) is dropped.
    With an HfVocabulary (``output_features``; seqio passes them), whose id 0 is a token,
    the examples are joined as they are (ragged batches) instead.
    """
    del unused
    ds = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=_AUTOTUNE)
    if output_features and not zero_is_padding(output_features[feature_key].vocabulary):
        ds = ds.ragged_batch(batch_size)
        return ds.map(
            lambda x: {feature_key: x[feature_key].flat_values}, num_parallel_calls=_AUTOTUNE
        )
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
        functools.partial(reduce_concat_tokens, batch_size=concat_batch_size),
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
