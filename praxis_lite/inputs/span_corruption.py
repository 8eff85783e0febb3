"""T5's span corruption (Raffel et al. 2019's pretraining objective) as SeqIO preprocessors.

The recipe of ``t5.data.preprocessors.span_corruption``, per example of 'targets' tokens::

    select_random_chunk     a document longer than 65536 tokens keeps one random chunk
    reduce_concat_tokens    the tokens of every 128 documents concatenated
    split tokens            pieces of ``random_spans_helper``'s token length (568 for
                            inputs of 512), so that noised inputs fill ``inputs`` exactly
    denoise                 a random-spans noise mask (15% of the tokens, spans of 3 on
                            average); inputs = the piece with each noise span replaced by
                            one sentinel, targets = each non-noise span replaced by one

Sentinels are the last ids of the vocabulary, counting down: span k's sentinel is
``vocab_size - 1 - k``, seqio's ``<extra_id_k>`` (a vocabulary with ``extra_ids`` has
them past its model's pieces: T5's is 32000 pieces + 100 extra ids). Spans alternate
non-noise, noise, ..., ending with noise, e.g.::

    piece    The  cute  dog  walks  in  the  park
    noise    -    -     x    x      -   -    x
    inputs   The cute <extra_id_0> in the <extra_id_1>          (+ EOS)
    targets  <extra_id_0> dog walks <extra_id_1> park           (+ EOS)

Each sentinel of the inputs replaced by the targets' tokens after the same sentinel gives
the piece back.

Randomness is stateless: each random step is a ``seqio.map_over_dataset(num_seeds=1)``,
its seed split as T5 splits it, so a seeded ``get_dataset`` (seqio's ``map_seed_manager``)
gives the same examples on every run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import seqio
import tensorflow as tf

from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.seqio_tasks import reduce_concat_tokens, split_tokens_to_targets_length

NOISE_DENSITY = 0.15
MEAN_NOISE_SPAN_LENGTH = 3.0
MAX_CHUNK_LENGTH = 65536  # T5's select_random_chunk max_length for span corruption.


def sentinel_id(vocabulary: seqio.Vocabulary, index: int = 0) -> int:
    """The id of sentinel ``index`` (``<extra_id_{index}>``): ``vocab_size - 1 - index``."""
    return vocabulary.vocab_size - 1 - index


def random_spans_helper(
    inputs_length: int,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """(tokens before noising, targets length) so that noised inputs are ``inputs_length``.

    T5's helper: the longest piece whose inputs (non-noise tokens, one sentinel per noise
    span, EOS) fit ``inputs_length``, and the length of its targets (noise tokens, one
    sentinel per span, EOS). T5's documented case: 512 -> (568, 114). With density 0.5 a
    token is taken off so that targets are no longer than inputs (T5's rule).
    """

    def lengths(tokens_length: int) -> tuple[int, int]:
        noise_tokens, noise_spans = _noise_counts(
            tokens_length, noise_density, mean_noise_span_length
        )
        inputs = tokens_length - noise_tokens + noise_spans * extra_tokens_per_span_inputs + 1
        targets = noise_tokens + noise_spans * extra_tokens_per_span_targets + 1
        return inputs, targets

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs, targets = lengths(tokens_length)
    if noise_density == 0.5 and targets > inputs:
        tokens_length -= 1
        targets -= 1
    return tokens_length, targets


def _noise_counts(
    tokens_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """(noise tokens, noise spans) of a piece, as ``random_spans_helper`` counts them."""
    noise_tokens = round(tokens_length * noise_density)
    return noise_tokens, round(noise_tokens / mean_noise_span_length)


def random_spans_noise_mask(
    length: tf.Tensor | int,
    noise_density: float,
    seeds: Any,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> tf.Tensor:
    """A noise mask ``[length]`` bool of random spans of noise (T5's, unbatched, no roll).

    Counts are fixed by the length (for ``max(length, 2)``; the mask is cut back)::

        num_noise_tokens = round(length * noise_density), clipped to [1, length - 1]
        num_noise_spans  = max(1, round(num_noise_tokens / mean_noise_span_length))

    and as many non-noise spans. Spans alternate non-noise, noise, ..., starting with
    non-noise and ending with noise; every split of the tokens into such non-empty spans
    is equally likely. ``seeds``: two stateless seeds (each a pair of ints), for the noise
    spans' lengths and the non-noise spans' lengths. Density 0: no noise.
    """
    if noise_density == 0.0:
        return tf.zeros([length], tf.bool)
    orig_length = length
    length = tf.maximum(length, 2)
    num_noise_tokens = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise_tokens = tf.clip_by_value(num_noise_tokens, 1, length - 1)
    num_noise_spans = tf.cast(
        tf.round(tf.cast(num_noise_tokens, tf.float32) / mean_noise_span_length), tf.int32
    )
    num_noise_spans = tf.maximum(num_noise_spans, 1)
    noise_lengths = _random_segmentation(num_noise_tokens, num_noise_spans, seeds[0])
    nonnoise_lengths = _random_segmentation(length - num_noise_tokens, num_noise_spans, seeds[1])
    span_lengths = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [-1])
    span_starts = tf.cumsum(span_lengths)[:-1]
    starts = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts, length)
    is_noise = tf.equal(tf.cumsum(starts) % 2, 1)
    return is_noise[:orig_length]


def _random_segmentation(num_items: tf.Tensor, num_segments: tf.Tensor, seed: Any) -> tf.Tensor:
    """Lengths ``[num_segments]`` (positive, summing to ``num_items``) of a random split of
    ``num_items`` items into ``num_segments`` segments."""
    first_in_segment = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
    first_in_segment = tf.pad(seqio.stateless_shuffle(first_in_segment, seed), [[1, 0]])
    segment_id = tf.cumsum(first_in_segment)
    return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)


def noise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary
) -> tf.Tensor:
    """``tokens [T]`` with each run of noise tokens replaced by one sentinel: the k-th run
    (from 0) by ``sentinel_id(vocabulary, k)``. ``noise_mask``: ``[T]`` bool."""
    prev_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_is_noise))
    later_noise = tf.logical_and(noise_mask, prev_is_noise)
    sentinel = sentinel_id(vocabulary) + 1 - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(later_noise))


def nonnoise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary
) -> tf.Tensor:
    """``tokens [T]`` with each run of non-noise tokens replaced by one sentinel (the
    targets of span corruption)."""
    return noise_span_to_unique_sentinel(tokens, tf.logical_not(noise_mask), vocabulary)


def select_random_chunk(
    dataset: tf.data.Dataset, max_length: int = MAX_CHUNK_LENGTH, feature_key: str = "targets"
) -> tf.data.Dataset:
    """Drops empty examples; an example longer than ``max_length`` tokens keeps one of its
    chunks of ``max_length`` (at offsets ``k * max_length``, k uniform). Only
    ``feature_key`` is kept."""

    @seqio.map_over_dataset(num_seeds=1)
    def chunk(x: Mapping[str, tf.Tensor], seed: Any) -> dict[str, tf.Tensor]:
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed))  # T5 uses the second.
        tokens = x[feature_key]
        num_chunks = (tf.size(tokens) + max_length - 1) // max_length
        index = tf.random.stateless_uniform([], maxval=num_chunks, dtype=tf.int32, seed=seeds[1])
        start = index * max_length
        return {feature_key: tokens[start : start + max_length]}

    return chunk(dataset.filter(lambda x: tf.size(x[feature_key]) > 0))


def denoise(
    dataset: tf.data.Dataset,
    vocabulary: seqio.Vocabulary,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
) -> tf.data.Dataset:
    """Each example's 'targets' tokens -> {'inputs': noise spans as sentinels, 'targets':
    non-noise spans as sentinels}, with a ``random_spans_noise_mask``."""

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(x: Mapping[str, tf.Tensor], seed: Any) -> dict[str, tf.Tensor]:
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))  # T5's split.
        tokens = x["targets"]
        mask = random_spans_noise_mask(
            tf.size(tokens), noise_density, seeds[:2], mean_noise_span_length
        )
        return {
            "inputs": noise_span_to_unique_sentinel(tokens, mask, vocabulary),
            "targets": nonnoise_span_to_unique_sentinel(tokens, mask, vocabulary),
        }

    return corrupt(dataset)


def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None,
    output_features: Mapping[str, seqio.Feature],
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
    max_chunk_length: int = MAX_CHUNK_LENGTH,
    concat_batch_size: int = 128,
) -> tf.data.Dataset:
    """T5's span-corruption preprocessor: 'targets' tokens -> 'inputs' / 'targets' (no EOS
    yet; ``seqio.preprocessors.append_eos_after_trim`` follows). See the module docstring.

    Full pieces give inputs of ``sequence_length['inputs']`` tokens with their EOS, and
    targets of ``random_spans_helper``'s length. Raises InputConfigError if 'targets' is
    shorter, or the features' vocabularies differ or have fewer extra ids than a piece
    has noise spans.
    """
    if not sequence_length or not {"inputs", "targets"} <= set(sequence_length):
        raise InputConfigError(
            "span_corruption needs sequence_length 'inputs' and 'targets'; pass "
            f"task_feature_lengths for both when reading the task (got {sequence_length})."
        )
    tokens_length, targets_length = random_spans_helper(
        sequence_length["inputs"], noise_density, mean_noise_span_length
    )
    if sequence_length["targets"] < targets_length:
        raise InputConfigError(
            f"span_corruption of inputs of {sequence_length['inputs']} tokens makes targets of "
            f"{targets_length} tokens, but the targets length is {sequence_length['targets']}; "
            f"set task_feature_lengths['targets'] to at least {targets_length}."
        )
    vocabulary = output_features["targets"].vocabulary
    if output_features["inputs"].vocabulary != vocabulary:
        raise InputConfigError(
            "span_corruption makes 'inputs' from the 'targets' tokens; give both features "
            "the same vocabulary."
        )
    spans = max(1, _noise_counts(tokens_length, noise_density, mean_noise_span_length)[1])
    if vocabulary.extra_ids < spans:
        raise InputConfigError(
            f"span_corruption of inputs of {sequence_length['inputs']} tokens puts up to {spans} "
            f"sentinels in an example, but the vocabulary has {vocabulary.extra_ids} extra ids; "
            f"give it at least {spans} (T5's has 100)."
        )
    ds = select_random_chunk(dataset, max_chunk_length)
    ds = reduce_concat_tokens(ds, batch_size=concat_batch_size)
    # Pieces of tokens_length tokens (T5's split_tokens), the last of a batch maybe shorter.
    pieces = {"targets": dataclasses.replace(output_features["targets"], add_eos=False)}
    ds = split_tokens_to_targets_length(ds, {"targets": tokens_length}, pieces)
    return denoise(ds, vocabulary, noise_density, mean_noise_span_length)


def span_corruption_preprocessors(
    text_key: str = "text",
    *,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
    concat_batch_size: int = 128,
) -> list[Callable]:
    """T5's ``c4_v220_span_corruption`` preprocessors: ``text_key`` -> 'targets', tokenize,
    (cache point), :func:`span_corruption`, EOS appended to both features."""
    return [
        functools.partial(seqio.preprocessors.rekey, key_map={"targets": text_key}),
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        functools.partial(
            span_corruption,
            noise_density=noise_density,
            mean_noise_span_length=mean_noise_span_length,
            concat_batch_size=concat_batch_size,
        ),
        seqio.preprocessors.append_eos_after_trim,
    ]
