"""The decoder-only LM family base (Pax's ``LmCloudSpmd``): knobs -> task config.

Leaves set knobs (sizes, batch, mesh) and ``datasets()``; everything else is
derived here through the pure builders of ``model_params``.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import jax.numpy as jnp

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from paxlite.runtime import mesh_checks
from praxis_lite import config as config_lib
from praxis_lite.decoding import beam_search
from praxis_lite.inputs.synthetic_input import SyntheticLmInput
from praxis_lite.layers.attentions import QueryScale
from praxis_lite.layers.embedding_softmax import PositionalEmbedding
from praxis_lite.layers.lora_targets import FEED_FORWARD_TARGETS
from praxis_lite.layers.repeats import AutodiffCheckpointType
from praxis_lite.moe import Dispatch, routing
from praxis_lite.sharding import (
    DATA_PARALLEL_RULES,
    FSDP_AND_TENSOR_PARALLEL_RULES,
    LM_BATCH,
    TABLE_EMBED,
)
from tasks.lm import model_params
from tasks.lm.classification import ClassificationModelAdam
from tasks.lm.knob_groups import AdamKnobs, LoopKnobs, LrSchedule, LrScheduleKnobs, knob_group
from tasks.lm.lm_knobs import LmTrainingKnobs, TransformerLmKnobs
from tasks.lm.lora_knobs import LoraKnobs
from tasks.lm.model_params import Activation


@knob_group
class LmTrainer(LmTrainingKnobs, AdamKnobs, LrScheduleKnobs, LoopKnobs, LoraKnobs):
    """What trains a decoder-only LM, whoever builds its ``model()``: the LM's training knobs
    (``LmTrainingKnobs``), Adam (``AdamKnobs``), the learning-rate schedule
    (``LrScheduleKnobs``: cosine by default), the loop (``LoopKnobs``) and LoRA adapters
    (``LoraKnobs``: off unless LORA_RANK > 0); the weights checked to split evenly on the
    mesh (``paxlite.runtime.mesh_checks``).

    EMB_W_DATA_DIMS: the mesh axes the embedding table's model dim is split over
    (Pax's knob, e.g. ('replica', 'data')); None: as every other weight's model
    dim (the 'embed' rule of LOGICAL_AXIS_RULES).
    """

    EMB_W_DATA_DIMS: str | tuple[str, ...] | None = None

    LR_SCHEDULE = LrSchedule.LINEAR_RAMPUP_COSINE_DECAY

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The rules, with EMB_W_DATA_DIMS."""
        rules = super().logical_axis_rules()
        if self.EMB_W_DATA_DIMS is None:
            return rules
        return ((TABLE_EMBED, self.EMB_W_DATA_DIMS), *rules)

    @abc.abstractmethod
    def model(self) -> config_lib.Config:
        """The ``LanguageModel`` config."""

    def validate(self) -> None:
        super().validate()
        plan = mesh_checks.MeshPlan.of(self)
        self.check_model(plan)
        plan.check_even_split(self.weight_sizes())

    def check_model(self, plan: mesh_checks.MeshPlan) -> None:
        """The model's own checks, before its weights' even split on ``plan``: here, that the
        mesh has no 'stage' devices (this model is not pipelined)."""
        plan.check_no_stage_axis(repeat=1)

    def task_model(self) -> config_lib.Config:
        """The model the task trains: :meth:`model` (a family may finish it here)."""
        return self.model()

    def stand_in_datasets(self, dataset_cfgs: list[Any]) -> list[Any]:
        """The training input as random tokens of its per-host batch and ``MAX_SEQ_LEN``."""
        return [
            config_lib.Config(
                SyntheticLmInput,
                batch_size=cfg.batch_size,
                seq_len=self.MAX_SEQ_LEN,
                vocab_size=self.vocab_size(),
                random_tokens=True,
            )
            for cfg in dataset_cfgs
            if getattr(cfg, "is_training", True)
        ]

    def task(self) -> Any:
        """The task; beam search (``task.decoder.num_beams > 1``) normalises lengths with
        praxis' default ``length_norm_alpha`` (0.8)."""
        task = self.single_task(self.task_model(), self.learner(self.lr_schedule()))
        task.decoder.length_norm_alpha = beam_search.PRAXIS_LENGTH_NORM_ALPHA
        return self.with_lora(task)


@knob_group
class LmCloudSpmd(TransformerLmKnobs, LmTrainer):
    """Family knobs of paxlite's dense (or MoE) decoder-only LMs trained with Adam: the model
    (``TransformerLmKnobs``) and its training (``LmTrainer``), validated against each
    other and the mesh.

    Pipeline parallelism (``praxis_lite.layers.pipeline``): NUM_STAGES > 1 splits
    the layers over that many stages along a 'stage' mesh axis (MESH_AXIS_NAMES
    ('stage', 'replica', 'data', 'mdl'), ICI x DCN devices on 'stage' equal to
    NUM_STAGES).
    """

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The rules with the experts'; a pipelined LM runs its embeddings and softmax
        data-parallel over the 'stage' axis too (Pax's batch_dims (stage, replica, data)).

        'stage' last: a device then holds rows that sit on its own 'data' shard in the
        pipeline's interleaved microbatches, so entering the pipeline is an all-gather over
        'stage' (not a reshuffle of the whole batch through every device).
        """
        rules = (*self.expert_rules(), *super().logical_axis_rules())
        if self.NUM_STAGES > 1:
            rules = ((LM_BATCH, ("replica", "data", "stage")), *rules)
        return rules

    def check_model(self, plan: mesh_checks.MeshPlan) -> None:
        """Sizes are positive, heads divide the model dims, the pipeline and the experts fit
        the mesh."""
        self._check_ranges()
        self._check_heads()
        self._check_pipeline(plan)
        if self.NUM_EXPERTS:
            self._check_moe_groups(plan)

    def task_model(self) -> config_lib.Config:
        """:meth:`model` with the MoE knobs applied last, to the finished model's blocks
        (``MoeKnobs.with_experts``)."""
        model = self.model()
        model.lm_tpl.stacked_transformer_tpl = self.with_experts(
            model.lm_tpl.stacked_transformer_tpl
        )
        return model

    def _check_moe_groups(self, plan: mesh_checks.MeshPlan) -> None:
        """NUM_GROUPS divides the tokens an MoE layer sees at once (a train step's batch, or
        one of its microbatches: pipelined or accumulated), and capacity routing has slots."""
        adapted = sorted(set(self.lora_targets()) & set(FEED_FORWARD_TARGETS))
        if self.LORA_RANK and adapted:
            raise KnobError(
                f"{plan.owner}: LoRA adapters on the feed-forward ({', '.join(adapted)}) are "
                "not built for mixture-of-experts layers; target the attention only."
            )
        examples = self.global_batch_size(math.prod(plan.sizes.values()))
        if self.NUM_STAGES > 1:
            examples = self.MICROBATCH_SIZE or examples // (
                self.NUM_MICROBATCHES or self.NUM_STAGES
            )
        tokens = examples // self.GRAD_ACCUM_STEPS * self.MAX_SEQ_LEN
        if self.MIN_GROUP_SIZE is not None:
            return
        if tokens % self.NUM_GROUPS:
            raise KnobError(
                f"{plan.owner}.NUM_GROUPS = {self.NUM_GROUPS} does not divide the {tokens} "
                "tokens an MoE layer sees at once (the batch, or a microbatch, x MAX_SEQ_LEN); "
                "pick a divisor (Pax uses the data-parallel size)."
            )
        if self.MOE_DISPATCH is not Dispatch.CAPACITY:
            return
        group = tokens // self.NUM_GROUPS
        factor, experts = self.EXPERT_CAPACITY_FACTOR, self.NUM_EXPERTS
        if routing.expert_capacity(group, experts, factor, self.EXPERT_CAPACITY) < 1:
            raise KnobError(
                f"{plan.owner}: the MoE expert capacity rounds to 0 (groups of {group} tokens x "
                f"EXPERT_CAPACITY_FACTOR {factor} / NUM_EXPERTS {experts}); raise "
                "EXPERT_CAPACITY_FACTOR or EXPERT_CAPACITY, or use fewer NUM_GROUPS."
            )

    def _check_pipeline(self, plan: mesh_checks.MeshPlan) -> None:
        """Stages, microbatches and circular repeats fit the layers, the batch and the mesh."""
        for knob in ("NUM_STAGES", "CIRCULAR_REPEAT", "MICROBATCH_SIZE", "NUM_MICROBATCHES"):
            value = getattr(self, knob)
            if value is not None and value < 1:
                raise KnobError(f"{plan.owner}.{knob} = {value}; it must be at least 1.")
        stages, repeat = self.NUM_STAGES, self.CIRCULAR_REPEAT
        if stages == 1:
            plan.check_no_stage_axis(repeat)
            return
        plan.check_stages(stages, repeat, self.NUM_LAYERS)
        plan.check_microbatches(
            self.global_batch_size(plan.num_devices),
            stages,
            repeat,
            self.MICROBATCH_SIZE,
            self.NUM_MICROBATCHES,
        )

    def _check_ranges(self) -> None:
        name = type(self).__qualname__
        at_least_one = (
            "NUM_LAYERS",
            "MODEL_DIMS",
            "HIDDEN_DIMS",
            "NUM_HEADS",
            "VOCAB_SIZE",
        )
        for knob in at_least_one:
            if getattr(self, knob) < 1:
                raise KnobError(f"{name}.{knob} = {getattr(self, knob)}; it must be at least 1.")
        for knob in ("NUM_KV_HEADS", "DIMS_PER_HEAD"):
            if getattr(self, knob) is not None and getattr(self, knob) < 1:
                raise KnobError(
                    f"{name}.{knob} = {getattr(self, knob)}; it must be at least 1 (or None)."
                )
        if not 0.0 <= self.DROPOUT_PROB < 1.0:
            raise KnobError(f"{name}.DROPOUT_PROB = {self.DROPOUT_PROB}; it must be in [0, 1).")

    def _check_heads(self) -> None:
        name = type(self).__qualname__
        if self.DIMS_PER_HEAD is None and self.MODEL_DIMS % self.NUM_HEADS:
            raise KnobError(
                f"{name}: MODEL_DIMS={self.MODEL_DIMS} is not divisible by NUM_HEADS="
                f"{self.NUM_HEADS} (each head gets MODEL_DIMS // NUM_HEADS dims); change "
                "MODEL_DIMS or NUM_HEADS so NUM_HEADS divides MODEL_DIMS, or set DIMS_PER_HEAD."
            )
        if self.USE_ROTARY_POSITION_EMB and self.head_dims() % 2:
            raise KnobError(
                f"{name}: rotary position embeddings need an even number of dims per head, "
                f"got {self.head_dims_source()}={self.head_dims()}; change MODEL_DIMS, "
                "NUM_HEADS or DIMS_PER_HEAD, or set USE_ROTARY_POSITION_EMB=false."
            )
        kv_heads = self.NUM_KV_HEADS or self.NUM_HEADS
        if self.NUM_HEADS % kv_heads:
            raise KnobError(
                f"{name}: NUM_HEADS={self.NUM_HEADS} is not a multiple of NUM_KV_HEADS="
                f"{kv_heads}; each key/value head serves a whole group of query heads."
            )
        if self.COMBINE_QKV and kv_heads != self.NUM_HEADS:
            raise KnobError(
                f"{name}: COMBINE_QKV needs NUM_KV_HEADS equal to NUM_HEADS (or None), got "
                f"NUM_KV_HEADS={self.NUM_KV_HEADS}; set COMBINE_QKV=false for grouped heads."
            )
        if self.COMBINE_QKV and self.LORA_RANK:
            raise KnobError(
                f"{name}: LoRA (LORA_RANK={self.LORA_RANK}) adapts separate q, k and v "
                "weights, and COMBINE_QKV=true stores them as one; set COMBINE_QKV=false."
            )


def bfloat16_compute(task_cfg: Any) -> None:
    """Fiddler: float32 weights, bfloat16 compute everywhere in the model."""
    config_lib.set_dtypes(task_cfg.model, fprop_dtype=jnp.bfloat16)


@knob_group
class PaxTransformerLm(LmCloudSpmd):
    """Pax's decoder-only Transformer (``TransformerLmSpmdAdafactor``), shared by its catalogues.

    Pax's choices: GELU, no RoPE but sinusoidal absolute positions (praxis's
    default; a learned table with TRAINABLE_POSITION_EMB), praxis's learned
    per-dim query scale and shared-softmax bias, 128 dims per head
    with NUM_HEADS x DIMS_PER_HEAD == MODEL_DIMS, one combined q/k/v weight
    without biases (feed-forward biases kept), attention logits capped at 50 and
    softmax logits at 30, repeated layers, weights split over 'data' (FSDP) and
    'mdl' (tensor parallelism), gradients clipped at global norm 5. Subclasses set
    the input, the optimizer details, the sizes and the mesh.

    Pax's other model knobs: EMBEDDING_LOOKUP_STYLE ('index' or 'matmul': how
    token ids pick table rows; the same vectors; 'matmul', one-hot ids times the
    table, as Pax's sharding annotations set it for every LM given a mesh, which
    keeps each chip's lookup to its own rows of the batch). NORM_POLICY 'pre' (norms before
    attention and feed-forward) is the one built here; USE_FP8 and RELATIVE_BIAS
    True are refused with the reason.
    """

    EMBEDDING_LOOKUP_STYLE: str = "matmul"
    NORM_POLICY: str = "pre"
    USE_FP8: bool = False
    RELATIVE_BIAS: bool = False

    DIMS_PER_HEAD = 128
    ACTIVATION_CLS = Activation.GELU
    USE_ROTARY_POSITION_EMB = False
    COMBINE_QKV = True
    USE_ATTENTION_BIAS = False
    ATTEN_LOGIT_CAP = 50.0
    SOFTMAX_CAP_LOGITS = 30.0
    USE_REPEATED_LAYER = True
    LOGICAL_AXIS_RULES = FSDP_AND_TENSOR_PARALLEL_RULES
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0

    def model(self) -> config_lib.Config:
        model = super().model()
        lm = model.lm_tpl
        if not self.TRAINABLE_POSITION_EMB:
            lm.position_emb_tpl = PositionalEmbedding.HParams.config()
        table = lm.embedding_tpl if self.SEPARATE_EMBEDDING else lm.softmax_tpl
        table.lookup_style = self.EMBEDDING_LOOKUP_STYLE
        if not self.SEPARATE_EMBEDDING:
            lm.softmax_tpl.use_bias = True  # praxis's shared softmax has a bias
        atten = model_params.block_config(lm.stacked_transformer_tpl).tr_atten_tpl
        atten.query_scale = QueryScale.PER_DIM
        return model

    def _refuse_unsupported(self) -> None:
        """Pax's model knobs that have no counterpart here stop with the reason."""
        name = type(self).__qualname__
        refused = {
            "USE_FP8": (self.USE_FP8, "fp8 matmuls are not supported; train in bfloat16"),
            "RELATIVE_BIAS": (
                self.RELATIVE_BIAS,
                "T5's relative position bias comes with the encoder-decoder models; use "
                "USE_ROTARY_POSITION_EMB or the absolute position embeddings",
            ),
            "NORM_POLICY": (
                self.NORM_POLICY != "pre",
                f"only 'pre' (norms before each sub-layer) is built, got {self.NORM_POLICY!r}",
            ),
            "EMBEDDING_LOOKUP_STYLE": (
                self.EMBEDDING_LOOKUP_STYLE not in ("index", "matmul"),
                f"use 'index' or 'matmul', got {self.EMBEDDING_LOOKUP_STYLE!r}",
            ),
        }
        for knob, (bad, why) in refused.items():
            if bad:
                raise KnobError(f"{name}.{knob}: {why}.")

    def validate(self) -> None:
        super().validate()
        self._refuse_unsupported()
        if (
            self.DIMS_PER_HEAD is not None
            and self.NUM_HEADS * self.DIMS_PER_HEAD != self.MODEL_DIMS
        ):
            raise KnobError(
                f"{type(self).__qualname__}: NUM_HEADS={self.NUM_HEADS} x DIMS_PER_HEAD="
                f"{self.DIMS_PER_HEAD} != MODEL_DIMS={self.MODEL_DIMS}; set NUM_HEADS to "
                "MODEL_DIMS // DIMS_PER_HEAD."
            )


