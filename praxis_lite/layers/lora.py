"""LoRA adapters: low-rank updates of a layer's projection weights (PEFT's LoRA).

A layer that supports LoRA has a field ``lora: LoraSettings | None`` and, for each
adapted weight ``X`` of shape ``in_shape + out_shape``, two more variables in its own
scope: ``X_lora_a`` (``in_shape + (r,)``, initialised uniform in ``[-1/sqrt(fan_in),
1/sqrt(fan_in)]`` with ``fan_in = prod(in_shape)``, PEFT's default) and ``X_lora_b``
(``(r,) + out_shape``, zeros), stored in ``adapter_dtype``. The projection becomes::

    y = x · X + scale * ((dropout(x) · A) · B)      (before the projection's bias)

computed in ``adapter_dtype`` and cast to the projection's output dtype, so an adapted
layer equals its base layer at init (B is zero). ``dropout`` acts only when training.

Attention's ``'qkv'`` target shares one A among q, k and v (PEFT's adapter on GPT-2's
fused ``c_attn``): ``w_qkv_lora_a`` with ``w_q_lora_b``, ``w_k_lora_b``, ``w_v_lora_b``.

The names are a contract: the trainer trains the variables that match
:data:`ADAPTER_PATTERN`, and :func:`merged` folds every adapter into its base weight.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from praxis_lite.base_layer import PARAMS, BaseLayer
from praxis_lite.sharding import LogicalAxes

#: Suffixes of an adapted weight ``X``'s two adapter variables.
LORA_A = "_lora_a"
LORA_B = "_lora_b"
#: The flat variable paths (``'.../w_q_lora_a'``) of adapter variables.
ADAPTER_PATTERN = r".*_lora_[ab]$"
#: Adapter A's one layer shares among several weights: ``{shared A's base name: the base
#: names of the weights whose B's follow it}`` (attention's ``'qkv'`` target).
SHARED_A = {"w_qkv": ("w_q", "w_k", "w_v")}

Array = Any  # A numpy or a jax array.


@dataclasses.dataclass(frozen=True)
class LoraSettings:
    """Hyperparameters of the LoRA adapters of one layer (PEFT's ``LoraConfig``).

    Configure with ``praxis_lite.config.Config(LoraSettings, rank=8, alpha=16.0, ...)``
    and set it as a layer's ``lora`` field; the layer's config builds it.

    Attributes:
      rank: ``r``, the adapters' inner dims (PEFT's ``r``).
      alpha: PEFT's ``lora_alpha``; the update is scaled by :attr:`scale`.
      dropout_prob: dropout on the adapters' input when training (PEFT's ``lora_dropout``).
      use_rslora: scale by ``alpha / sqrt(rank)`` instead of ``alpha / rank`` (rsLoRA).
      adapter_dtype: storage and compute dtype of the adapters (float32 by default, also
        under a bfloat16 base; not named ``dtype``, which ``config.set_dtypes`` sets).
      targets: which projections of the layer holding these settings get adapters (the
        layer names its valid ones; ``Linear`` ignores them: set means adapted).
    """

    rank: int
    alpha: float
    dropout_prob: float = 0.0
    use_rslora: bool = False
    adapter_dtype: Any = jnp.float32
    targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoraSettings: rank must be an int >= 1, got {self.rank!r}.")
        if not self.alpha > 0:
            raise ValueError(f"LoraSettings: alpha must be > 0, got {self.alpha!r}.")
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ValueError(
                f"LoraSettings: dropout_prob must be in [0, 1), got {self.dropout_prob!r}."
            )
        if isinstance(self.targets, str):
            raise ValueError(
                f"LoraSettings: targets is a tuple of names, got the string {self.targets!r}; "
                f"write ({self.targets!r},)."
            )
        object.__setattr__(self, "targets", tuple(self.targets))

    @property
    def scale(self) -> float:
        """What the adapters' product is multiplied by: ``alpha / rank`` (rsLoRA:
        ``alpha / sqrt(rank)``), as PEFT's ``scaling``."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def checked_targets(
    owner: str, settings: LoraSettings | None, valid: Sequence[str], hint: str = ""
) -> tuple[str, ...]:
    """``settings.targets`` (``()`` for no settings), each one of ``valid``.

    Raises:
      ValueError: a target ``owner`` does not have, or settings that name none.
    """
    if settings is None:
        return ()
    if not settings.targets:
        raise ValueError(
            f"{owner}: lora is set but names no targets; choose from {', '.join(valid)}."
        )
    unknown = [t for t in settings.targets if t not in valid]
    if unknown:
        raise ValueError(
            f"{owner}: unknown LoRA target(s) {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(valid)}.{' ' + hint if hint else ''}"
        )
    return settings.targets


