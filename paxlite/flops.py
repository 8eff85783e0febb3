"""Model FLOPs of a decoder-only LM train step, counted from its config.

Three labelled definitions (:class:`FlopsDefinition`), per step of ``B x T`` tokens:

* ``6N``: ``6 * N_blocks * B*T`` (Kaplan et al. 2020, "Scaling laws", section 2.1).
  ``N_blocks`` = weights of the matmuls inside the Transformer blocks (q, k, v,
  output projection, feed-forward; biases and norms left out): the
  non-embedding parameters.
* ``palm``: ``(6 * N + 12 * L*H*Q*T) * B*T`` (Chowdhery et al. 2022, PaLM, Appendix
  B), with ``N = N_blocks + D*V``: every weight a token multiplies, so the
  output (logits) projection is in and an input embedding lookup is not (with a
  shared embedding table, as here, ``N`` is the whole table once). ``L`` layers,
  ``H`` heads, ``Q`` dims per head, ``T`` sequence length: the full ``T x T``
  attention map in the forward and backward passes.
* ``causal``: as ``palm`` with the attention term halved (``6 * L*H*Q*T``): a
  causal model needs only the lower triangle of the attention map. This is the
  default for MFU (MaxText counts the same way); ``palm`` is higher by the
  masked half that dense kernels compute anyway.

Training = forward + backward = 3 x forward; rematerialization (recomputing the
forward in the backward pass) is not model work and is never counted (it is in
XLA's count, see :func:`xla_flops`).

The config walk finds the LM (a config with ``model_dims`` and ``vocab_size``),
then the Transformer block template (a config with ``num_heads`` and
``hidden_dims``) anywhere under it, multiplying the layer counts
(:data:`LAYER_COUNT_FIELDS`) of every stack on the way: a plain, a repeated
(scanned) or a pipelined stack wrapping another stack all give ``L``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import fiddle as fdl

from praxis_lite.config import Template

#: Fields that multiply the number of blocks below them (a stack of stacks of ...).
LAYER_COUNT_FIELDS = ("num_layers", "num_stages", "circular_repeat", "num_repeats")


class FlopsDefinition(enum.Enum):
    """Which model-FLOPs formula an MFU figure uses (see the module docstring)."""

    SIX_N = "6N"
    PALM = "palm"
    CAUSAL = "causal"

    @property
    def formula(self) -> str:
        return {
            FlopsDefinition.SIX_N: "6 * N_blocks * tokens",
            FlopsDefinition.PALM: "(6 * (N_blocks + D*V) + 12 * L*H*Q*T) * tokens",
            FlopsDefinition.CAUSAL: "(6 * (N_blocks + D*V) + 6 * L*H*Q*T) * tokens",
        }[self]


DEFAULT_DEFINITION = FlopsDefinition.CAUSAL


class ModelShapeError(ValueError):
    """The model config is not a decoder-only Transformer LM this module can count."""


@dataclasses.dataclass(frozen=True)
class LmShape:
    """What the FLOPs depend on.

    Attributes:
      num_layers: ``L`` Transformer blocks in all.
      model_dims: ``D``.
      hidden_dims: ``F``, feed-forward hidden dims.
      num_heads: ``H`` query heads (``N`` in the attention layer's docstring).
      num_kv_heads: key/value heads.
      dim_per_head: ``Q``.
      gated: the feed-forward has a gate projection (GLU variants: 3 matrices).
      vocab_size: ``V``.
      causal: the attention is causal.
    """

    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    num_kv_heads: int
    dim_per_head: int
    gated: bool
    vocab_size: int
    causal: bool = True

    @property
    def block_params(self) -> int:
        """Matmul weights of one block: q, k, v, post projections and the feed-forward."""
        d, q = self.model_dims, self.dim_per_head
        attention = d * q * (2 * self.num_heads + 2 * self.num_kv_heads)
        feed_forward = (3 if self.gated else 2) * d * self.hidden_dims
        return attention + feed_forward

    @property
    def non_embedding_params(self) -> int:
        """``N_blocks = L * block_params``."""
        return self.num_layers * self.block_params

    @property
    def matmul_params(self) -> int:
        """``N_blocks + D*V``: every weight a token is multiplied by (logits included)."""
        return self.non_embedding_params + self.model_dims * self.vocab_size

    def flops_per_token(self, seq_len: int, definition: FlopsDefinition) -> float:
        """Train-step FLOPs per token (forward + backward) under ``definition``."""
        attention = self.num_layers * self.num_heads * self.dim_per_head * seq_len
        if definition is FlopsDefinition.SIX_N:
            return 6.0 * self.non_embedding_params
        if definition is FlopsDefinition.PALM:
            return 6.0 * self.matmul_params + 12.0 * attention
        return 6.0 * self.matmul_params + 6.0 * attention

    def flops_per_step(
        self, global_batch: int, seq_len: int, definition: FlopsDefinition = DEFAULT_DEFINITION
    ) -> float:
        """Train-step FLOPs of ``global_batch x seq_len`` tokens (all devices together)."""
        return self.flops_per_token(seq_len, definition) * global_batch * seq_len

    def all_definitions(self, global_batch: int, seq_len: int) -> dict[str, float]:
        """``{definition value: FLOPs per step}`` for every definition."""
        return {d.value: self.flops_per_step(global_batch, seq_len, d) for d in FlopsDefinition}


def unwrap_template(value: Any) -> Any:
    """A layer template (``praxis_lite.config.Template``, in built tasks) -> its config."""
    return value.value if isinstance(value, Template) else value


def _value(cfg: Any, name: str, default: Any = None) -> Any:
    try:
        return unwrap_template(getattr(cfg, name))
    except AttributeError:
        return default


def _is_node(obj: Any) -> bool:
    """A layer config, or a built layer (a dataclass such as a flax Module)."""
    return isinstance(obj, fdl.Buildable) or (
        dataclasses.is_dataclass(obj) and not isinstance(obj, type)
    )


def _field_names(obj: Any) -> set[str]:
    if isinstance(obj, fdl.Buildable):
        return set(obj.__signature_info__.parameters)
    return {f.name for f in dataclasses.fields(obj)}


def _fields(cfg: Any) -> dict[str, Any]:
    """The set fields of a config (or all fields of a built layer), templates unwrapped."""
    if isinstance(cfg, fdl.Buildable):
        items = cfg.__arguments__.items()
    elif _is_node(cfg):
        items = ((f.name, getattr(cfg, f.name, None)) for f in dataclasses.fields(cfg))
    else:
        return {}
    return {k: unwrap_template(v) for k, v in items if k not in ("parent", "name")}


def _find(cfg: Any, has: tuple[str, ...], multiplier: int = 1) -> tuple[Any, int] | None:
    """Depth-first: the first config with all of ``has`` and the product of layer counts above it.

    The layer-count fields of the found config itself are not multiplied in.
    """
    cfg = unwrap_template(cfg)
    if not _is_node(cfg):
        return None
    names = _field_names(cfg)
    if all(n in names for n in has):
        return cfg, multiplier
    own = 1
    for name in LAYER_COUNT_FIELDS:
        count = _fields(cfg).get(name)
        if isinstance(count, int) and count > 0:
            own *= count
    for value in _fields(cfg).values():
        children = value if isinstance(value, list | tuple) else [value]
        for child in children:
            found = _find(child, has, multiplier * own)
            if found is not None:
                return found
    return None


def lm_shape(model_cfg: Any) -> LmShape:
    """Reads :class:`LmShape` from a model config (e.g. ``task.model``).

    Raises:
      ModelShapeError: no LM (``model_dims``/``vocab_size``) or no Transformer
        block (``num_heads``/``hidden_dims``) in the config.
    """
    model_cfg = unwrap_template(model_cfg)
    found = _find(model_cfg, ("model_dims", "vocab_size"))
    if found is None:
        raise ModelShapeError(
            "No language model (a config with model_dims and vocab_size) in the model config; "
            "FLOPs are counted for decoder-only Transformer LMs only. Pass --peak_tflops and read "
            "XLA's count instead."
        )
    lm, _ = found
    found = _find(lm, ("num_heads", "hidden_dims", "input_dims"))
    if found is None:
        raise ModelShapeError(
            "No Transformer block (a config with num_heads and hidden_dims) under the LM."
        )
    block, num_layers = found
    d = _value(block, "input_dims")
    heads = _value(block, "num_heads")
    kv_heads = _value(block, "num_kv_heads") or heads
    dim_per_head = _value(block, "dim_per_head") or d // heads
    atten = _value(block, "tr_atten_tpl")
    ff = _value(block, "tr_fflayer_tpl")
    return LmShape(
        num_layers=num_layers,
        model_dims=int(_value(lm, "model_dims")),
        hidden_dims=int(_value(block, "hidden_dims")),
        num_heads=int(heads),
        num_kv_heads=int(kv_heads),
        dim_per_head=int(dim_per_head),
        gated=bool(_value(ff, "use_gated_activation", False)),
        vocab_size=int(_value(lm, "vocab_size")),
        causal=bool(_value(atten, "is_causal", True)),
    )


def scan_trip_count(model_cfg: Any) -> int:
    """Layers run inside a scan (``nn.scan``/while loop) whose body XLA counts once.

    A repeated stack (a config class whose name contains ``Repeated``) runs its
    ``num_layers`` as one loop; 1 if there is none.
    """
    trips = 1

    def visit(cfg: Any) -> None:
        nonlocal trips
        cfg = unwrap_template(cfg)
        if not _is_node(cfg):
            return
        cls = cfg.__fn_or_cls__ if isinstance(cfg, fdl.Buildable) else type(cfg)
        if "Repeated" in getattr(cls, "__name__", ""):
            trips *= int(_value(cfg, "num_layers", 1))
        for value in _fields(cfg).values():
            for child in value if isinstance(value, list | tuple) else [value]:
                visit(child)

    visit(model_cfg)
    return trips


def xla_flops(compiled: Any) -> float:
    """XLA's own FLOP count of a compiled executable (``cost_analysis()['flops']``).

    It counts what the program executes: rematerialized forwards, the full
    (masked) attention map, elementwise work and the optimizer update; but the
    body of a ``scan`` (while loop) only once. See :func:`xla_flops_scan_corrected`.
    """
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float((cost or {}).get("flops", 0.0))


def xla_flops_scan_corrected(
    xla_raw: float, shape: LmShape, trips: int, global_batch: int, seq_len: int, remat: bool
) -> float:
    """An estimate of what XLA would count if it multiplied the scanned body by its trips.

    Adds ``trips - 1`` blocks of the analytic ``palm`` per-block FLOPs (times 4/3
    when the backward recomputes the forward). Exact when ``trips == 1``.
    """
    if trips <= 1:
        return xla_raw
    tokens = global_batch * seq_len
    per_block = (
        6.0 * shape.block_params + 12.0 * shape.num_heads * shape.dim_per_head * seq_len
    ) * tokens
    if remat:
        per_block *= 4.0 / 3.0
    return xla_raw + (trips - 1) * per_block


def describe(shape: LmShape) -> str:
    """``L=2 D=64 F=256 heads=4x16 (kv 4) V=64 gelu`` style one-liner."""
    kv = f" kv {shape.num_kv_heads}" if shape.num_kv_heads != shape.num_heads else ""
    return (
        f"L={shape.num_layers} D={shape.model_dims} F={shape.hidden_dims}"
        f"{' gated' if shape.gated else ''} heads={shape.num_heads}x{shape.dim_per_head}{kv} "
        f"V={shape.vocab_size}"
    )


def format_flops(flops: float) -> str:
    """``1.234 TFLOP`` style (SI prefixes)."""
    if flops <= 0 or not math.isfinite(flops):
        return f"{flops:g} FLOP"
    exponent = min(int(math.log10(flops) // 3), 5)
    prefix = ["", "k", "M", "G", "T", "P"][exponent]
    return f"{flops / 1000**exponent:.4g} {prefix}FLOP"


def _any_node(model_cfg: Any, predicate: Any) -> bool:
    def visit(cfg: Any) -> bool:
        cfg = unwrap_template(cfg)
        if not _is_node(cfg):
            return False
        if predicate(cfg):
            return True
        return any(
            visit(child)
            for value in _fields(cfg).values()
            for child in (value if isinstance(value, list | tuple) else [value])
        )

    return visit(model_cfg)


def _class_name(cfg: Any) -> str:
    cls = cfg.__fn_or_cls__ if isinstance(cfg, fdl.Buildable) else type(cfg)
    return getattr(cls, "__name__", "")


def has_pipeline(model_cfg: Any) -> bool:
    """A pipelined stack (a class named ``*Pipelined*``) is in the model."""
    return _any_node(model_cfg, lambda c: "Pipelined" in _class_name(c))


def uses_remat(model_cfg: Any) -> bool:
    """A repeated stack recomputes its forward in the backward pass (remat policy not NONE)."""

    def remat(cfg: Any) -> bool:
        policy = _fields(cfg).get("remat_policy")
        if policy is None and "Repeated" in _class_name(cfg):
            policy = getattr(cfg, "remat_policy", None)
        return policy is not None and getattr(policy, "value", policy) != "none"

    return _any_node(model_cfg, remat)