# Pax's LmCloudSpmd catalogue (paxml/tasks/lm/params/lm_cloud.py), names and sizes kept so step
# times and MFU compare with Pax's published runs. Sizes: 12 * NUM_LAYERS * MODEL_DIMS**2 params
# in the stack plus the 32000 x MODEL_DIMS shared embedding.


class LmCloudSpmdSynthetic(PaxTransformerLm):
    """Pax's LmCloudSpmd settings on uniform random tokens (a fixed-shape benchmark input).

    Beyond PaxTransformerLm: Pax's ``set_default_adam`` schedule
    (``linear_rampup_exponential_decay``: warmup 4000, decay from 4001 to 0.1 x
    peak at 300,000; the LR_LRED_* defaults).
    Leaves set the sizes, PERCORE_BATCH_SIZE and mesh shapes.
    """

    LR_SCHEDULE = LrSchedule.LINEAR_RAMPUP_EXPONENTIAL_DECAY

    def datasets(self) -> list[Any]:
        """One training input: this host's share of PERCORE_BATCH_SIZE x devices."""
        batch_size = self.infeed_batch_size()
        train = config_lib.Config(
            SyntheticLmInput,
            random_tokens=True,
            seq_len=self.MAX_SEQ_LEN,
            vocab_size=self.VOCAB_SIZE,
            batch_size=batch_size,
            seed=self.SEED,
        )
        return [train]