# --- adapters inside a layer -------------------------------------------------------
def create_lora_a(
    layer: BaseLayer,
    name: str,
    settings: LoraSettings,
    in_shape: Sequence[int],
    in_axes: LogicalAxes,
) -> jax.Array:
    """Declares ``{name}_lora_a`` ``in_shape + (r,)`` (axes ``in_axes + (None,)``) on
    ``layer``; returns it in ``adapter_dtype``."""
    bound = 1.0 / math.sqrt(math.prod(in_shape))

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    shape, axes = (*in_shape, settings.rank), (*in_axes, None)
    return _create(layer, name + LORA_A, shape, axes, init, settings.adapter_dtype)


def create_lora_b(
    layer: BaseLayer,
    name: str,
    settings: LoraSettings,
    out_shape: Sequence[int],
    out_axes: LogicalAxes,
) -> jax.Array:
    """Declares ``{name}_lora_b`` ``(r,) + out_shape`` (axes ``(None,) + out_axes``, zeros)
    on ``layer``; returns it in ``adapter_dtype``."""
    shape, axes = (settings.rank, *out_shape), (None, *out_axes)
    return _create(layer, name + LORA_B, shape, axes, nn.initializers.zeros, settings.adapter_dtype)


def _create(
    layer: BaseLayer, name: str, shape: tuple[int, ...], axes: LogicalAxes, init: Any, dtype: Any
) -> jax.Array:
    """The weight as stored, in ``dtype`` (``create_variable`` returns it cast to the
    layer's ``fprop_dtype``, which may hold less than the adapter's dtype)."""
    layer.create_variable(name, shape, axes, init, dtype=dtype)
    return jnp.asarray(nn.unbox(layer.get_variable(PARAMS, name)), dtype)


def adapter_input(
    x: jax.Array, settings: LoraSettings, dropout: nn.Dropout, train: bool
) -> jax.Array:
    """The adapters' input: ``dropout(x)`` (when training) in ``adapter_dtype``."""
    return dropout(x, deterministic=not train).astype(settings.adapter_dtype)


def lora_down(x: jax.Array, a: jax.Array) -> jax.Array:
    """``[..., in...] x [in..., r] -> [..., r]`` (``x`` from :func:`adapter_input`)."""
    return jnp.tensordot(x, a, axes=a.ndim - 1)


def lora_up(h: jax.Array, b: jax.Array, scale: float, out_dtype: Any) -> jax.Array:
    """``scale * h · B``: ``[..., r] x [r, out...] -> [..., out...]`` in ``out_dtype``."""
    return (scale * jnp.tensordot(h, b, axes=1)).astype(out_dtype)


def lora_delta(x: jax.Array, a: jax.Array, b: jax.Array, scale: float, out_dtype: Any) -> jax.Array:
    """One adapter's addition to its projection: ``scale * (x · A) · B``, ``[..., out...]``."""
    return lora_up(lora_down(x, a), b, scale, out_dtype)


# --- adapters in a parameter tree --------------------------------------------------
def adapter_paths(flat_params: Mapping[str, Array]) -> list[str]:
    """The flat paths of ``flat_params`` that are adapter variables (sorted)."""
    return sorted(p for p in flat_params if re.match(ADAPTER_PATTERN, p))


