"""Pure builders: knob values in, Fiddle configs out (no experiment classes here)."""

from __future__ import annotations

import enum

import jax.numpy as jnp

from paxlite.tasks_lib import Learner
from praxis_lite import config as config_lib
from praxis_lite import optimizers
from praxis_lite.layers import activations
from praxis_lite.layers.embedding_softmax import RotaryPositionalEmbedding, SharedEmbeddingSoftmax
from praxis_lite.layers.normalizations import LayerNorm, RmsNorm
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import RematPolicy, StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.models import ClassificationMlpModel, LanguageModel


class Activation(enum.Enum):
    """Feed-forward activation choices (with USE_GATED_ACTIVATION: GLU variants)."""

    RELU = activations.ReLU
    GELU = activations.GELU
    SILU = activations.SiLU


class Norm(enum.Enum):
    """Normalization choices."""

    LAYER_NORM = LayerNorm
    RMS_NORM = RmsNorm


def transformer_lm(
    *,
    num_layers: int,
    model_dims: int,
    hidden_dims: int,
    num_heads: int,
    vocab_size: int,
    num_kv_heads: int | None = None,
    dims_per_head: int | None = None,
    activation: Activation = Activation.RELU,
    use_gated_activation: bool = False,
    norm: Norm = Norm.LAYER_NORM,
    use_rotary_position_emb: bool = True,
    use_bias: bool = True,
    use_attention_bias: bool | None = None,
    combine_qkv: bool = False,
    atten_logit_cap: float = 0.0,
    use_repeated_layer: bool = False,
    remat_policy: RematPolicy = RematPolicy.SAVE_NOTHING,
    num_stages: int = 1,
    num_microbatches: int | None = None,
    microbatch_size: int | None = None,
    circular_repeat: int = 1,
    dropout_prob: float = 0.0,
    soft_cap_logits: float = 0.0,
    z_loss_weight: float = 0.0,
    fprop_dtype=jnp.float32,
) -> config_lib.Config:
    """A ``LanguageModel`` config around a decoder-only ``TransformerLm``.

    ``use_attention_bias=None`` follows ``use_bias``; the feed-forward always
    follows ``use_bias``. With ``num_stages > 1`` the stack is a
    ``LayerwiseShardablePipelined`` of ``num_stages x circular_repeat`` virtual
    stages, each a scanned stack of ``num_layers / (num_stages x circular_repeat)``
    blocks (``use_repeated_layer`` is then implied).
    """
    lm = TransformerLm.HParams.config(model_dims=model_dims, vocab_size=vocab_size)
    lm.softmax_tpl = SharedEmbeddingSoftmax.HParams.config(
        soft_cap_logits=soft_cap_logits, z_loss_weight=z_loss_weight
    )
    lm.final_ln_tpl = norm.value.HParams.config()
    if num_stages > 1:
        stack = LayerwiseShardablePipelined.HParams.config(
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            microbatch_size=microbatch_size,
            circular_repeat=circular_repeat,
        )
        stack.stage_tpl.num_layers = num_layers // (num_stages * circular_repeat)
        stack.stage_tpl.remat_policy = remat_policy
    elif use_repeated_layer:
        stack = StackedTransformerRepeated.HParams.config(
            num_layers=num_layers, remat_policy=remat_policy
        )
    else:
        stack = StackedTransformer.HParams.config(num_layers=num_layers)
    block = block_config(stack)
    block.input_dims, block.hidden_dims = model_dims, hidden_dims
    block.num_heads, block.num_kv_heads, block.dim_per_head = num_heads, num_kv_heads, dims_per_head
    block.residual_dropout_prob = dropout_prob
    block.ln_tpl = norm.value.HParams.config()
    atten = block.tr_atten_tpl
    atten.use_bias = use_bias if use_attention_bias is None else use_attention_bias
    atten.combine_qkv = combine_qkv
    atten.atten_logit_cap = atten_logit_cap
    atten.atten_dropout_prob = dropout_prob
    if use_rotary_position_emb:
        atten.rotary_tpl = RotaryPositionalEmbedding.HParams.config()
    ff = block.tr_fflayer_tpl
    ff.has_bias = use_bias
    ff.use_gated_activation = use_gated_activation
    ff.activation_tpl = activation.value.HParams.config()
    ff.ln_tpl = norm.value.HParams.config()
    ff.relu_dropout_prob = dropout_prob
    lm.stacked_transformer_tpl = stack
    model = LanguageModel.HParams.config(lm_tpl=lm)
    return config_lib.set_dtypes(model, fprop_dtype=fprop_dtype)


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
    ``scale_sqrt_depth=False``), so ``output_dims`` must equal ``input_dims``.
    """
    model = ClassificationMlpModel.HParams.config()
    model.mlp_tpl.num_layers, model.mlp_tpl.hidden_dims = num_layers, hidden_dims
    model.mlp_tpl.ff_tpl.input_dims, model.mlp_tpl.ff_tpl.output_dims = input_dims, output_dims
    model.softmax_tpl = SharedEmbeddingSoftmax.HParams.config(
        input_dims=input_dims, num_classes=input_dims, scale_sqrt_depth=False
    )
    return config_lib.set_dtypes(model, fprop_dtype=fprop_dtype)


def block_config(stack: config_lib.Config) -> config_lib.Config:
    """The Transformer block config of a stack config (plain, repeated or pipelined)."""
    if stack.__fn_or_cls__ is LayerwiseShardablePipelined:
        return stack.stage_tpl.block_tpl
    return stack.block_tpl


def adam_learner(
    *,
    learning_rate: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    epsilon: float,
    clip_gradient_norm_to_value: float,
    lr_schedule: config_lib.Config,
) -> config_lib.Config:
    """Adam(W) with ``lr_schedule`` (a schedule config multiplying ``learning_rate``)."""
    optimizer = config_lib.Config(
        optimizers.Adam,
        learning_rate=learning_rate,
        beta1=beta1,
        beta2=beta2,
        epsilon=epsilon,
        weight_decay=weight_decay,
        clip_gradient_norm_to_value=clip_gradient_norm_to_value,
        lr_schedule=lr_schedule,
    )
    return config_lib.Config(Learner, optimizer=optimizer)