@registry.register
class LmCloudSpmdTest(LmCloudSpmdSynthetic):
    """Pax's small model for a local CPU run: 2 layers of 64 dims; global batch 1 x 4 = 4."""

    PERCORE_BATCH_SIZE = 4
    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = MODEL_DIMS * 4
    DIMS_PER_HEAD = 8
    NUM_HEADS = MODEL_DIMS // DIMS_PER_HEAD  # Pax's NUM_HEADS=None means this.
    ICI_MESH_SHAPE = (1, 1, 1)


@registry.register
class LmCloudSpmd2B(LmCloudSpmdSynthetic):
    """2B params on 4 chips; global batch 8 x 4 = 32."""

    NUM_LAYERS = 18
    MODEL_DIMS = 3072
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = (1, 4, 1)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING


@registry.register
class LmCloudSpmd2BLimitSteps(LmCloudSpmd2B):
    """Pax's LmCloudSpmd2B for 300 steps (the run of Pax's README)."""

    NUM_TRAIN_STEPS = 300


@registry.register
class LmCloudSpmd32B(LmCloudSpmdSynthetic):
    """32B params on 64 chips; global batch 8 x 64 = 512."""

    NUM_LAYERS = 40
    MODEL_DIMS = 8192
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = (1, 16, 4)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_CONTEXT_AND_OUT_PROJ


