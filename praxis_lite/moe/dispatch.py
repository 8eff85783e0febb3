"""Running tokens through their experts without dropping any: sorted by expert, grouped matmuls.

Shapes: ``N`` tokens, ``k`` experts a token, ``R = N k`` routes, ``E`` experts, ``D`` model
dims, ``F`` an expert's hidden dims, ``b`` rows a block, ``n`` blocks.

The routes are sorted by expert, so expert ``e``'s rows are one contiguous run of
``group_sizes[e]`` rows, and each projection is one grouped matmul over the runs, done one of
two ways, chosen in one place (:func:`grouped_matmul_kind`):

* ``ragged``: ``jax.lax.ragged_dot`` (the grouped-matmul op XLA lowers to the accelerators'
  kernels; MaxText's dropless MoE calls it on TPU and GPU);
* ``blocked``: each expert's run padded to whole blocks of ``b`` rows, every block multiplied
  by its expert's matrix in one batched einsum (``[n, b, D] x [n, D, F]``); the padding
  costs at most ``E (b - 1)`` rows. On a CPU, XLA's ``ragged_dot`` runs every group over all
  rows; this runs about as fast as one dense matmul of the routes (benchmarks/moe_speed.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

#: Rows a block of the blocked grouped matmul.
BLOCK_ROWS = 64
#: The platforms that run the blocked grouped matmul (others: ragged_dot).
BLOCKED_PLATFORMS = ("cpu",)


class SortedRoutes(NamedTuple):
    """Routes sorted by expert.

    Attributes:
      token: ``[R]`` the token each sorted row comes from.
      expert: ``[R]`` its expert (non-decreasing).
      group_sizes: ``[E]`` int32 rows per expert.
      rank: ``[R]`` where each route of the ``[N k]`` (token, choice) order sits in the
        sorted rows.
    """

    token: jax.Array
    expert: jax.Array
    group_sizes: jax.Array
    rank: jax.Array


def sort_routes(experts: jax.Array, num_experts: int) -> SortedRoutes:
    """``experts [N, k]`` -> the ``N k`` routes sorted by expert (stable: token order within
    an expert)."""
    k = experts.shape[-1]
    flat = experts.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))
    return SortedRoutes(order // k, flat[order], sizes, rank)


def grouped_matmul_kind() -> str:
    """``'blocked'`` on the platforms of :data:`BLOCKED_PLATFORMS`, else ``'ragged'``."""
    return "blocked" if jax.default_backend() in BLOCKED_PLATFORMS else "ragged"


class Blocks(NamedTuple):
    """Where the routes sit in whole blocks of ``b`` rows, one expert a block: each
    expert's rows padded up to a multiple of ``b``, the experts one after another.

    Attributes:
      position: ``[R]`` each route's row in the padded ``[n b]`` layout, in the ``[N k]``
        (token, choice) order.
      expert: ``[n]`` each block's expert (blocks past the last run: the last expert, zeros).
      block_rows: ``b``.
    """

    position: jax.Array
    expert: jax.Array
    block_rows: int


def plan_blocks(experts: jax.Array, num_experts: int, block_rows: int | None = None) -> Blocks:
    """The blocks of the routes ``experts [N, k]`` (no sort: a route's row is its expert's
    first row plus how many earlier routes chose that expert); ``block_rows`` None:
    :data:`BLOCK_ROWS`."""
    block_rows = block_rows or BLOCK_ROWS
    flat = experts.reshape(-1)
    num_rows = flat.shape[0]
    chosen = jax.nn.one_hot(flat, num_experts, dtype=jnp.int32)  # [R, E]
    earlier = jnp.sum((jnp.cumsum(chosen, axis=0) - chosen) * chosen, axis=-1)
    sizes = jnp.sum(chosen, axis=0)
    padded = -(-sizes // block_rows) * block_rows
    block_start = jnp.cumsum(padded) - padded
    num_blocks = (num_rows + num_experts * (block_rows - 1)) // block_rows + 1
    first_rows = jnp.arange(num_blocks) * block_rows
    # A block's expert: how many experts' padded runs end at or before its first row.
    expert = jnp.sum(first_rows[:, None] >= jnp.cumsum(padded)[None, :], axis=-1)
    return Blocks(block_start[flat] + earlier, jnp.minimum(expert, num_experts - 1), block_rows)


def grouped_ffn(
    tokens: jax.Array,
    experts: jax.Array,
    weights: tuple[jax.Array, jax.Array | None, jax.Array],
    activate: Callable[[jax.Array, jax.Array | None], jax.Array],
) -> jax.Array:
    """Each route's token through its expert's feed-forward: ``activate(x wi, x wi_gate) wo``.

    Args:
      tokens: ``[N, D]``.
      experts: ``[N, k]`` each token's chosen experts.
      weights: ``wi [E, D, F]``, ``wi_gate [E, D, F]`` (None: not gated), ``wo [E, F, D]``.
      activate: ``(h [.., F], h_gate [.., F] or None) -> [.., F]``.

    Returns:
      ``[N k, D]``: route ``(n, j)``'s expert output at row ``n k + j``.
    """
    wi, wi_gate, wo = weights
    if grouped_matmul_kind() == "ragged":
        return _ragged_ffn(tokens, sort_routes(experts, wi.shape[0]), weights, activate)
    blocks = plan_blocks(experts, wi.shape[0])
    b, d, k = blocks.block_rows, tokens.shape[-1], experts.shape[-1]
    none = tokens.shape[0]  # The zero row appended below: what padding rows read.
    source = jnp.full((blocks.expert.shape[0] * b,), none, jnp.int32)
    source = source.at[blocks.position].set(jnp.arange(blocks.position.shape[0]) // k)
    x = jnp.concatenate([tokens, jnp.zeros((1, d), tokens.dtype)])[source].reshape(-1, b, d)

    def project(x: jax.Array, w: jax.Array) -> jax.Array:
        w_blocks = jnp.take(w, blocks.expert, axis=0, indices_are_sorted=True)
        return jnp.einsum("nbi,nio->nbo", x, w_blocks)

    gate = None if wi_gate is None else project(x, wi_gate)
    out = project(activate(project(x, wi), gate), wo)
    return jnp.take(out.reshape(-1, d), blocks.position, axis=0, unique_indices=True)


def _ragged_ffn(
    tokens: jax.Array,
    routes: SortedRoutes,
    weights: tuple[jax.Array, jax.Array | None, jax.Array],
    activate: Callable[[jax.Array, jax.Array | None], jax.Array],
) -> jax.Array:
    """:func:`grouped_ffn` as ``jax.lax.ragged_dot`` over the routes sorted by expert."""
    wi, wi_gate, wo = weights

    def project(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.ragged_dot(x, w, routes.group_sizes)

    rows = tokens[routes.token]
    gate = None if wi_gate is None else project(rows, wi_gate)
    return project(activate(project(rows, wi), gate), wo)[routes.rank]
