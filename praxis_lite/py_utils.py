"""NestedMap: an attribute-access dict that is a JAX pytree, as in Praxis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp


class NestedMap(dict):
    """A dict whose string keys are also attributes, usable as a JAX pytree.

    >>> m = NestedMap(loss=1.0, aux=NestedMap(z=2.0))
    >>> m.aux.z
    2.0

    Keys must be valid Python identifiers and may not shadow dict methods.
    Flattening sorts keys, so two maps with the same keys have the same treedef.
    """

    _RESERVED = frozenset(dir(dict))

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        for key in self:
            self._check_key(key)

    @classmethod
    def _check_key(cls, key: Any) -> None:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"NestedMap keys must be identifiers, got {key!r}.")
        if key in cls._RESERVED:
            raise ValueError(f"NestedMap key {key!r} shadows a dict method; pick another.")

    def __setitem__(self, key: str, value: Any) -> None:
        self._check_key(key)
        super().__setitem__(key, value)

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"NestedMap has no key {name!r}; keys: {sorted(self)}.") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def copy(self) -> NestedMap:
        """A shallow copy that stays a NestedMap."""
        return NestedMap(self)

    def flatten_items(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """Yields ``('a.b.c', leaf)`` pairs, keys sorted, recursing into NestedMaps."""
        for key in sorted(self):
            value = self[key]
            path = f"{prefix}{key}"
            if isinstance(value, NestedMap):
                yield from value.flatten_items(path + ".")
            else:
                yield path, value

    def transform(self, fn: Callable[[Any], Any]) -> NestedMap:
        """A new NestedMap with ``fn`` applied to every leaf (a pytree map)."""
        return jax.tree_util.tree_map(fn, self)


def _flatten_with_keys(m: NestedMap):
    keys = sorted(m)
    return [(jax.tree_util.DictKey(k), m[k]) for k in keys], tuple(keys)


def _unflatten(keys: tuple[str, ...], values: Any) -> NestedMap:
    return NestedMap(zip(keys, values, strict=True))


jax.tree_util.register_pytree_with_keys(
    NestedMap,
    _flatten_with_keys,
    _unflatten,
    flatten_func=lambda m: ([m[k] for k in sorted(m)], tuple(sorted(m))),
)


def to_microbatches(a: jax.Array, m: int) -> jax.Array:
    """``[B, ...] -> [M, B / M, ...]``, microbatch i = rows i, i + M, i + 2M, ...

    Rows of one microbatch are spread over the whole batch, so a batch split over
    data-parallel devices splits every microbatch the same way (no data moves).
    """
    return jnp.swapaxes(a.reshape((a.shape[0] // m, m) + a.shape[1:]), 0, 1)


def from_microbatches(a: jax.Array) -> jax.Array:
    """Inverse of :func:`to_microbatches`."""
    b = jnp.swapaxes(a, 0, 1)
    return b.reshape((b.shape[0] * b.shape[1],) + b.shape[2:])