@registry.register
class LmCloudSpmd64B(LmCloudSpmdSynthetic):
    """64B params on 128 chips; global batch 4 x 128 = 512."""

    NUM_LAYERS = 51
    MODEL_DIMS = 10240
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = (1, 16, 8)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_CONTEXT_AND_OUT_PROJ


@registry.register
class LmCloudSpmd128B(LmCloudSpmdSynthetic):
    """128B params on 256 chips; global batch 4 x 256 = 1024."""

    NUM_LAYERS = 71
    MODEL_DIMS = 12288
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = (1, 64, 4)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING


@registry.register
class LmCloudSpmd256B(LmCloudSpmdSynthetic):
    """256B params on 512 chips; global batch 4 x 512 = 2048."""

    NUM_LAYERS = 80
    MODEL_DIMS = 16384
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = (1, 64, 8)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING


@registry.register
class LmCloudSpmd512B(LmCloudSpmdSynthetic):
    """512B params on 1024 chips; global batch 4 x 1024 = 4096."""

    NUM_LAYERS = 102
    MODEL_DIMS = 20480
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = (1, 64, 16)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING


@registry.register
class LmCloudSpmd1024B(LmCloudSpmdSynthetic):
    """1024B params on 2048 chips; global batch 2 x 2048 = 4096."""

    NUM_LAYERS = 142
    MODEL_DIMS = 24576
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    PERCORE_BATCH_SIZE = 2
    ICI_MESH_SHAPE = (1, 256, 8)
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING


