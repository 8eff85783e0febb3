"""Pure builders and choices: knob values in, Fiddle configs out (no experiment classes here)."""

from __future__ import annotations

import enum

import jax.numpy as jnp

from praxis_lite import config as config_lib
from praxis_lite.layers import activations
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.layers.normalizations import LayerNorm, RmsNorm
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.models.classification import ClassificationMlpModel


class Activation(enum.Enum):
    """Feed-forward activation choices (with USE_GATED_ACTIVATION: GLU variants)."""

    RELU = activations.ReLU
    GELU = activations.GELU
    SILU = activations.SiLU


class Norm(enum.Enum):
    """Normalization choices."""

    LAYER_NORM = LayerNorm
    RMS_NORM = RmsNorm


def classification_mlp(
    *,
    num_layers: int,
    input_dims: int,
    hidden_dims: int,
    output_dims: int,
    fprop_dtype=jnp.float32,
) -> config_lib.Config:
    """A ``ClassificationMlpModel`` config as Pax's ``ClassificationModelAdam`` sets it.

    The MLP maps ``input_dims -> hidden_dims (x num_layers - 1) -> output_dims``; the
    shared table has ``input_dims`` classes of ``input_dims`` dims, unscaled (Pax's
    ``scale_sqrt_depth=False``) and with praxis's logit bias, so ``output_dims`` must
    equal ``input_dims``.
    """
    model = ClassificationMlpModel.HParams.config()
    model.mlp_tpl.num_layers, model.mlp_tpl.hidden_dims = num_layers, hidden_dims
    model.mlp_tpl.ff_tpl.input_dims, model.mlp_tpl.ff_tpl.output_dims = input_dims, output_dims
    model.softmax_tpl = SharedEmbeddingSoftmax.HParams.config(
        input_dims=input_dims, num_classes=input_dims, scale_sqrt_depth=False, use_bias=True
    )
    return config_lib.set_dtypes(model, fprop_dtype=fprop_dtype)


def block_config(stack: config_lib.Config) -> config_lib.Config:
    """The Transformer block config of a stack config (plain, repeated or pipelined)."""
    if stack.__fn_or_cls__ is LayerwiseShardablePipelined:
        return stack.stage_tpl.block_tpl
    return stack.block_tpl