def merged(flat_params: Mapping[str, Array], scale: float) -> dict[str, Array]:
    """``flat_params`` with every adapter folded into its base weight and dropped.

    ``W + scale * A · B`` (over ``r``) is computed in float32 and cast to ``W``'s dtype;
    numpy arrays stay numpy, jax arrays jax. Paths are joined by ``/``
    (``'lm/.../self_attention/w_q'``); ``X_lora_b``'s A is ``X_lora_a`` beside it, or the
    shared A of :data:`SHARED_A` (``w_qkv_lora_a`` for ``w_q``/``w_k``/``w_v``). Scanned
    stacks (a leading ``[L]`` on W, A and B) are told from plain ones by the ranks.

    Raises:
      ValueError: a B with no A or no base weight, an A no B uses, or shapes that differ.
    """
    out = {p: v for p, v in flat_params.items() if not re.match(ADAPTER_PATTERN, p)}
    used_a = set()
    for b_path in (p for p in adapter_paths(flat_params) if p.endswith(LORA_B)):
        w_path = b_path[: -len(LORA_B)]
        a_path = _a_path_of(w_path, flat_params)
        if w_path not in out:
            raise ValueError(f"lora.merged: {b_path} has no base weight {w_path}.")
        out[w_path] = _fold(out[w_path], flat_params[a_path], flat_params[b_path], scale, w_path)
        used_a.add(a_path)
    unused = [p for p in adapter_paths(flat_params) if p.endswith(LORA_A) and p not in used_a]
    if unused:
        raise ValueError(f"lora.merged: adapter A(s) {unused} have no B.")
    return out


def _a_path_of(w_path: str, flat_params: Mapping[str, Array]) -> str:
    """The A that feeds the weight at ``w_path``: its own, or the shared one."""
    own = w_path + LORA_A
    if own in flat_params:
        return own
    scope, _, base = w_path.rpartition("/")
    for shared, bases in SHARED_A.items():
        path = f"{scope}/{shared}{LORA_A}" if scope else shared + LORA_A
        if base in bases and path in flat_params:
            return path
    raise ValueError(f"lora.merged: {w_path}{LORA_B} has no A ({own} or a shared one).")


def _fold(w: Array, a: Array, b: Array, scale: float, w_path: str) -> Array:
    """``W + scale * A · B`` with ``lead`` leading stack axes on all three (0 or more)."""
    xp = jnp if isinstance(w, jax.Array) else np
    lead = a.ndim + b.ndim - 2 - w.ndim
    in_shape, out_shape = a.shape[lead:-1], b.shape[lead + 1 :]
    fits = (
        lead >= 0
        and a.shape[:lead] == b.shape[:lead] == w.shape[:lead]
        and a.shape[-1] == b.shape[lead]
        and w.shape[lead:] == (*in_shape, *out_shape)
    )
    if not fits:
        raise ValueError(
            f"lora.merged: {w_path} {tuple(w.shape)} does not fit its adapters A "
            f"{tuple(a.shape)} and B {tuple(b.shape)}."
        )
    stack = (math.prod(w.shape[:lead]),)
    a2 = xp.reshape(xp.asarray(a, xp.float32), stack + (math.prod(in_shape), a.shape[-1]))
    b2 = xp.reshape(xp.asarray(b, xp.float32), stack + (b.shape[lead], math.prod(out_shape)))
    delta = xp.reshape(xp.matmul(a2, b2), w.shape)
    return (xp.asarray(w, xp.float32) + scale * delta).astype(w.dtype)


__all__ = [
    "ADAPTER_PATTERN",
    "LORA_A",
    "LORA_B",
    "SHARED_A",
    "LoraSettings",
    "adapter_input",
    "adapter_paths",
    "checked_targets",
    "create_lora_a",
    "create_lora_b",
    "lora_delta",
    "lora_down",
    "lora_up",
    "merged",
]
