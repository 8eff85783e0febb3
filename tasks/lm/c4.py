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

import jax
import jax.numpy as jnp
import seqio

from paxlite import experiment_registry
from praxis_lite import config as config_lib
from praxis_lite import schedules
from praxis_lite.layers.embedding_softmax import PositionalEmbedding
from praxis_lite.seqio_input import (
    SeqIOInput,
    lm_preprocessors,
    make_vocabulary,
    register_task_once,
)
from praxis_lite.sharding import FSDP_AND_TENSOR_PARALLEL_RULES
from tasks.lm.lm_cloud import LmCloudSpmd

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


class C4SpmdLmBase(LmCloudSpmd):
    """Family base of decoder-only LMs on C4 with Adam (Pax's ``C4SpmdAdam``).

    Pax's architecture choices: GELU, sinusoidal absolute positions (no RoPE),
    128 dims per head, one combined q/k/v weight, no attention biases
    (feed-forward biases kept), attention logits capped at 50 and softmax logits
    at 30, weights split over 'data' (FSDP) and 'mdl' (tensor parallelism).
    Training reads the 'train' split (shuffled, packed if PACKED_INPUT); eval
    reads one epoch of 'validation' (not packed), padded so every host stops
    after the same batch. The learning rate ramps up linearly for
    LR_WARMUP_STEPS, then decays exponentially (Pax's
    ``linear_rampup_exponential_decay``); LR_COS_MIN_RATIO is not used.

    Attributes (knobs, beyond LmCloudSpmd's):
      VOCAB_PATH: the SentencePiece model (Pax's, on GCS, by default; a local path works).
      C4_TASK_NAME: the SeqIO task name the C4 task is registered under.
      PACKED_INPUT: pack several documents' pieces into each training row.
      LR_DECAY_START: step at which the exponential decay starts (>= LR_WARMUP_STEPS).
      LR_DECAY_END: step at which it reaches LR_DECAY_MIN_RATIO of the peak.
      LR_DECAY_MIN_RATIO: the final learning rate as a fraction of LEARNING_RATE.
    """

    VOCAB_PATH: str = GPT_SPM_PATH
    C4_TASK_NAME: str = C4_TASK_NAME
    PACKED_INPUT: bool = True
    LR_DECAY_START: int = 4001
    LR_DECAY_END: int = 300_000
    LR_DECAY_MIN_RATIO: float = 0.1

    VOCAB_SIZE = 32000
    MAX_SEQ_LEN = 1024
    DIMS_PER_HEAD = 128
    USE_ROTARY_POSITION_EMB = False
    COMBINE_QKV = True
    USE_ATTENTION_BIAS = False
    ATTEN_LOGIT_CAP = 50.0
    SOFT_CAP_LOGITS = 30.0
    USE_REPEATED_LAYER = True
    LOGICAL_AXIS_RULES = FSDP_AND_TENSOR_PARALLEL_RULES
    LEARNING_RATE = 1e-3
    ADAM_BETA1 = 0.9
    ADAM_BETA2 = 0.99
    ADAM_EPSILON = 1e-6
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_WARMUP_STEPS = 4000

    def model(self) -> Any:
        model = super().model()
        if not self.USE_ROTARY_POSITION_EMB:  # Pax's default: sinusoidal absolute positions.
            model.lm_tpl.position_emb_tpl = PositionalEmbedding.HParams.config()
        return model

    def task(self) -> Any:
        task_cfg = super().task()
        task_cfg.learner.optimizer.lr_schedule = config_lib.Config(
            schedules.LinearRampupExponentialDecay,
            warmup_steps=self.LR_WARMUP_STEPS,
            decay_start=self.LR_DECAY_START,
            decay_end=self.LR_DECAY_END,
            min_ratio=self.LR_DECAY_MIN_RATIO,
            max=1.0,
        )
        return task_cfg

    def datasets(self) -> list[Any]:
        """Registers the C4 task with VOCAB_PATH; returns the train and validation inputs."""
        register_c4_task(self.C4_TASK_NAME, vocab_path=self.VOCAB_PATH)
        common = dict(
            mixture_name=self.C4_TASK_NAME,
            task_feature_lengths={"targets": self.MAX_SEQ_LEN},
            batch_size=self.per_host_batch_size(jax.device_count(), jax.process_count()),
            model_vocab_size=self.VOCAB_SIZE,
            seed=self.SEED,
        )
        train = config_lib.Config(
            SeqIOInput, split_name="train", feature_converter_pack=self.PACKED_INPUT, **common
        )
        evaluation = config_lib.Config(
            SeqIOInput,
            name="validation",
            split_name="validation",
            is_training=False,
            reset_for_eval=True,
            **common,
        )
        return [train, evaluation]


@experiment_registry.register
class C4Spmd1BAdam4Replicas(C4SpmdLmBase):
    """GPT-3-style 1B-parameter LM on 4 chips: global batch 1 x 4 x 1 x 32 = 128."""

    NUM_LAYERS = 13
    MODEL_DIMS = 2560
    HIDDEN_DIMS = 2560 * 4
    NUM_HEADS = 20
    PERCORE_BATCH_SIZE = 32
    MAX_SEQ_LEN = 1024
    VOCAB_SIZE = 32000
    FPROP_DTYPE = jnp.bfloat16
    SUMMARY_INTERVAL_STEPS = 10
    ICI_MESH_SHAPE = (1, 4, 1)
