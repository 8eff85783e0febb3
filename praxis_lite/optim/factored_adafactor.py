"""Adafactor's second moments factored by logical axis names, as T5X factors them.

optax's Adafactor factors a parameter's second moment over its two largest dims, and only
when both are at least ``min_dim_size_to_factor``. T5X (``t5x/adafactor.py``,
``logical_factor_rules``) instead reads each dim's logical axis name: ROW dims are kept in
``v_row`` and averaged away in ``v_col``, COLUMN dims the other way round, BATCH dims (a
stack of scanned layers) are kept in both and split the RMS of the parameter scale and of
update clipping per slice. So our 3-D attention kernel ``[D, N, H]`` (embed, heads,
head_dim) factors like T5X's 2-D ``[E, H*D]``: ``v_row [D]``, ``v_col [N, H]``.

Each parameter's :class:`FactorLayout` is decided at ``init`` from the boxed parameters
(flax ``nn.Partitioned``) and kept as static pytree metadata of the optimizer state, so
``update`` (which sees plain arrays) recovers it; it survives ``jit``, ``eval_shape`` and
a checkpoint restore whose target comes from an abstract init. ``v_row`` and ``v_col``
are boxed at init with the reduced logical names, so they shard like the parameter.

How a parameter's names decide its layout (T5X's rule, unless marked "ours"):

- Each name maps to a :class:`FactorDim` through the rules; an unnamed dim (``None``) is
  NONE. A name the rules lack is an error.
- A parameter without both a ROW and a COLUMN dim is not factored: its ROW and COLUMN
  dims become NONE, BATCH dims stay.
- Ours: an unnamed dim of a parameter with ROW and COLUMN dims is BATCH (the ``3`` of the
  fused ``w_qkv [3, D, N, H]``, as T5X's fused kernels name it 'stack'); T5X raises there.
- Without BATCH dims, T5X uses optax's size rule for 2-D parameters, and factors a
  higher-rank one with ROW and COLUMN dims whatever its sizes. Ours: the ROW dims and the
  COLUMN dims count as one dim each (T5X's ``[E, H*D]``), so such a parameter is factored
  when ``prod(ROW dims)`` and ``prod(COLUMN dims)`` are both at least
  ``min_dim_size_to_factor`` (for 2-D parameters: T5X's rule). An all-NONE parameter
  uses optax's rule if its rank is <= 2, and is not factored otherwise (T5X's).
- With BATCH dims a parameter is factored whenever it has ROW and COLUMN dims, whatever
  their sizes (as T5X does for its scanned layers).
- A parameter without names (a plain array) uses optax's rule, on any rank.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from praxis_lite.sharding import (
    EMBED,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    MLP,
    STAGES,
    TABLE_EMBED,
    VOCAB,
)


class FactorDim(enum.Enum):
    """What factoring does with one dim of a parameter's second moment."""

    ROW = "row"  # kept in v_row, averaged away in v_col
    COLUMN = "column"  # kept in v_col, averaged away in v_row
    BATCH = "batch"  # a stack of independent tensors: kept in both, RMS taken per slice
    NONE = "none"  # the parameter is not factored over it


FactorRules = tuple[tuple[str, FactorDim], ...]

# T5X's ``standard_logical_factor_rules()`` on our logical axis names: T5X's 'kv' is
# HEAD_DIM, 'joined_kv' is (HEADS, HEAD_DIM), 'multiquery_heads' KV_HEADS; its 'layers'
# and 'stack' are our LAYERS and STAGES; its 'relpos_buckets' (NONE) is unnamed here.
T5X_FACTOR_RULES: FactorRules = (
    (EMBED, FactorDim.ROW),
    (TABLE_EMBED, FactorDim.ROW),
    (MLP, FactorDim.COLUMN),
    (HEADS, FactorDim.COLUMN),
    (KV_HEADS, FactorDim.COLUMN),
    (HEAD_DIM, FactorDim.COLUMN),
    (VOCAB, FactorDim.COLUMN),
    (LAYERS, FactorDim.BATCH),
    (STAGES, FactorDim.BATCH),
)

