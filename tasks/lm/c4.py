"""C4 language modelling as in Pax: the SeqIO task over TFDS ``c4/en:3.0.1`` and its experiments.

The task (Pax's ``c4_lm_v301_gpt``) is registered when an experiment's
``datasets()`` runs, with the experiment's knobs, so the vocabulary is a knob::

    paxlite --exp=C4Spmd1BAdam4Replicas --job_log_dir=/tmp/c4 \\
        --tfds_data_dir=/data/tfds --set VOCAB_PATH=/data/c4_en_301_5Mexp2_spm.model

``--tfds_data_dir`` names the directory holding ``c4/en/3.0.1`` (prepared TFDS
files); without it TFDS's default (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``)
is used. Nothing is ever downloaded: missing data is an error that says where it
was looked for.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import seqio

from paxlite.experiments import registry
from praxis_lite import config as config_lib
from praxis_lite.inputs.seqio_input import SeqIOInput
from praxis_lite.inputs.seqio_tasks import lm_preprocessors, make_vocabulary, register_task_once
from praxis_lite.layers.attentions import QueryScale
from praxis_lite.layers.repeats import AutodiffCheckpointType
from tasks.lm import model_params
from tasks.lm.knob_groups import LrSchedule, knob_group
from tasks.lm.lm_cloud import LmCloudSpmd, LmCloudSpmdSynthetic, PaxTransformerLm

C4_TFDS_NAME = "c4/en:3.0.1"
C4_TASK_NAME = "c4_lm_v301_gpt"
GPT_SPM_PATH = "gs://mlperf-llm-public2/vocab/c4_en_301_5Mexp2_spm.model"
GPT_EOS_ID = 1


def register_c4_task(
    name: str = C4_TASK_NAME,
    *,
    vocab_path: str = GPT_SPM_PATH,
    tfds_name: str = C4_TFDS_NAME,
    shuffle_buffer_size: int = 100_000,
    concat_batch_size: int = 128,
) -> seqio.Task:
    """Registers the C4 LM task (idempotent; new settings replace the old registration).

    Pax's recipe: ``text`` -> targets, SentencePiece tokens, the tokens of every
    ``concat_batch_size`` documents concatenated, split into pieces of the targets
    length minus one, and EOS appended. Registering reads no file.
    """
    settings = dict(
        vocab_path=vocab_path,
        tfds_name=tfds_name,
        shuffle_buffer_size=shuffle_buffer_size,
        concat_batch_size=concat_batch_size,
    )

    def make_task(task_name: str) -> seqio.Task:
        vocabulary = make_vocabulary(vocab_path)
        return seqio.Task(
            task_name,
            source=seqio.TfdsDataSource(tfds_name=tfds_name),
            preprocessors=lm_preprocessors("text", concat_batch_size),
            output_features={"targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)},
            metric_fns=[],
            shuffle_buffer_size=shuffle_buffer_size,
        )

    return register_task_once(name, settings, make_task)


class C4SpmdLmBase(PaxTransformerLm):
    """Family base of Pax's decoder-only LMs on C4 with Adam (Pax's ``C4SpmdAdam``).

    Beyond PaxTransformerLm: token lookup as a one-hot matmul (Pax's
    ``TransformerLmSpmdAdam``) and, by default, Pax's Adam recipe: learning rate
    1e-3 (betas 0.9/0.99, epsilon 1e-6, each tensor's raw update capped at RMS 1,
    gradients clipped at global norm 5: the family defaults), Pax's
    ``linear_rampup_exponential_decay`` schedule (the LR_LRED_* knobs: ramped up
    over 4000 steps, decayed from step 4001 to 0.1 x peak at step 300,000).
    Training reads the 'train' split (shuffled, packed if PACKED_INPUT); eval
    reads one epoch of 'validation' (not packed), padded so every host stops
    after the same batch.

    Attributes (knobs, beyond LmCloudSpmd's):
      VOCAB_PATH: the SentencePiece model (Pax's, on GCS, by default; a local path works).
      TRAIN_MIXTURE: the SeqIO task the C4 task is registered under (with VOCAB_PATH) and
        training reads ('train' split).
      EVAL_MIXTURE: a registered SeqIO task or mixture whose 'validation' split eval
        reads; None: TRAIN_MIXTURE's.
      PACKED_INPUT: pack several documents' pieces into each training row.
      TRAINING_SEED: seed of the training input's shuffle (Pax's 9876); the eval
        input reads in order.
      TRAINING_NUM_BATCHES_TO_SKIP: the training stream starts after this many
        batches (None: none), e.g. to step past data that made a run diverge.
      PERCORE_EVAL_BATCH_SIZE: eval examples per device (None: PERCORE_BATCH_SIZE).
    """

    VOCAB_PATH: str = GPT_SPM_PATH
    TRAIN_MIXTURE: str = C4_TASK_NAME
    EVAL_MIXTURE: str | None = None
    PACKED_INPUT: bool = True
    TRAINING_SEED: int = 9876
    TRAINING_NUM_BATCHES_TO_SKIP: int | None = None
    PERCORE_EVAL_BATCH_SIZE: float | None = None
    LR_SCHEDULE = LrSchedule.LINEAR_RAMPUP_EXPONENTIAL_DECAY

    LEARNING_RATE = 1e-3
    EMBEDDING_LOOKUP_STYLE = "matmul"
    FPROP_DTYPE = jnp.float32
    USE_REPEATED_LAYER = False
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_DOT_FOR_MLPERF_200B
    CHECKPOINT_EVERY_N_STEPS = 1000
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = (1, 4, 2)

    def datasets(self) -> list[Any]:
        """Registers the C4 task with VOCAB_PATH; returns the train and validation inputs."""
        register_c4_task(self.TRAIN_MIXTURE, vocab_path=self.VOCAB_PATH)
        common = dict(
            task_feature_lengths={"targets": self.MAX_SEQ_LEN},
            model_vocab_size=self.VOCAB_SIZE,
            data_flag="--tfds_data_dir=DIR",
        )
        train = config_lib.Config(
            SeqIOInput,
            mixture_name=self.TRAIN_MIXTURE,
            split_name="train",
            feature_converter_pack=self.PACKED_INPUT,
            batch_size=self.infeed_batch_size(),
            seed=self.TRAINING_SEED,
            num_batches_to_skip=self.TRAINING_NUM_BATCHES_TO_SKIP or 0,
            **common,
        )
        evaluation = config_lib.Config(
            SeqIOInput,
            name="validation",
            mixture_name=self.EVAL_MIXTURE or self.TRAIN_MIXTURE,
            split_name="validation",
            is_training=False,
            reset_for_eval=True,
            batch_size=self.infeed_batch_size(self.PERCORE_EVAL_BATCH_SIZE),
            seed=self.SEED,
            **common,
        )
        return [train, evaluation]


# Pax's C4 catalogue (paxml/tasks/lm/params/c4.py), names and sizes kept so step times and MFU
# compare with Pax's published runs. Global batch: PERCORE_BATCH_SIZE x chips.


@knob_group
class Bf16Scanned(LmCloudSpmd):
    """Preset: what Pax's sized C4 leaves restate: bfloat16 compute, scanned layers,
    full remat (SAVE_NOTHING), a summary every 10 steps."""

    FPROP_DTYPE = jnp.bfloat16
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING
    SUMMARY_INTERVAL_STEPS = 10


@registry.register
class C4SpmdAdam(C4SpmdLmBase):
    """Pax's registered C4 base: 24 layers of 32 heads x 64, vocabulary 32128, float32,
    unscanned layers with Pax's MLPerf-200B remat, on 8 chips: global batch 1 x 8 = 8."""

    NUM_LAYERS = 24
    NUM_HEADS = 32
    MODEL_DIMS = 2048
    HIDDEN_DIMS = MODEL_DIMS * 4
    DIMS_PER_HEAD = None
    VOCAB_SIZE = 32128


@registry.register
class LmCloudSpmdAdam(LmCloudSpmdSynthetic):
    """Pax's LmCloudSpmdAdam (registered in Pax's c4 module): 2 layers of 16 heads x 128
    on synthetic tokens, float32, unscanned, 8 chips: global batch 16 x 8 = 128."""

    NUM_LAYERS = 2
    MODEL_DIMS = 2048
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 16
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = (1, 4, 2)
    FPROP_DTYPE = jnp.float32
    USE_REPEATED_LAYER = False
    LEARNING_RATE = 1e-3


@registry.register
class LmCloudSpmdAdamLimitSteps(LmCloudSpmdAdam):
    """Pax's LmCloudSpmdAdam for 4000 steps."""

    NUM_TRAIN_STEPS = 4000


@registry.register
class C4Spmd1BAdam4Replicas(Bf16Scanned, C4SpmdLmBase):
    """GPT-3-style 1B-parameter LM on 4 chips: global batch 1 x 4 x 1 x 32 = 128."""

    NUM_LAYERS = 13
    MODEL_DIMS = 2560
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 20
    PERCORE_BATCH_SIZE = 32
    ICI_MESH_SHAPE = (1, 4, 1)
    TPU_TARGET = "v4-8"  # Pax's README.


@registry.register
class C4Spmd1B(C4Spmd1BAdam4Replicas):
    """``tasks.lm.c4.C4Spmd1B``: the name users and docs give C4Spmd1BAdam4Replicas (same run)."""


@registry.register
class C4Spmd1BAdam4ReplicasLimitSteps(C4Spmd1BAdam4Replicas):
    """Pax's C4Spmd1BAdam4Replicas for 15,000 steps."""

    NUM_TRAIN_STEPS = 15_000


@registry.register
class C4Spmd2BAdam4Replicas(Bf16Scanned, C4SpmdLmBase):
    """GPT-3-style 2B-parameter LM on 4 chips: global batch 1 x 4 x 1 x 32 = 128."""

    NUM_LAYERS = 18
    MODEL_DIMS = 3072
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 24
    PERCORE_BATCH_SIZE = 32
    ICI_MESH_SHAPE = (1, 4, 1)


@registry.register
class C4Spmd16BAdam32Replicas(Bf16Scanned, C4SpmdLmBase):
    """GPT-3-style 16B-parameter LM on 32 chips: global batch 1 x 16 x 2 x 16 = 512."""

    NUM_LAYERS = 36
    MODEL_DIMS = 6144
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 48
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = (1, 16, 2)
    TPU_TARGET = "v4-64"  # Pax's README.


@registry.register
class C4Spmd32BAdam64Replicas(Bf16Scanned, C4SpmdLmBase):
    """GPT-3-style 32B-parameter LM on 64 chips: global batch 1 x 16 x 4 x 8 = 512."""

    NUM_LAYERS = 40
    MODEL_DIMS = 8192
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 64
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = (1, 16, 4)


class C4SpmdGpt3AdamOrgHP(C4SpmdLmBase):
    """GPT-3 175B with the paper's hyperparameters (Pax's ``C4SpmdGpt3AdamOrgHP``).

    As in Pax (matched against Megatron-LM): 96 layers of 96 heads x 128, a
    learned position table (TRAINABLE_POSITION_EMB) and unscaled token
    embeddings, attention biases, no logit caps, tanh-approximated GELU, layer
    norms with epsilon LAYERNORM_EPSILON, no per-dim query scale, no softmax
    bias; Adam(W) with learning rate 6e-5, betas 0.9/0.95, epsilon 1e-8, weight
    decay 0.1, gradients clipped at 1, and a cosine decay to 0.1 x peak over
    steps 266..108600 after 265 warmup steps (steps of a 1.5k global batch); no
    update capping. Pax's Gaussian(0.006) weight init is not a knob here: the
    layers keep their own initializers.

    Attributes (knobs, beyond C4SpmdLmBase's):
      LAYERNORM_EPSILON: epsilon of every layer norm.
    """

    LAYERNORM_EPSILON: float = 1e-5
    TARGET_LOG_PPLX = 2.69
    TRAINABLE_POSITION_EMB = True

    MAX_SEQ_LEN = 2048
    NUM_LAYERS = 96
    MODEL_DIMS = 12288
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 96
    VOCAB_SIZE = 50257
    USE_ATTENTION_BIAS = True
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP_LOGITS = 0.0

    LEARNING_RATE = 6e-5
    WEIGHT_DECAY = 0.1
    ADAM_BETA2 = 0.95
    ADAM_EPSILON = 1e-8
    ADAM_CLIP_THRESHOLD = -1.0
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_SCHEDULE = LrSchedule.LINEAR_RAMPUP_COSINE_DECAY
    LR_COS_WARMUP = 265
    LR_COS_DECAY_START = 266
    LR_COS_DECAY_END = 108_600

    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = AutodiffCheckpointType.SAVE_NOTHING
    EVAL_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 100

    def model(self) -> Any:
        model = super().model()
        lm = model.lm_tpl
        if self.SEPARATE_EMBEDDING:
            lm.embedding_tpl.scale_sqrt_depth = False
        else:
            lm.softmax_tpl.scale_sqrt_depth = False
            lm.softmax_tpl.use_bias = False
        block = model_params.block_config(lm.stacked_transformer_tpl)
        block.tr_atten_tpl.query_scale = QueryScale.RSQRT_HEAD_DIM
        block.tr_fflayer_tpl.activation_tpl.approximate = True
        for norm in (block.ln_tpl, block.tr_fflayer_tpl.ln_tpl, lm.final_ln_tpl):
            norm.epsilon = self.LAYERNORM_EPSILON
        return model


@registry.register
class C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas(C4SpmdGpt3AdamOrgHP):
    """GPT-3 175B in float32 on 1536 chips: global batch 1 x 64 x 24 x 1 = 1536.

    Pax pads the vocabulary to 51200, which GSPMD splits unevenly over the
    24-way 'mdl' axis (shards of 2134 rows); jit here wants even splits, so the
    vocabulary is 24 x 2134 = 51216: Pax's shard shape.
    """

    VOCAB_SIZE = 51216
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = (1, 64, 24)
    FPROP_DTYPE = jnp.float32
    CHECKPOINT_MAX_TO_KEEP = 100
    EVAL_INTERVAL_STEPS = 25
    SUMMARY_INTERVAL_STEPS = 1


# Pax's pipelined C4 experiments: mesh axes ('stage', 'replica', 'data', 'mdl').


@knob_group
class PipelineMesh(LmCloudSpmd):
    """Preset: Pax's pipelined C4 runs: mesh axes ('stage', 'replica', 'data', 'mdl'),
    the embedding table split over ('replica', 'data')."""

    MESH_AXIS_NAMES = ("stage", "replica", "data", "mdl")
    EMB_W_DATA_DIMS = ("replica", "data")


@registry.register
class C4SpmdPipelineAdam(PipelineMesh, C4SpmdAdam):
    """Pax's registered pipelined C4 base: C4SpmdAdam's model in 2 stages on 8 chips,
    global batch 1 x 8 = 8 in 4 microbatches of 2."""

    NUM_STAGES = 2
    MICROBATCH_SIZE = 2
    ICI_MESH_SHAPE = (2, 1, 2, 2)


@knob_group
class Gpt3SmallSizes(PipelineMesh):
    """Preset: Pax's "small GPT-3" sizes and learning rate, pipelined over a 'stage' mesh axis.

    24 layers, model 3072, 24 heads of 128, vocabulary 51200 (Pax's own padding of
    50257, which splits over a 4-way 'mdl' axis), bfloat16, learning rate 2e-4.
    """

    NUM_LAYERS = 24
    NUM_HEADS = 24
    MODEL_DIMS = 3072
    HIDDEN_DIMS = MODEL_DIMS * 4
    DIMS_PER_HEAD = 128
    VOCAB_SIZE = 51200
    FPROP_DTYPE = jnp.bfloat16
    LEARNING_RATE = 2.0e-4
    CHECKPOINT_MAX_TO_KEEP = 1000
    EVAL_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 1
    CHECKPOINT_EVERY_N_STEPS = 200


@registry.register
class C4SpmdPipelineGpt3SmallAdam64Replicas(Gpt3SmallSizes, C4SpmdGpt3AdamOrgHP):
    """Pax's "small GPT-3" (24 layers, model 3072, 24 heads of 128) on 64 chips, 4 stages.

    Global batch 8 x 64 = 512 in 32 microbatches of 16 (4 per data shard): bubble
    3 / 35 = 9%. Pax calls it GPT-3 XL (1.3B) but its sizes make 2.9B parameters
    (2.7B in the stack, 0.2B in the 51200-row vocabulary and the 16384-row position
    table). Pax's vocabulary of 50257 does not split over the 4-way 'mdl' axis;
    51200 is Pax's own padding (its 8-chip successor uses it).
    """

    NUM_STAGES = 4
    PERCORE_BATCH_SIZE = 8
    MICROBATCH_SIZE = 16
    ICI_MESH_SHAPE = (4, 1, 4, 4)
    TPU_TARGET = "v4-128"  # Pax's README.


@registry.register
class C4SpmdPipelineGpt3SmallAdam8Replicas(Gpt3SmallSizes, C4SpmdGpt3AdamOrgHP):
    """The same model on 8 chips, 2 stages: global batch 64 x 8 = 512 in 64 microbatches of 8."""

    NUM_STAGES = 2
    PERCORE_BATCH_SIZE = 64
    MICROBATCH_SIZE = 8
    ICI_MESH_SHAPE = (2, 1, 2, 2)
    EVAL_INTERVAL_STEPS = 10
    SUMMARY_INTERVAL_STEPS = 5


@registry.register
class C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas(PipelineMesh, C4SpmdGpt3AdamOrgHP):
    """GPT-3 175B in float32, 8 stages on 768 chips: global batch 2 x 768 = 1536.

    Pax means 192 microbatches of 8, but its class misspells the knob
    (``MICROBATCH_SIAZE``), so Pax runs 768 microbatches of 2 (the inherited
    value); a microbatch of 2 cannot split over the 8 data-parallel devices, which
    jit here refuses, so this runs Pax's intended 8. Vocabulary 51200 split over
    the 12-way 'mdl' axis: 12 x 4267 = 51204 here (Pax's shard shape).
    """

    VOCAB_SIZE = 51204
    PERCORE_BATCH_SIZE = 2
    NUM_STAGES = 8
    MICROBATCH_SIZE = 8
    ICI_MESH_SHAPE = (8, 1, 8, 12)
    FPROP_DTYPE = jnp.float32
    CHECKPOINT_MAX_TO_KEEP = 100
    EVAL_INTERVAL_STEPS = 25
    SUMMARY_INTERVAL_STEPS = 1
    CHECKPOINT_EVERY_N_STEPS = 50


@knob_group
class Gpt3MLPerfHP(PipelineMesh):
    """Preset: Pax's MLPerf GPT-3 reference (``C4SpmdPipelineGpt3AdamMLPerfHP``): float32,
    vocabulary 51200, and the learning rate, warmup and decay end derived from the
    global batch (LEARNING_RATE and LR_COS_* None: see ``LrScheduleKnobs``)."""

    VOCAB_SIZE = 51200
    FPROP_DTYPE = jnp.float32
    SUMMARY_INTERVAL_STEPS = 1
    CHECKPOINT_MAX_TO_KEEP = 100
    LEARNING_RATE = None
    LR_COS_WARMUP = None
    LR_COS_DECAY_START = None
    LR_COS_DECAY_END = None


@registry.register
class C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas(Gpt3MLPerfHP, C4SpmdGpt3AdamOrgHP):
    """MLPerf GPT-3, 8 stages on 768 chips: global batch 2 x 768 = 1536, microbatches of 8.

    Vocabulary 51200 over the 12-way 'mdl' axis: 12 x 4267 = 51204 here (Pax's shard shape).
    """

    VOCAB_SIZE = 51204
    PERCORE_BATCH_SIZE = 2
    NUM_STAGES = 8
    ICI_MESH_SHAPE = (8, 1, 8, 12)
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 16
    CHECKPOINT_EVERY_N_STEPS = 32


@registry.register
class C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas(Gpt3MLPerfHP, C4SpmdGpt3AdamOrgHP):
    """MLPerf GPT-3, 8 stages on 512 chips: global batch 4 x 512 = 2048, microbatches of 8."""

    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 8
    ICI_MESH_SHAPE = (8, 1, 8, 8)
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 12
    CHECKPOINT_EVERY_N_STEPS = 24


@registry.register
class C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas(Gpt3MLPerfHP, C4SpmdGpt3AdamOrgHP):
    """MLPerf GPT-3, 4 stages on 768 chips: global batch 4 x 768 = 3072, microbatches of 16,
    the microbatch buffer split over the stages (STREAM_IO).

    Vocabulary 51200 over the 12-way 'mdl' axis: 12 x 4267 = 51204 here (Pax's shard shape).
    """

    VOCAB_SIZE = 51204
    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 4
    ICI_MESH_SHAPE = (4, 1, 16, 12)
    MICROBATCH_SIZE = 16
    EVAL_INTERVAL_STEPS = 8
    CHECKPOINT_EVERY_N_STEPS = 16
    STREAM_IO = True


@registry.register
class C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas(Gpt3MLPerfHP, C4SpmdGpt3AdamOrgHP):
    """MLPerf GPT-3, 8 stages on 1024 chips: global batch 4 x 1024 = 4096, microbatches of 8,
    STREAM_IO."""

    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 8
    ICI_MESH_SHAPE = (8, 1, 8, 16)
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 6
    CHECKPOINT_EVERY_N_STEPS = 12
    STREAM_IO = True


@registry.register
class C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas(Gpt3MLPerfHP, C4SpmdGpt3AdamOrgHP):
    """MLPerf GPT-3, 4 stages on 1024 chips: global batch 8 x 1024 = 8192, microbatches of 16,
    STREAM_IO."""

    PERCORE_BATCH_SIZE = 8
    NUM_STAGES = 4
    ICI_MESH_SHAPE = (4, 1, 16, 16)
    MICROBATCH_SIZE = 16
    EVAL_INTERVAL_STEPS = 3
    CHECKPOINT_EVERY_N_STEPS = 6
    STREAM_IO = True


@registry.register
class C4SpmdGpt3L16AdamOrgHP(C4SpmdGpt3AdamOrgHP):
    """GPT-3's shapes with 16 layers, bfloat16, on 64 chips: global batch 3 x 64 = 192.

    Pax's vocabulary (50257) splits unevenly over the 4-way 'mdl' axis, which jit
    here refuses; it is 4 x 12565 = 50260 here (the shard shape GSPMD gives Pax).
    """

    VOCAB_SIZE = 50260
    NUM_LAYERS = 16
    FPROP_DTYPE = jnp.bfloat16
    PERCORE_BATCH_SIZE = 3
    EVAL_INTERVAL_STEPS = 25_000
    ICI_MESH_SHAPE = (1, 16, 4)