@registry.register
class LmCloudSpmdMultislice2B(LmCloudSpmd2B):
    """LmCloudSpmd2B on two 4-chip slices: 'replica' over DCN; global batch 16 x 8 = 128."""

    PERCORE_BATCH_SIZE = 16
    DCN_MESH_SHAPE = (2, 1, 1)


# Pax's pipelined LmCloudSpmd experiments: the layers split over a 'stage' mesh axis.


class LmCloudSpmdPipeline(LmCloudSpmdSynthetic):
    """Pax's ``LmCloudSpmdPipeline``: mesh axes ('stage', 'replica', 'data', 'mdl').

    Leaves set NUM_STAGES (the devices on 'stage'), MICROBATCH_SIZE, the sizes and the mesh.
    """

    MESH_AXIS_NAMES = ("stage", "replica", "data", "mdl")
    ICI_MESH_SHAPE = (1, 1, 1, 1)


@registry.register
class LmCloudSpmdPipeline9B(LmCloudSpmdPipeline):
    """9B params, 16 stages x 4-way data parallelism on 64 chips; global batch 8 x 64 = 512.

    128 microbatches of 4 (one example per replica): bubble 15 / 143 = 10%.
    """

    NUM_STAGES = 16
    MICROBATCH_SIZE = 4
    PERCORE_BATCH_SIZE = 8
    NUM_LAYERS = 48
    MODEL_DIMS = 4096
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    FPROP_DTYPE = jnp.float32
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING
    ICI_MESH_SHAPE = (16, 4, 1, 1)


