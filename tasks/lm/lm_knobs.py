"""The decoder-only LM's knobs, each declared once, and the model built from them.

Two knob groups (mixins, see ``tasks.lm.knob_groups``): ``LmTrainingKnobs``, what
any decoder-only LM trains with whoever builds it (the sequence, the compute dtype, the
scanned stack's remat, the loss), and ``TransformerLmKnobs``, the shape and architecture
of paxlite's own Transformer LM, built by :meth:`TransformerLmKnobs.model`. A Hugging
Face model takes its shape from its config.json (``tasks.lm.hf_model``) and so has
only the first group.
"""

from __future__ import annotations

import abc
from typing import Any

import jax.numpy as jnp

from paxlite.experiments.base_experiment import BaseExperiment, KnobError, PipelineLayout
from praxis_lite import config as config_lib
from praxis_lite.layers.embedding_softmax import (
    Embedding,
    FullSoftmax,
    RotaryPositionalEmbedding,
    SharedEmbeddingSoftmax,
    TrainablePositionalEmbedding,
)
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.models.lm import LanguageModel
from praxis_lite.sharding import (
    EMBED,
    EXPERT,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    MLP,
    STAGES,
    TABLE_EMBED,
    VOCAB,
)
from tasks.lm.knob_groups import check_at_least, knob_group
from tasks.lm.model_params import Activation, Norm, block_config
from tasks.moe.moe_knobs import MoeKnobs

#: Logical axis -> (where its size comes from, for messages; the size).
WeightSizes = dict[str, tuple[str, int]]


@knob_group
class LmTrainingKnobs(BaseExperiment):
    """What a decoder-only LM trains with, whoever builds the model.

    MAX_SEQ_LEN: tokens per row. FPROP_DTYPE: the compute dtype (weights float32).
    USE_REPEATED_LAYER: the blocks in one scanned stack; CHECKPOINT_POLICY: its remat
    (CHECKPOINT_OFFLOAD_TO_HOST keeps a named policy's activations in host memory).
    Z_LOSS_WEIGHT: the softmax's z-loss; NUM_LOSS_CHUNKS (> 1): the output projection and
    the loss over that many chunks of the sequence, so the whole [B, T, V] float32 logits
    never exist at once (it must divide MAX_SEQ_LEN).
    """

    MAX_SEQ_LEN: int = 1024
    FPROP_DTYPE: Any = jnp.bfloat16
    USE_REPEATED_LAYER: bool = True
    CHECKPOINT_POLICY: AutodiffCheckpointType = AutodiffCheckpointType.SAVE_NOTHING
    CHECKPOINT_OFFLOAD_TO_HOST: bool = False
    Z_LOSS_WEIGHT: float = 0.0
    NUM_LOSS_CHUNKS: int = 1

    @abc.abstractmethod
    def vocab_size(self) -> int:
        """The model's vocabulary size (ids < it), what the inputs' ids must fit."""

    @abc.abstractmethod
    def weight_sizes(self) -> WeightSizes:
        """Each logical weight axis's size and where it comes from (the mesh splits it)."""

    def validate(self) -> None:
        super().validate()
        check_at_least(self, 1, "MAX_SEQ_LEN")
        check_at_least(self, 1, "NUM_LOSS_CHUNKS")
        if self.MAX_SEQ_LEN % self.NUM_LOSS_CHUNKS:
            raise KnobError(
                f"{type(self).__qualname__}.NUM_LOSS_CHUNKS = {self.NUM_LOSS_CHUNKS} does not "
                f"divide MAX_SEQ_LEN = {self.MAX_SEQ_LEN}; the loss chunks split the sequence "
                "evenly: pick a divisor of MAX_SEQ_LEN (1: no chunks)."
            )

    def configure_softmax(self, softmax: config_lib.Config) -> None:
        """Sets NUM_LOSS_CHUNKS and Z_LOSS_WEIGHT on the model's softmax config, in place."""
        softmax.num_chunks, softmax.z_loss_weight = self.NUM_LOSS_CHUNKS, self.Z_LOSS_WEIGHT

    def scan_settings(self) -> dict[str, Any]:
        """The scanned stack's fields these knobs set (its remat)."""
        return {
            "checkpoint_policy": self.CHECKPOINT_POLICY,
            "offload_to_host": self.CHECKPOINT_OFFLOAD_TO_HOST,
        }


