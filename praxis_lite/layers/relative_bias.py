"""T5's relative position bias: a learned scalar per head and distance bucket, added to the
attention logits (Raffel et al. 2020, section 2.1; mesh TensorFlow's
``_relative_position_bucket``, as T5X and Hugging Face's T5 compute it).

The distance ``key - query`` falls in one of ``num_buckets`` buckets: exact for short
distances (below half the buckets), then logarithmically spaced up to ``max_distance``,
beyond which all distances share the last bucket. Bidirectional (an encoder's) bias halves
the buckets between keys before and after the query; causal (a decoder's) counts only keys
before it. One table per stack, shared by its layers; cross-attention has none.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import CACHE, BaseLayer
from praxis_lite.sharding import HEADS


def relative_position_bucket(
    relative_position: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
    """The bucket (int32, in ``[0, num_buckets)``) of each ``key - query`` distance."""
    bucket = jnp.zeros(relative_position.shape, jnp.int32)
    if bidirectional:
        num_buckets //= 2
        bucket += jnp.where(relative_position > 0, num_buckets, 0)
        distance = jnp.abs(relative_position)
    else:
        distance = jnp.maximum(-relative_position, 0)  # Keys after the query: distance 0.
    max_exact = num_buckets // 2
    # log(distance / max_exact) / log(max_distance / max_exact) of the other half of the
    # buckets; the distance floored at 1 only keeps log() finite where it is not used.
    scaled = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (scaled * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(BaseLayer):
    """Per-head bias of T5's bucketed relative positions: ``[N, T, S]`` for queries at
    ``query_positions [T]`` and keys at ``key_positions [S]``.

    A stack owns one (``relative_bias_tpl``), computes the bias once per call and hands it
    to every block. Positions are slots of the row: with packed sequences each segment is
    contiguous, so the distances inside it are its own (T5X's packing does the same).

    Attributes:
      num_heads: ``N``.
      num_buckets: distance buckets (T5's 32).
      max_distance: distances from here on share the last bucket (T5's 128).
      bidirectional: keys after the query have buckets of their own (an encoder's);
        False: they share distance 0's (a decoder's).
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def setup(self) -> None:
        self.rel_embedding = self.create_variable(
            "rel_embedding",  # T5X's name and layout: [N, buckets].
            (self.num_heads, self.num_buckets),
            (HEADS, None),
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
        )

    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """``query_positions [T]``, ``key_positions [S]`` (int) -> bias ``[N, T, S]``
        (``fprop_dtype``)."""
        relative = key_positions[None, :] - query_positions[:, None]
        buckets = relative_position_bucket(
            relative,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        return self.to_fprop(jnp.take(self.rel_embedding, buckets, axis=1))  # [N, T, S]

    @nn.compact
    def extend(self, num_new: int, max_len: int | None = None) -> jax.Array:
        """The bias of ``num_new`` tokens appended to a KV cache: ``[N, T, S]`` by cache slot.

        The first call (prefill) passes ``max_len``, the cache's slots ``S``; the slots written
        so far are counted in the ``'cache'`` collection (``index``), so query ``t`` of a call
        sits in slot ``index + t``. (A row's slots and positions differ by its left padding
        only, which leaves every distance as it is.)
        """
        if not self.has_variable(CACHE, "index") and max_len is None:
            raise ValueError("RelativePositionBias.extend: the first call must pass max_len.")
        index = self.variable(CACHE, "index", lambda: jnp.zeros((), jnp.int32))
        slots = self.variable(CACHE, "slots", lambda: jnp.arange(max_len, dtype=jnp.int32))
        start = index.value
        index.value = start + num_new
        return self(start + jnp.arange(num_new, dtype=jnp.int32), slots.value)


def stack_bias(bias_layer: RelativePositionBias | None, length: int) -> jax.Array | None:
    """A stack's bias over ``length`` slots (queries and keys alike), or None without one."""
    if bias_layer is None:
        return None
    slots = jnp.arange(length, dtype=jnp.int32)
    return bias_layer(slots, slots)
