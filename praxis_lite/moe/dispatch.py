"""Running tokens through their experts: dropless (sorted by expert, a grouped matmul).

Shapes: ``N`` tokens, ``k`` experts a token, ``R = N k`` routes, ``E`` experts, ``D`` model
dims, ``F`` an expert's hidden dims.

The routes are sorted by expert, so expert ``e``'s rows are one contiguous block of
``group_sizes[e]`` rows, and each projection is one grouped matmul over the blocks:
``jax.lax.ragged_dot`` (what MaxText's dropless MoE calls on TPU and GPU), or, where the
rows are few (:data:`DENSE_FALLBACK_MAX_ROWS`, the one place this is chosen), an einsum
with each row's expert weights gathered, which XLA on CPU runs faster at toy sizes.
Capacity-based dispatch (GShard's einsums over ``[G, S, E, C]``) lives in the layer.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

#: Routes at or below which the grouped matmul is a gathered einsum instead of ragged_dot.
DENSE_FALLBACK_MAX_ROWS = 0


class SortedRoutes(NamedTuple):
    """Routes sorted by expert.

    Attributes:
      token: ``[R]`` the token each sorted row comes from.
      expert: ``[R]`` its expert (non-decreasing).
      weight: ``[R]`` float32 its routing weight.
      group_sizes: ``[E]`` int32 rows per expert.
    """

    token: jax.Array
    expert: jax.Array
    weight: jax.Array
    group_sizes: jax.Array


def sort_routes(experts: jax.Array, weights: jax.Array, num_experts: int) -> SortedRoutes:
    """``experts, weights [N, k]`` -> the ``N k`` routes sorted by expert (stable: token
    order within an expert)."""
    k = experts.shape[-1]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return SortedRoutes(order // k, flat[order], weights.reshape(-1)[order], sizes)


def grouped_matmul(rows: jax.Array, w: jax.Array, routes: SortedRoutes) -> jax.Array:
    """``rows [R, I] x w [E, I, O]``: each row times its expert's matrix -> ``[R, O]``."""
    if rows.shape[0] <= DENSE_FALLBACK_MAX_ROWS:
        return jnp.einsum("ri,rio->ro", rows, w[routes.expert])
    return jax.lax.ragged_dot(rows, w, routes.group_sizes)


def scatter_back(rows: jax.Array, routes: SortedRoutes, num_tokens: int) -> jax.Array:
    """``rows [R, D]`` weighted by their routes' weights and summed per token: ``[N, D]``."""
    weighted = rows * routes.weight[:, None].astype(rows.dtype)
    out = jnp.zeros((num_tokens, rows.shape[-1]), rows.dtype)
    return out.at[routes.token].add(weighted)