@registry.register
class LmCloudSpmdPipeline175B(LmCloudSpmdPipeline):
    """GPT-3 175B shapes (96 layers of 96 heads x 128, sequences of 2048) in 8 stages across
    8 hosts of 16 GPUs, 16-way tensor parallel in each: global batch 0.75 x 128 = 96 in 48
    microbatches of 2 (Pax: "works on 8 hosts * 16 A100s")."""

    MICROBATCH_SIZE = 2
    PERCORE_BATCH_SIZE = 0.75
    NUM_STAGES = 8
    NUM_LAYERS = 96
    MODEL_DIMS = 12288
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 96
    MAX_SEQ_LEN = 2048
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING
    ICI_MESH_SHAPE = (1, 1, 1, 16)
    DCN_MESH_SHAPE = (8, 1, 1, 1)


@knob_group
class Pipeline2BOnTwoSlices(LmCloudSpmd):
    """Preset: LmCloudSpmd2B's sizes in 2 stages across two 4-chip slices (global batch 128)."""

    NUM_STAGES = 2
    PERCORE_BATCH_SIZE = 16
    NUM_LAYERS = 18
    MODEL_DIMS = 3072
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = MODEL_DIMS // 128
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING
    ICI_MESH_SHAPE = (1, 4, 1, 1)
    DCN_MESH_SHAPE = (2, 1, 1, 1)