Names = tuple[str | None, ...]


@flax.struct.dataclass
class FactorLayout:
    """How one parameter's second moment is kept; static (a pytree with no leaves).

    Attributes:
      row_dims: dims ``v_row`` keeps and ``v_col`` averages away; () if not factored.
      col_dims: dims ``v_col`` keeps and ``v_row`` averages away; () if not factored.
      batch_dims: dims the RMS of parameter scale and update clipping is not taken over.
    """

    row_dims: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())
    col_dims: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())
    batch_dims: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())

    @property
    def factored(self) -> bool:
        return bool(self.row_dims) and bool(self.col_dims)

    def rms_dims(self, ndim: int) -> tuple[int, ...]:
        """The dims one RMS block spans: all but the batch dims."""
        return tuple(d for d in range(ndim) if d not in self.batch_dims)


def layout_by_size(shape: Sequence[int], min_dim_size_to_factor: int) -> FactorLayout:
    """optax's (and T5X's fallback) rule: the two largest dims, if the smaller is at least
    ``min_dim_size_to_factor``; the second largest is the row dim."""
    if len(shape) < 2:
        return FactorLayout()
    order = np.argsort(shape, kind="stable")
    if shape[order[-2]] < min_dim_size_to_factor:
        return FactorLayout()
    return FactorLayout(row_dims=(int(order[-2]),), col_dims=(int(order[-1]),))


def _factor_dims(names: Names, rules: FactorRules, where: str) -> tuple[FactorDim, ...]:
    """Each dim's FactorDim after T5X's completion rule (see the module docstring)."""
    table = dict(reversed(rules))  # The first rule for a name wins, as in sharding rules.
    missing = sorted({n for n in names if n is not None and n not in table})
    if missing:
        raise ValueError(
            f"Adafactor factor_rules name no FactorDim for logical axes {missing} of {where} "
            f"(axes {names}); add them to the rules."
        )
    dims = tuple(FactorDim.NONE if n is None else table[n] for n in names)
    if FactorDim.ROW in dims and FactorDim.COLUMN in dims:
        return tuple(FactorDim.BATCH if d is FactorDim.NONE else d for d in dims)
    return tuple(FactorDim.NONE if d in (FactorDim.ROW, FactorDim.COLUMN) else d for d in dims)


def layout_by_names(
    shape: Sequence[int],
    names: Names,
    rules: FactorRules,
    min_dim_size_to_factor: int,
    where: str = "a parameter",
) -> FactorLayout:
    """The layout of a parameter of ``shape`` whose dims are named ``names``."""
    if len(names) != len(shape):
        raise ValueError(f"{where}: {len(names)} logical axes {names} for shape {shape}.")
    dims = _factor_dims(names, rules, where)
    rows, cols, batch = (
        tuple(i for i, d in enumerate(dims) if d is kind)
        for kind in (FactorDim.ROW, FactorDim.COLUMN, FactorDim.BATCH)
    )
    if batch:
        return FactorLayout(rows, cols, batch)  # rows and cols: both or neither
    if not rows:
        return layout_by_size(shape, min_dim_size_to_factor) if len(shape) <= 2 else FactorLayout()
    sizes = (math.prod(shape[d] for d in rows), math.prod(shape[d] for d in cols))
    return FactorLayout(rows, cols) if min(sizes) >= min_dim_size_to_factor else FactorLayout()


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def _names(box: Any) -> Names | None:
    """A box's logical axis names, or None for a plain array."""
    return tuple(box.names) if isinstance(box, nn.Partitioned) else None


