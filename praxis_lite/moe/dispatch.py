"""Running tokens through their experts without dropping any: sorted by expert, grouped matmuls.

Shapes: ``N`` tokens, ``k`` experts a token, ``R = N k`` routes, ``E`` experts, ``D`` model
dims, ``F`` an expert's hidden dims, ``b`` rows a block, ``n`` blocks.

``G`` groups of tokens (split over the data-parallel devices). Expert ``e``'s rows are one
contiguous run, and each projection is one grouped matmul over the runs, done one of two
ways, chosen in one place (:func:`grouped_matmul_kind`):

* ``ragged``: ``jax.lax.ragged_dot`` (the grouped-matmul op XLA lowers to the accelerators'
  kernels; MaxText's dropless MoE calls it on TPU and GPU), run by ``jax.shard_map`` on each
  data-parallel device's own routes, sorted there (XLA cannot split one ragged_dot over the
  devices, and its batched form does not lower for TPUs in jax 0.10); the experts' weights
  enter whole (all-gathered like an FSDP layer's);
* ``blocked``: each group routed on its own (no global sort), each expert's run padded to
  whole blocks of ``b`` rows, every block multiplied
  by its expert's matrix in one batched einsum (``[n, b, D] x [n, D, F]``); the padding
  costs at most ``E (b - 1)`` rows. On a CPU, XLA's ``ragged_dot`` runs every group over all
  rows; this runs about as fast as one dense matmul of the routes (benchmarks/moe_speed.py).

:func:`route` lays the rows out, :func:`gather_rows` fills them, :func:`project` is one
grouped matmul, :func:`route_outputs` reads each route's output back.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from praxis_lite.sharding import BATCH

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


def grouped_matmul_kind(platform: str | None = None) -> str:
    """``'blocked'`` on the platforms of :data:`BLOCKED_PLATFORMS`, else ``'ragged'``;
    ``platform`` None: this process's default backend's (a job compiled for another
    platform says its devices')."""
    return "blocked" if (platform or jax.default_backend()) in BLOCKED_PLATFORMS else "ragged"


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


class Routed(NamedTuple):
    """Where each group's routes sit while its experts run: the rows the projections see.

    Blocked, each group on its own; ragged, each data-parallel device's groups together
    (one run per expert: ``ragged_dot``'s form), sorted on that device (``jax.shard_map``),
    the leading axis then the devices.

    Attributes:
      kind: ``'blocked'`` or ``'ragged'`` (see :func:`grouped_matmul_kind`).
      source: ``[G', rows]`` the token (of its group) each row reads; ``S``: none (a
        padding row, reading zeros).
      output_row: ``[G', S k]`` the row holding route ``(s, j)``'s output (at ``s k + j``).
      expert: blocked: ``[G, n]`` each block's expert; ragged: ``[G', E]`` rows per expert.
      block_rows: blocked: ``b``; ragged: 0.
    """

    kind: str
    source: jax.Array
    output_row: jax.Array
    expert: jax.Array
    block_rows: int


def route(experts: jax.Array, num_experts: int, platform: str | None = None) -> Routed:
    """The rows of each group's routes ``experts [G, S, k]``: blocked or sorted (ragged), as
    :func:`grouped_matmul_kind` chooses for ``platform``."""
    kind = grouped_matmul_kind(platform)
    if kind == "blocked":
        b, k = BLOCK_ROWS, experts.shape[-1]
        position, block_expert = jax.vmap(lambda e: plan_blocks(e, num_experts, b)[:2])(experts)
        rows = block_expert.shape[-1] * b

        def source_of(position: jax.Array) -> jax.Array:
            none = jnp.full((rows,), experts.shape[1], jnp.int32)
            return none.at[position].set(jnp.arange(position.shape[0], dtype=jnp.int32) // k)

        return Routed(kind, jax.vmap(source_of)(position), position, block_expert, b)
    shards, axes = _data_shards()
    per_shard = experts.reshape(shards, -1, experts.shape[-1])

    def sort_shard(e: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        routes = sort_routes(e[0], num_experts)
        return routes.token[None], routes.rank[None], routes.group_sizes[None]

    token, rank, sizes = _on_shards(sort_shard, axes, 1, 3)(per_shard)
    return Routed(kind, token, rank, sizes, 0)


def _data_shards() -> tuple[int, Any]:
    """``(devices, mesh axes)`` the batch is split over in the current mesh and logical axis
    rules; ``(1, None)`` without a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1, None
    axes = nn.logical_to_mesh_axes((BATCH,))[0]
    if axes is None:
        return 1, None
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    return math.prod(mesh.shape[name] for name in names), axes


def _on_shards(fn: Any, axes: Any, sharded_args: int, num_outputs: int) -> Any:
    """``fn`` run on each data-parallel device's own rows (``jax.shard_map``): its first
    ``sharded_args`` arguments and its outputs split on their leading axis over ``axes``,
    the rest whole; ``fn`` itself without a mesh."""
    if axes is None:
        return fn

    def wrapped(*args: Any) -> Any:
        specs = tuple(
            PartitionSpec(axes) if i < sharded_args else PartitionSpec() for i in range(len(args))
        )
        out_specs = tuple(PartitionSpec(axes) for _ in range(num_outputs))
        mapped = jax.shard_map(
            fn, in_specs=specs, out_specs=out_specs[0] if num_outputs == 1 else out_specs
        )
        return mapped(*args)

    return wrapped


def gather_rows(tokens: jax.Array, routed: Routed) -> jax.Array:
    """``tokens [G, S, D]`` -> the rows ``[G', rows, D]`` (zeros at padding rows; ragged:
    ``G'`` = the data-parallel devices, each sorting its own tokens)."""
    tokens = tokens.reshape(routed.source.shape[0], -1, tokens.shape[-1])
    padded = jnp.concatenate([tokens, jnp.zeros_like(tokens[:, :1])], axis=1)
    return jnp.take_along_axis(padded, routed.source[..., None], axis=1)


def project(rows: jax.Array, w: jax.Array, routed: Routed) -> jax.Array:
    """Each row times its expert's matrix: ``rows [G', rows, I] x w [E, I, O]``."""
    if routed.kind == "ragged":
        _, axes = _data_shards()

        def shard_matmul(x: jax.Array, sizes: jax.Array, w: jax.Array) -> jax.Array:
            return jax.lax.ragged_dot(x[0], w, sizes[0])[None]

        return _on_shards(shard_matmul, axes, 2, 1)(rows, routed.expert, w)
    g, b = rows.shape[0], routed.block_rows
    blocks = rows.reshape(g, -1, b, rows.shape[-1])
    w_blocks = jnp.take(w, routed.expert, axis=0)  # [G, n, I, O]
    return jnp.einsum("gnbi,gnio->gnbo", blocks, w_blocks).reshape(g, -1, w.shape[-1])


def route_outputs(rows: jax.Array, routed: Routed, groups: int) -> jax.Array:
    """The rows' outputs ``[G', rows, D]`` in route order: ``[G, S k, D]``."""
    out = jnp.take_along_axis(rows, routed.output_row[..., None], axis=1)
    return out.reshape(groups, -1, out.shape[-1])
