"""``t5.data.preprocessors``: the preprocessors T5's tasks and T5X users' tasks use.

``translate`` makes T5's translation prompts; span corruption and its helpers are
``praxis_lite.inputs.span_corruption``'s (T5's algorithm, tested there); ``rekey`` and
``tokenize`` are SeqIO's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from praxis_lite.inputs.seqio_tasks import reduce_concat_tokens, split_tokens_to_targets_length
from praxis_lite.inputs.span_corruption import (  # noqa: F401 (T5's names, re-exported)
    MAX_CHUNK_LENGTH,
    denoise,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_spans_helper,
    random_spans_noise_mask,
    select_random_chunk,
    span_corruption,
)

rekey = seqio.preprocessors.rekey
tokenize = seqio.preprocessors.tokenize
append_eos = seqio.preprocessors.append_eos
append_eos_after_trim = seqio.preprocessors.append_eos_after_trim

#: The languages T5's WMT tasks translate between, by code.
LANGUAGES = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}


def translate(
    dataset: tf.data.Dataset, source_language: str, target_language: str
) -> tf.data.Dataset:
    """``{source: s, target: t}`` examples -> ``inputs 'translate English to German: s'``,
    ``targets t`` (T5's prompt)."""
    for code in (source_language, target_language):
        if code not in LANGUAGES:
            raise ValueError(
                f"translate: language {code!r} is not one paxlite's T5 subset names "
                f"({', '.join(LANGUAGES)})."
            )
    prefix = f"translate {LANGUAGES[source_language]} to {LANGUAGES[target_language]}: "

    def prompt(x: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {
            "inputs": tf.strings.join([prefix, x[source_language]]),
            "targets": x[target_language],
        }

    return dataset.map(prompt, num_parallel_calls=tf.data.AUTOTUNE)


def iid_denoising(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    noise_density: float = 0.15,
) -> tf.data.Dataset:
    """T5's i.i.d. denoising (Raffel et al.'s baseline objective): random chunks of
    'targets' concatenated and split into pieces of the inputs' length (less its EOS); each
    token is noise with probability ``noise_density``; 'inputs' keeps the rest with a unique
    sentinel per run of noise, 'targets' the noise with a sentinel per run of the rest."""
    vocabulary = output_features["targets"].vocabulary
    length = sequence_length["inputs"] - int(output_features["inputs"].add_eos)
    ds = select_random_chunk(dataset, MAX_CHUNK_LENGTH)
    ds = reduce_concat_tokens(ds, batch_size=128)
    pieces = {"targets": dataclasses.replace(output_features["targets"], add_eos=False)}
    ds = split_tokens_to_targets_length(ds, {"targets": length}, pieces)
    return _iid_corrupt(ds, vocabulary=vocabulary, noise_density=noise_density)


@seqio.map_over_dataset(num_seeds=1)
def _iid_corrupt(
    x: Mapping[str, tf.Tensor], seed: Any, vocabulary: seqio.Vocabulary, noise_density: float
) -> dict[str, tf.Tensor]:
    seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))  # T5's denoise split.
    tokens = x["targets"]
    noise = tf.random.stateless_uniform([tf.size(tokens)], seed=seeds[0]) < noise_density
    return {
        "inputs": noise_span_to_unique_sentinel(tokens, noise, vocabulary),
        "targets": nonnoise_span_to_unique_sentinel(tokens, noise, vocabulary),
    }