def factor_layouts(params: Any, rules: FactorRules | None, min_dim_size_to_factor: int) -> Any:
    """A :class:`FactorLayout` per parameter of ``params`` (boxed or plain leaves).

    ``rules`` None: optax's size rule for every parameter.
    """

    def one(path: Any, leaf: Any) -> FactorLayout:
        names, shape = _names(leaf), nn.meta.unbox(leaf).shape
        if rules is None or names is None:
            return layout_by_size(shape, min_dim_size_to_factor)
        where = jax.tree_util.keystr(path)
        return layout_by_names(shape, names, rules, min_dim_size_to_factor, where)

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_box)


# --- The second moments ----------------------------------------------------------------


@flax.struct.dataclass
class FactoredMoment:
    """A factored second moment: ``v_row`` (the parameter less its col dims, float32) and
    ``v_col`` (less its row dims); ``V ~= v_row * v_col / mean(v_row over row dims)``."""

    v_row: jax.Array
    v_col: jax.Array
    layout: FactorLayout = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class FullMoment:
    """An unfactored second moment ``v``, the parameter's shape, float32."""

    v: jax.Array
    layout: FactorLayout = flax.struct.field(pytree_node=False)


class FactoredRmsState(NamedTuple):
    """``count``: updates so far (int32); ``moments``: a moment per parameter."""

    count: jax.Array
    moments: Any


def _zeros_like(leaf: Any, drop: tuple[int, ...]) -> Any:
    """float32 zeros of ``leaf``'s shape less dims ``drop``; a named leaf's are boxed with
    the names left (so they shard like the parameter), other leaves' are plain."""
    shape = nn.meta.unbox(leaf).shape
    zeros = jnp.zeros([s for d, s in enumerate(shape) if d not in drop], jnp.float32)
    if not isinstance(leaf, nn.Partitioned):
        return zeros
    names = tuple(n for d, n in enumerate(leaf.names) if d not in drop)
    return leaf.replace(value=zeros, names=names)


def _init_moment(leaf: Any, layout: FactorLayout) -> FactoredMoment | FullMoment:
    if layout.factored:
        v_row = _zeros_like(leaf, layout.col_dims)
        return FactoredMoment(v_row, _zeros_like(leaf, layout.row_dims), layout)
    return FullMoment(_zeros_like(leaf, ()), layout)


def _decay(count: jax.Array, decay_rate: float) -> jax.Array:
    """The second moment's decay at the ``count``-th update (0-based): ``1 - (count+1)^-c``."""
    return 1.0 - (count.astype(jnp.float32) + 1.0) ** -decay_rate


def _update_moment(
    grad: jax.Array, moment: FactoredMoment | FullMoment, decay: jax.Array, epsilon: float
) -> tuple[jax.Array, FactoredMoment | FullMoment]:
    """``(grad / sqrt(V), new moment)``, in float32, for one parameter."""
    g = grad.astype(jnp.float32)
    g2, mix = g * g + epsilon, 1.0 - decay
    if isinstance(moment, FullMoment):
        v = decay * moment.v + mix * g2
        return g * jax.lax.rsqrt(v), moment.replace(v=v)
    rows, cols = moment.layout.row_dims, moment.layout.col_dims
    v_row = decay * moment.v_row + mix * g2.mean(axis=cols)
    v_col = decay * moment.v_col + mix * g2.mean(axis=rows)
    rows_in_v_row = tuple(d - sum(c < d for c in cols) for d in rows)
    row_factor = jax.lax.rsqrt(v_row / v_row.mean(axis=rows_in_v_row, keepdims=True))
    y = g * jnp.expand_dims(row_factor, cols) * jnp.expand_dims(jax.lax.rsqrt(v_col), rows)
    return y, moment.replace(v_row=v_row, v_col=v_col)


