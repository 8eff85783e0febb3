"""``t5x.adafactor``: T5X's Adafactor and its factoring rules by logical axis."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class FactorDim(enum.Enum):
    """How a logical axis takes part in factoring the second moment (T5X's)."""

    NONE = None
    BATCH = 1
    ROW = 2
    COLUMN = 3


def standard_logical_factor_rules() -> dict[str, FactorDim]:
    """T5X's rules: which logical axis of a weight is a row, a column, a batch."""
    column, row, batch, none = FactorDim.COLUMN, FactorDim.ROW, FactorDim.BATCH, FactorDim.NONE
    return {
        "vocab": column,
        "embed": row,
        "mlp": column,
        "heads": column,
        "kv": column,
        "joined_kv": column,
        "relpos_buckets": none,
        "layers": batch,
        "stack": batch,
        "q_wi_fused": column,
        "o_wo_fused": column,
        "multiquery_heads": column,
        "kv_fused": column,
        "layer_norm_scale": none,
        "mlp_activations": column,
    }


@dataclasses.dataclass(frozen=True)
class Adafactor:
    """T5X's ``adafactor.Adafactor`` (its fields and defaults). ``learning_rate`` None: the
    trainer's ``learning_rate_fn`` gives it."""

    learning_rate: float | None = None
    factored: bool = True
    multiply_by_parameter_scale: Any = True
    beta1: float | None = None
    decay_rate: float = 0.8
    step_offset: int = 0
    clipping_threshold: float | None = 1.0
    weight_decay_rate: float | None = None
    min_dim_size_to_factor: int = 128
    epsilon1: float = 1e-30
    epsilon2: float = 1e-3
    dtype_momentum: Any = "float32"
    factor_map: Any = None
    logical_factor_rules: Mapping[str, Any] | None = None
    weight_decay_rate_lr_exponent: float | None = None
    global_norm_clip_threshold: float | None = None
    max_parameter_scale: float | None = None
    skip_nan_updates: bool | None = False