@knob_group
class TransformerLmKnobs(LmTrainingKnobs, MoeKnobs):
    """Shape and architecture of paxlite's decoder-only Transformer LM (Pax's names where
    Pax has them), beyond ``LmTrainingKnobs``.

    Shape: NUM_LAYERS, MODEL_DIMS, HIDDEN_DIMS, NUM_HEADS, NUM_KV_HEADS (None: NUM_HEADS),
    DIMS_PER_HEAD (None: MODEL_DIMS // NUM_HEADS), VOCAB_SIZE. Block:
    ACTIVATION_CLS, USE_GATED_ACTIVATION, NORM, USE_ROTARY_POSITION_EMB, USE_BIAS,
    USE_ATTENTION_BIAS (None: follow USE_BIAS), COMBINE_QKV (one [3, D, N, H] q/k/v
    weight), ATTEN_LOGIT_CAP (tanh cap on attention logits, 0: none), DROPOUT_PROB.
    Embeddings: SEPARATE_EMBEDDING (an input table of its own, scaled by sqrt(MODEL_DIMS),
    and a separate output projection; else one shared table), TRAINABLE_POSITION_EMB
    (a learned table of TRAINABLE_PE_MAX_SEQ_LEN positions added to the input).
    Output: SOFTMAX_CAP_LOGITS. Pipeline: NUM_STAGES > 1
    splits the layers over that many stages, the batch cut into microbatches of
    MICROBATCH_SIZE or into NUM_MICROBATCHES (default NUM_STAGES); CIRCULAR_REPEAT
    virtual stages per device, STREAM_IO (the microbatch buffer split over the stages).
    Mixture-of-experts feed-forwards: ``MoeKnobs`` (off while NUM_EXPERTS is 0).
    """

    NUM_LAYERS: int
    MODEL_DIMS: int
    HIDDEN_DIMS: int
    NUM_HEADS: int
    NUM_KV_HEADS: int | None = None
    DIMS_PER_HEAD: int | None = None
    VOCAB_SIZE: int = 32000
    ACTIVATION_CLS: Activation = Activation.GELU
    USE_GATED_ACTIVATION: bool = False
    NORM: Norm = Norm.LAYER_NORM
    USE_ROTARY_POSITION_EMB: bool = True
    USE_BIAS: bool = True
    DROPOUT_PROB: float = 0.0
    SOFTMAX_CAP_LOGITS: float = 0.0
    COMBINE_QKV: bool = False
    SEPARATE_EMBEDDING: bool = False
    TRAINABLE_POSITION_EMB: bool = False
    TRAINABLE_PE_MAX_SEQ_LEN: int = 16 * 1024
    ATTEN_LOGIT_CAP: float = 0.0
    USE_ATTENTION_BIAS: bool | None = None
    NUM_STAGES: int = 1
    MICROBATCH_SIZE: int | None = None
    NUM_MICROBATCHES: int | None = None
    CIRCULAR_REPEAT: int = 1
    STREAM_IO: bool = False

    @classmethod
    def pipeline_layout(cls) -> PipelineLayout:
        """NUM_STAGES and CIRCULAR_REPEAT, what a paxml checkpoint's layout depends on."""
        return PipelineLayout(cls.NUM_STAGES, cls.CIRCULAR_REPEAT)

    def vocab_size(self) -> int:
        return self.VOCAB_SIZE

    def weight_sizes(self) -> WeightSizes:
        """The knobs' sizes; a pipelined stack's layers per repeat on 'stages'."""
        kv_heads = self.NUM_KV_HEADS or self.NUM_HEADS
        sizes = {
            EMBED: ("MODEL_DIMS", self.MODEL_DIMS),
            TABLE_EMBED: ("MODEL_DIMS", self.MODEL_DIMS),
            MLP: ("HIDDEN_DIMS", self.HIDDEN_DIMS),
            HEADS: ("NUM_HEADS", self.NUM_HEADS),
            KV_HEADS: ("NUM_KV_HEADS" if self.NUM_KV_HEADS else "NUM_HEADS", kv_heads),
            HEAD_DIM: (self.head_dims_source(), self.head_dims()),
            VOCAB: ("VOCAB_SIZE", self.VOCAB_SIZE),
        }
        if self.NUM_EXPERTS:
            sizes[EXPERT] = ("NUM_EXPERTS", self.NUM_EXPERTS)
        if self.NUM_STAGES > 1:  # Pipelined weights: [L, ...] or [R, L / R, ...] on 'stages'.
            per_repeat = self.NUM_LAYERS // self.CIRCULAR_REPEAT
            sizes[STAGES] = ("NUM_LAYERS / CIRCULAR_REPEAT", per_repeat)
        else:
            sizes[LAYERS] = ("NUM_LAYERS", self.NUM_LAYERS)
        return sizes

    def head_dims(self) -> int:
        """Dims per attention head."""
        return self.DIMS_PER_HEAD or self.MODEL_DIMS // self.NUM_HEADS

    def head_dims_source(self) -> str:
        """The knob(s) :meth:`head_dims` comes from, for messages."""
        if self.DIMS_PER_HEAD is not None:
            return "DIMS_PER_HEAD"
        return "MODEL_DIMS // NUM_HEADS"

    def model(self) -> config_lib.Config:
        """The ``LanguageModel`` config around a ``TransformerLm`` of these knobs."""
        lm = TransformerLm.HParams.config(model_dims=self.MODEL_DIMS, vocab_size=self.VOCAB_SIZE)
        softmax = FullSoftmax if self.SEPARATE_EMBEDDING else SharedEmbeddingSoftmax
        lm.softmax_tpl = softmax.HParams.config(soft_cap_logits=self.SOFTMAX_CAP_LOGITS)
        self.configure_softmax(lm.softmax_tpl)
        if self.SEPARATE_EMBEDDING:
            lm.embedding_tpl = Embedding.HParams.config(scale_sqrt_depth=True)
        if self.TRAINABLE_POSITION_EMB:
            lm.position_emb_tpl = TrainablePositionalEmbedding.HParams.config(
                max_seq_length=self.TRAINABLE_PE_MAX_SEQ_LEN
            )
        lm.final_ln_tpl = self.NORM.value.HParams.config()
        lm.stacked_transformer_tpl = self.stack()
        self.configure_block(block_config(lm.stacked_transformer_tpl))
        model = LanguageModel.HParams.config(lm_tpl=lm)
        return config_lib.set_dtypes(model, fprop_dtype=self.FPROP_DTYPE)

    def stack(self) -> config_lib.Config:
        """Plain, scanned (USE_REPEATED_LAYER) or pipelined (NUM_STAGES > 1, scanned stages)."""
        if self.NUM_STAGES > 1:
            stack = LayerwiseShardablePipelined.HParams.config(
                num_stages=self.NUM_STAGES,
                num_microbatches=self.NUM_MICROBATCHES,
                microbatch_size=self.MICROBATCH_SIZE,
                circular_repeat=self.CIRCULAR_REPEAT,
                stream_io=self.STREAM_IO,
            )
            stack.stage_tpl.num_layers = self.NUM_LAYERS // (self.NUM_STAGES * self.CIRCULAR_REPEAT)
            for field, value in self.scan_settings().items():
                setattr(stack.stage_tpl, field, value)
            return stack
        if self.USE_REPEATED_LAYER:
            return StackedTransformerRepeated.HParams.config(
                num_layers=self.NUM_LAYERS, **self.scan_settings()
            )
        return StackedTransformer.HParams.config(num_layers=self.NUM_LAYERS)

    def configure_block(self, block: config_lib.Config) -> None:
        """Sets the Transformer block's sizes, attention and feed-forward from the knobs."""
        block.input_dims, block.hidden_dims = self.MODEL_DIMS, self.HIDDEN_DIMS
        block.num_heads, block.num_kv_heads = self.NUM_HEADS, self.NUM_KV_HEADS
        block.dims_per_head = self.DIMS_PER_HEAD
        block.residual_dropout_prob = self.DROPOUT_PROB
        block.ln_tpl = self.NORM.value.HParams.config()
        atten = block.tr_atten_tpl
        atten.use_bias = (
            self.USE_BIAS if self.USE_ATTENTION_BIAS is None else self.USE_ATTENTION_BIAS
        )
        atten.combine_qkv = self.COMBINE_QKV
        atten.atten_logit_cap = self.ATTEN_LOGIT_CAP
        atten.atten_dropout_prob = self.DROPOUT_PROB
        if self.USE_ROTARY_POSITION_EMB:
            atten.rotary_tpl = RotaryPositionalEmbedding.HParams.config()
        ff = block.tr_fflayer_tpl
        ff.use_bias = self.USE_BIAS
        ff.use_gated_activation = self.USE_GATED_ACTIVATION
        ff.activation_tpl = self.ACTIVATION_CLS.value.HParams.config()
        ff.ln_tpl = self.NORM.value.HParams.config()
        ff.relu_dropout_prob = self.DROPOUT_PROB
