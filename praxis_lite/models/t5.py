"""T5 as a configuration of the existing layers: knob values in, a Fiddle config out.

T5's details (Raffel et al. 2020; T5X's ``network.py``; Hugging Face's ``T5Model``):
pre-norm blocks with RMS norms (no bias, no mean; epsilon 1e-6, statistics in float32),
attention without biases and without the ``1 / sqrt(H)`` in the forward pass (it is in
the query's initial values), one relative position bias table per stack (32 buckets,
max distance 128; bidirectional in the encoder, causal in the decoder; none in the
cross-attention), feed-forward without biases: ReLU (T5 1.0) or gated tanh-GELU
(``('gelu', 'linear')``: T5 1.1, flan-t5), one token embedding for both stacks, and
logits through a separate projection (T5 1.1) or the embedding table scaled by ``1 /
sqrt(D)`` (T5 1.0). Dropout on the embeddings, every residual branch, and each stack's
normed output.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import jax.numpy as jnp

from praxis_lite import config as config_lib
from praxis_lite.layers.activations import GELU, ReLU, SiLU
from praxis_lite.layers.attentions import QueryScale
from praxis_lite.layers.embedding_softmax import Embedding, FullSoftmax, SharedEmbeddingSoftmax
from praxis_lite.layers.encoder_decoder import TransformerEncoderDecoder
from praxis_lite.layers.normalizations import RmsNorm
from praxis_lite.layers.relative_bias import RelativePositionBias
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.models.encoder_decoder import EncoderDecoderModel

#: T5's norm epsilon.
T5_NORM_EPSILON = 1e-6
#: T5X's activation names -> layers (its 'gelu' is the tanh approximation, as here).
ACTIVATIONS = {"gelu": GELU, "relu": ReLU, "silu": SiLU}


@dataclasses.dataclass(frozen=True)
class T5Shape:
    """The sizes and variant of a T5 model.

    Attributes:
      num_encoder_layers / num_decoder_layers: blocks per stack.
      model_dims: ``D``; hidden_dims: the MLP's ``F``; num_heads and dims_per_head.
      vocab_size: ``V`` (T5's SentencePiece: 32128 with the extra ids).
      mlp_activations: T5X's ``mlp_activations``: one activation (``'relu'``: T5 1.0), or
        an activation and ``'linear'``, its gate (``('gelu', 'linear')``: T5 1.1's gated
        tanh-GELU); see :data:`ACTIVATIONS`.
      logits_via_embedding: T5X's: logits through the embedding table scaled by ``1 /
        sqrt(D)`` (T5 1.0); False: a separate projection (T5 1.1).
      dropout_prob: every dropout (T5X's ``dropout_rate``).
      relative_buckets / relative_max_distance: each stack's relative position bias
        (T5's 32 buckets, distance 128).
    """

    num_encoder_layers: int
    num_decoder_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    dims_per_head: int
    vocab_size: int
    mlp_activations: tuple[str, ...] = ("gelu", "linear")
    logits_via_embedding: bool = False
    dropout_prob: float = 0.0
    relative_buckets: int = 32
    relative_max_distance: int = 128

    def __post_init__(self) -> None:
        acts = tuple(self.mlp_activations)
        if not (len(acts) in (1, 2) and acts[0] in ACTIVATIONS and acts[1:] in ((), ("linear",))):
            raise ValueError(
                f"mlp_activations={acts!r}: give one of {sorted(ACTIVATIONS)}, optionally "
                "followed by 'linear' (its gate), e.g. ('gelu', 'linear') or ('relu',)."
            )
        object.__setattr__(self, "mlp_activations", acts)

    @property
    def gated(self) -> bool:
        """The MLP has a linear gate (``mlp_activations`` ends with 'linear')."""
        return len(self.mlp_activations) == 2


def t5_model(
    shape: T5Shape,
    *,
    fprop_dtype: Any = jnp.bfloat16,
    scanned: bool = True,
    checkpoint_policy: AutodiffCheckpointType = AutodiffCheckpointType.SAVE_NOTHING,
    z_loss_weight: float = 0.0,
) -> config_lib.Config:
    """An ``EncoderDecoderModel`` config of T5 of ``shape`` (float32 weights, compute in
    ``fprop_dtype`` but for T5 1.1's separate logits projection, in float32 as T5X's;
    stacks scanned with ``checkpoint_policy``, or plain)."""
    d = shape.model_dims
    network = TransformerEncoderDecoder.HParams.config(
        model_dims=d, vocab_size=shape.vocab_size, dropout_prob=shape.dropout_prob
    )
    if shape.logits_via_embedding:
        network.softmax_tpl = SharedEmbeddingSoftmax.HParams.config(
            scale_sqrt_depth=False, logits_scale=1.0 / math.sqrt(d)
        )
    else:
        network.embedding_tpl = Embedding.HParams.config(scale_sqrt_depth=False)
        network.softmax_tpl = FullSoftmax.HParams.config(use_bias=False)
    network.softmax_tpl.z_loss_weight = z_loss_weight
    network.encoder_ln_tpl = _norm()
    network.decoder_ln_tpl = _norm()
    stacks = []
    for decoder, layers in ((False, shape.num_encoder_layers), (True, shape.num_decoder_layers)):
        stack = _stack(layers, scanned, checkpoint_policy)
        stack.relative_bias_tpl = RelativePositionBias.HParams.config(
            bidirectional=not decoder,
            num_buckets=shape.relative_buckets,
            max_distance=shape.relative_max_distance,
        )
        _configure_block(stack.block_tpl, shape, decoder)
        stacks.append(stack)
    network.encoder_stack_tpl, network.decoder_stack_tpl = stacks
    model = EncoderDecoderModel.HParams.config(encoder_decoder_tpl=network)
    config_lib.set_dtypes(model, fprop_dtype=fprop_dtype)
    if not shape.logits_via_embedding:  # T5X's logits_dense computes in float32.
        network.softmax_tpl.fprop_dtype = jnp.float32
    return model


def _norm() -> config_lib.Config:
    """T5's RMS norm (a new config each time: a shared one would share weights)."""
    return RmsNorm.HParams.config(epsilon=T5_NORM_EPSILON)


def _stack(
    num_layers: int, scanned: bool, checkpoint_policy: AutodiffCheckpointType
) -> config_lib.Config:
    if scanned:
        return StackedTransformerRepeated.HParams.config(
            num_layers=num_layers, checkpoint_policy=checkpoint_policy
        )
    return StackedTransformer.HParams.config(num_layers=num_layers)


def _attention(block: config_lib.Config, decoder: bool) -> config_lib.Config:
    """T5's attention: no biases, the query's scale in its init, causal in the decoder."""
    atten = block.tr_atten_tpl
    atten.use_bias = False
    atten.query_scale = QueryScale.IN_INIT
    atten.is_causal = decoder
    atten.atten_dropout_prob = block.residual_dropout_prob
    return atten


def _configure_block(block: config_lib.Config, shape: T5Shape, decoder: bool) -> None:
    """An encoder block, or a decoder block (causal, with cross-attention)."""
    block.input_dims, block.hidden_dims = shape.model_dims, shape.hidden_dims
    block.num_heads, block.dims_per_head = shape.num_heads, shape.dims_per_head
    block.residual_dropout_prob = shape.dropout_prob
    block.ln_tpl = _norm()
    _attention(block, decoder)
    if decoder:
        block.cross_atten_tpl = copy.deepcopy(block.tr_atten_tpl)
        block.cross_atten_tpl.is_causal = False
    ff = block.tr_fflayer_tpl
    ff.use_bias = False
    ff.ln_tpl = _norm()
    ff.relu_dropout_prob = shape.dropout_prob
    ff.use_gated_activation = shape.gated
    ff.activation_tpl = ACTIVATIONS[shape.mlp_activations[0]].HParams.config()