def scale_by_factored_rms(
    layouts_fn: Callable[[Any], Any], decay_rate: float = 0.8, epsilon: float = 1e-30
) -> optax.GradientTransformation:
    """Divides each gradient by the root of its (factored) second moment, T5X's way.

    ``v <- d v + (1 - d) (g^2 + epsilon)`` with ``d = 1 - (count + 1)^-decay_rate``
    (0 at the first update), factored as each parameter's layout says. Updates come out
    float32.

    Args:
      layouts_fn: params (boxed or plain) -> a :class:`FactorLayout` per parameter,
        e.g. ``functools.partial(factor_layouts, rules=..., min_dim_size_to_factor=...)``.
      decay_rate: the exponent ``c`` of the decay schedule.
      epsilon: added to the squared gradient (T5X's epsilon1).
    """

    def init(params: Any) -> FactoredRmsState:
        layouts = layouts_fn(params)
        moments = jax.tree.map(_init_moment, params, layouts, is_leaf=_is_box)
        return FactoredRmsState(jnp.zeros((), jnp.int32), moments)

    def update(grads: Any, state: FactoredRmsState, params: Any = None) -> tuple[Any, Any]:
        del params
        decay = _decay(state.count, decay_rate)
        leaves, treedef = jax.tree.flatten(grads)
        moments = treedef.flatten_up_to(state.moments)
        out = [_update_moment(g, m, decay, epsilon) for g, m in zip(leaves, moments, strict=True)]
        new_moments = treedef.unflatten([m for _, m in out])
        updates = treedef.unflatten([y for y, _ in out])
        return updates, FactoredRmsState(optax.safe_increment(state.count), new_moments)

    return optax.GradientTransformation(init, update)


# --- Per-block RMS: update clipping and the parameter scale ------------------------------


class BlockLayoutState(NamedTuple):
    """The layout of each parameter (no arrays: all static)."""

    layouts: Any


def _rms(x: jax.Array, layout: FactorLayout) -> jax.Array:
    """float32 RMS of ``x`` over each block (all dims but the batch dims), keepdims."""
    x = x.astype(jnp.float32)
    return jnp.sqrt(jnp.mean(x * x, axis=layout.rms_dims(x.ndim), keepdims=True))


def _per_block(
    layouts_fn: Callable[[Any], Any], fn: Callable[[jax.Array, Any, FactorLayout], jax.Array]
) -> optax.GradientTransformation:
    """A transform applying ``fn(update, param, layout)`` per parameter; its state holds
    only the (static) layouts, so it has no arrays to save."""

    def init(params: Any) -> BlockLayoutState:
        return BlockLayoutState(layouts_fn(params))

    def update(updates: Any, state: BlockLayoutState, params: Any = None) -> tuple[Any, Any]:
        leaves, treedef = jax.tree.flatten(updates)
        layouts = treedef.flatten_up_to(state.layouts)
        ps = [None] * len(leaves) if params is None else treedef.flatten_up_to(params)
        out = [fn(u, p, layout) for u, p, layout in zip(leaves, ps, layouts, strict=True)]
        return treedef.unflatten(out), state

    return optax.GradientTransformation(init, update)


def clip_by_block_rms(
    threshold: float, layouts_fn: Callable[[Any], Any]
) -> optax.GradientTransformation:
    """Divides each block of an update by ``max(1, RMS(block) / threshold)``; a block is a
    parameter, or one slice of its batch dims (one layer of a scanned stack)."""
    return _per_block(layouts_fn, lambda u, p, lo: u / jnp.maximum(1.0, _rms(u, lo) / threshold))


def scale_by_param_block_rms(
    min_scale: float, layouts_fn: Callable[[Any], Any]
) -> optax.GradientTransformation:
    """Multiplies each block of an update by ``max(min_scale, RMS(param block))`` (float32);
    blocks as in :func:`clip_by_block_rms`."""

    def scale(u: jax.Array, param: jax.Array | None, layout: FactorLayout) -> jax.Array:
        if param is None:
            raise ValueError("scale_by_param_block_rms needs the params in update().")
        return u * jnp.maximum(min_scale, _rms(param, layout))

    return _per_block(layouts_fn, scale)