@registry.register
class LmCloudSpmdPipelineMultislice2B(Pipeline2BOnTwoSlices, LmCloudSpmdPipeline):
    """LmCloudSpmd2B pipelined over two 4-chip slices: the 2 stages cross DCN.

    Global batch 16 x 8 = 128 in 32 microbatches of 4; each slice splits its
    stage's work 4 ways over 'replica'. Only the activations of one microbatch
    cross DCN per iteration (the gradient reduction stays inside each slice).
    """

    MICROBATCH_SIZE = 4


@registry.register
class LmCloudSpmdPipelineMultislice2BCircular(Pipeline2BOnTwoSlices, LmCloudSpmdPipeline):
    """LmCloudSpmdPipelineMultislice2B, circular: 3 virtual stages of 3 layers per slice.

    16 microbatches of 8: bubble 1 / (3 x 16 + 1) = 2% instead of 1 / 17 = 6%.
    """

    CIRCULAR_REPEAT = 3
    MICROBATCH_SIZE = 8


# Pax's data-parallel (pmap) LM: here one 'data' axis over every device of the job.


@registry.register
class LmCloudTransformerAdam(LmCloudSpmdSynthetic):
    """Pax's pmap Transformer LM (``TransformerLmPmapAdam``): 32 layers of 16 heads x 64,
    ReLU, separate q/k/v weights without biases, float32, unscanned, trained data-parallel
    over all of the job's devices (ICI_MESH_SHAPE (1, -1, 1)): global batch 16 x devices.

    Pax's pmap keeps a whole replica on every device; the same holds here
    (DATA_PARALLEL_RULES: only the batch is split).
    """

    NUM_LAYERS = 32
    MODEL_DIMS = 1024
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 16
    DIMS_PER_HEAD = None
    ACTIVATION_CLS = Activation.RELU
    COMBINE_QKV = False
    SOFTMAX_CAP_LOGITS = 0.0
    USE_REPEATED_LAYER = False
    FPROP_DTYPE = jnp.float32
    LEARNING_RATE = 1e-3
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = (1, -1, 1)
    LOGICAL_AXIS_RULES = DATA_PARALLEL_RULES
    EMBEDDING_LOOKUP_STYLE = "index"  # praxis's default: pmap models get no sharding annotations.


@registry.register
class LmCloudTransformerAdamTest(LmCloudTransformerAdam):
    """LmCloudTransformerAdam with 2 layers."""

    NUM_LAYERS = 2


@registry.register
class LmCloudTransformerAdamLimitSteps(LmCloudTransformerAdam):
    """LmCloudTransformerAdam with 10 layers, for 2000 steps."""

    NUM_LAYERS = 10
    NUM_TRAIN_STEPS = 2000


# Pax's MLP experiments (registered in Pax's lm_cloud module): 8-way data parallel.


@registry.register
class LargeMlp(ClassificationModelAdam):
    """Pax's 8-layer MLP with large hidden dims (4096 -> 7168 -> 4096), on 8 devices."""

    NUM_LAYER = 8
    INPUT_DIM = 4096
    OUTPUT_DIM = 4096
    HIDDEN_DIM = 7168
    MESH_SHAPE = (8, 1, 1)
    MLP_WEIGHT_SHARDING = (-1, -1)
    SOFTMAX_WEIGHT_SHARDING = (-1, -1)


@registry.register
class SmallMlp(ClassificationModelAdam):
    """Pax's 8-layer MLP with small hidden dims (1024 throughout), on 8 devices."""

    NUM_LAYER = 8
    INPUT_DIM = 1024
    OUTPUT_DIM = 1024
    HIDDEN_DIM = 1024
    MESH_SHAPE = (8, 1, 1)
    MLP_WEIGHT_SHARDING = (-1, -1)
    SOFTMAX_WEIGHT_SHARDING = (-1, -1)
