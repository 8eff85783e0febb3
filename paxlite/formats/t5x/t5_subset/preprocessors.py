"""``t5.data.preprocessors``: the preprocessors T5's tasks and T5X users' tasks use.

``translate`` makes T5's translation prompts; span corruption and its helpers are
``praxis_lite.inputs.span_corruption``'s (T5's algorithm, tested there); ``rekey`` and
``tokenize`` are SeqIO's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from praxis_lite.inputs.span_corruption import (  # noqa: F401 (T5's names, re-exported)
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


@seqio.map_over_dataset(num_seeds=1)
def _iid_noise(x: Mapping[str, Any], seed: Any, noise_density: float, sentinel: int) -> dict:
    tokens = x["targets"]
    noise = tf.random.stateless_uniform(tf.shape(tokens), seed=seed) < noise_density
    return {**x, "inputs": tf.where(noise, tf.cast(sentinel, tokens.dtype), tokens)}


def iid_denoising(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None,
    output_features: Mapping[str, seqio.Feature],
    noise_density: float = 0.15,
) -> tf.data.Dataset:
    """T5's i.i.d. denoising: each 'targets' token is, with probability ``noise_density``,
    the first sentinel in 'inputs'; 'targets' is the whole text."""
    del sequence_length
    vocabulary = output_features["targets"].vocabulary
    sentinel = vocabulary.vocab_size - 1  # T5's first sentinel: the last extra id.
    return _iid_noise(dataset, noise_density=noise_density, sentinel=sentinel)
