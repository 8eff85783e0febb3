"""A decoding cache's rows: which axis of each leaf is the batch, copying rows for beams or
several samples, and reordering them by beam.

A cache is any pytree a model's prefill returns (flax's ``'cache'`` collection: keys,
values and paddings ``[B, S, ...]``, under scanned stacks ``[L, B, S, ...]``, plus indexes
and tables without a batch axis). Which axis of a leaf is the batch is found once, at trace
time, by tracing the prefill with one more row (:func:`batch_axes`), so no layer has to
declare it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Axes = Any  # A pytree like the cache's: each leaf's batch axis, or NO_BATCH.
NO_BATCH = -1  # A leaf without a batch axis (an index, a table).


def _one_more_row(tree: Any) -> Any:
    """Each array ``[B, ...]`` of ``tree`` with its first row appended: ``[B + 1, ...]``."""
    return jax.tree.map(lambda x: jnp.concatenate([x, x[:1]], axis=0), tree)


def batch_axes(prefill: Callable[..., tuple[Any, Any]], cache: Any, *rows: Any) -> Axes:
    """The batch axis of each leaf of ``cache`` (what ``prefill(*rows)`` returned), or
    ``NO_BATCH``.

    ``rows`` are ``prefill``'s arguments; the arrays among them have the batch first (other
    arguments, e.g. an int, pass through). The axis is the one whose size changes when
    ``prefill`` is traced with one more row (``jax.eval_shape``: nothing runs).
    """
    grown = tuple(_one_more_row(r) if _is_batched(r) else r for r in rows)
    _, bigger = jax.eval_shape(prefill, *grown)

    def axis_of(small: jax.Array, big: jax.ShapeDtypeStruct) -> int:
        changed = [a for a, (s, b) in enumerate(zip(small.shape, big.shape, strict=True)) if s != b]
        return changed[0] if changed else NO_BATCH

    return jax.tree.map(axis_of, cache, bigger)


def _is_batched(arg: Any) -> bool:
    """Whether ``arg`` is a pytree of arrays (rows first), not a static value."""
    leaves = jax.tree.leaves(arg)
    return bool(leaves) and all(hasattr(x, "shape") and x.ndim >= 1 for x in leaves)


def repeat_rows(cache: Any, axes: Axes, copies: int) -> Any:
    """Each row ``b`` of ``cache`` as ``copies`` consecutive rows (``b * copies + k``)."""
    if copies == 1:
        return cache
    return jax.tree.map(
        lambda x, a: x if a == NO_BATCH else jnp.repeat(x, copies, axis=a), cache, axes
    )


def gather_beams(cache: Any, axes: Axes, parents: jax.Array, unchanged: Any = None) -> Any:
    """Rows ``b * K + k`` of ``cache`` replaced by rows ``b * K + parents[b, k]``.

    Args:
      cache: the cache of ``B * K`` rows.
      axes: :func:`batch_axes` of it.
      parents: ``[B, K]`` int32, each new beam's beam of the previous step.
      unchanged: a pytree like ``cache`` of bools: leaves known to be equal across a
        row's beams (e.g. cross-attention keys), left as they are.
    """
    b, k = parents.shape
    unchanged = jax.tree.map(lambda _: False, cache) if unchanged is None else unchanged

    def gather(x: jax.Array, a: int, same: bool) -> jax.Array:
        if a == NO_BATCH or same:
            return x
        split = x.reshape(x.shape[:a] + (b, k) + x.shape[a + 1 :])
        index = parents.reshape((1,) * a + (b, k) + (1,) * (x.ndim - a - 1))
        return jnp.take_along_axis(split, index, axis=a + 1).reshape(x.shape)

    return jax.tree.map(gather, cache, axes, unchanged)


def untouched_by(step: Callable[[Any], tuple[Any, Any]], cache: Any) -> Any:
    """A pytree like ``cache`` of bools: the leaves ``step(cache) -> (out, cache)`` returns
    as they came (e.g. an encoder-decoder's cross-attention keys and values, written once
    by the prefill). Found by tracing ``step`` once (``jax.eval_shape``: nothing runs)."""
    found = []

    def probe(cache):
        _, new = step(cache)
        pairs = zip(jax.tree.leaves(new), jax.tree.leaves(cache), strict=True)
        found.append([a is b for a, b in pairs])
        return new

    jax.eval_shape(probe, cache)
    return jax.tree.unflatten(jax.tree.structure(cache), found[0])
