"""T5 1.1 under T5X's names, sizes and pretraining setup.

Sizes are T5X's ``t5x/examples/t5/t5_1_1/{small,base,large,xl,xxl}.gin``; the setup is
``t5_1_1/base.gin`` + ``configs/runs/pretrain.gin``: vocabulary 32128, bfloat16
activations with float32 parameters and logits, z-loss 1e-4, the loss summed over the
target tokens, Adafactor (T5X's), learning rate ``1 / sqrt(max(step, 10000))``, global
batch 128, C4 span corruption (``c4_v220_span_corruption``, inputs 512 and targets 114
tokens). Meshes as T5X's examples partition them: data parallel for small to large,
model parallel for xl (2 ways) and xxl (8 ways, as T5X's xxl runs)::

    paxlite --exp=tasks.t5.t5_1_1.T5v11Base --job_log_dir=gs://bucket/t5_base \\
        --tfds_data_dir=gs://bucket/tfds --set VOCAB_PATH=/data/t5_spm.model
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from paxlite.experiments import registry
from tasks.lm.knob_groups import LoopKnobs, knob_group
from tasks.t5.c4_span_corruption import (
    C4_SPAN_CORRUPTION_TASK_NAME,
    T5_VOCAB_PATH,
    register_c4_span_corruption_task,
)
from tasks.t5.t5_base import T5Knobs, check_t5_mesh, with_t5x_beam_rules
from tasks.t5.t5x_setup import T5xDataKnobs, T5xTrainKnobs

#: T5's SentencePiece EOS id (0 is padding and the decoder's start).
T5_EOS_ID = 1


@knob_group
class T5v11Spmd(T5Knobs, T5xTrainKnobs, T5xDataKnobs, LoopKnobs):
    """T5 1.1's family: T5X's model, learner and datasets (``t5_1_1/base.gin``,
    ``runs/pretrain.gin``). Leaves set the sizes and the mesh.

    Attributes (knobs, beyond the groups'):
      VOCAB_PATH: T5's SentencePiece model (32000 pieces + 100 extra ids), read by the
        C4 span corruption task; a local copy works.
    """

    VOCAB_PATH: str = T5_VOCAB_PATH
    VOCAB_SIZE = 32128
    DIMS_PER_HEAD = 64
    FPROP_DTYPE = jnp.bfloat16
    Z_LOSS_WEIGHT = 1e-4
    MIXTURE_OR_TASK_NAME = C4_SPAN_CORRUPTION_TASK_NAME
    TASK_FEATURE_LENGTHS = {"inputs": 512, "targets": 114}  # noqa: RUF012
    NUM_TRAIN_STEPS = 1_000_000
    CHECKPOINT_EVERY_N_STEPS = 1000
    EVAL_INTERVAL_STEPS = 1000
    ICI_MESH_SHAPE = (1, 8, 1)
    PERCORE_BATCH_SIZE = 16  # x 8 devices: T5X's BATCH_SIZE 128.

    def validate(self) -> None:
        super().validate()
        check_t5_mesh(self)

    def register_default_task(self) -> None:
        """C4 span corruption with VOCAB_PATH, when MIXTURE_OR_TASK_NAME names it."""
        if self.MIXTURE_OR_TASK_NAME == C4_SPAN_CORRUPTION_TASK_NAME:
            register_c4_span_corruption_task(vocab_path=self.VOCAB_PATH)

    def task(self) -> Any:
        """The task; decoding stops at T5's EOS (1) and, with DECODE_VALIDATION, runs with
        every eval (T5X's ``infer_eval`` at each ``eval_period``)."""
        task = with_t5x_beam_rules(self.single_task(self.model(), self.learner()))
        task.decoder.eos_token_id = T5_EOS_ID
        if self.DECODE_VALIDATION:
            task.decode_interval_steps = self.EVAL_INTERVAL_STEPS or self.NUM_TRAIN_STEPS
        return task


@registry.register
class T5v11Small(T5v11Spmd):
    """``t5_1_1/small.gin``: 8 + 8 layers, 512 dims, 6 heads, MLP 1024 (77M parameters)."""

    NUM_ENCODER_LAYERS = 8
    NUM_DECODER_LAYERS = 8
    MODEL_DIMS = 512
    NUM_HEADS = 6
    HIDDEN_DIMS = 1024


@registry.register
class T5v11Base(T5v11Spmd):
    """``t5_1_1/base.gin``: 12 + 12 layers, 768 dims, 12 heads, MLP 2048 (248M)."""

    NUM_ENCODER_LAYERS = 12
    NUM_DECODER_LAYERS = 12
    MODEL_DIMS = 768
    NUM_HEADS = 12
    HIDDEN_DIMS = 2048


@registry.register
class T5v11Large(T5v11Spmd):
    """``t5_1_1/large.gin``: 24 + 24 layers, 1024 dims, 16 heads, MLP 2816 (783M)."""

    NUM_ENCODER_LAYERS = 24
    NUM_DECODER_LAYERS = 24
    MODEL_DIMS = 1024
    NUM_HEADS = 16
    HIDDEN_DIMS = 2816


@registry.register
class T5v11Xl(T5v11Spmd):
    """``t5_1_1/xl.gin``: 24 + 24 layers, 2048 dims, 32 heads, MLP 5120 (2.85B); 2-way
    model parallel."""

    NUM_ENCODER_LAYERS = 24
    NUM_DECODER_LAYERS = 24
    MODEL_DIMS = 2048
    NUM_HEADS = 32
    HIDDEN_DIMS = 5120
    ICI_MESH_SHAPE = (1, 8, 2)
    PERCORE_BATCH_SIZE = 8  # x 16 devices: 128.


@registry.register
class T5v11Xxl(T5v11Spmd):
    """``t5_1_1/xxl.gin``: 24 + 24 layers, 4096 dims, 64 heads, MLP 10240 (11.1B); 8-way
    model parallel."""

    NUM_ENCODER_LAYERS = 24
    NUM_DECODER_LAYERS = 24
    MODEL_DIMS = 4096
    NUM_HEADS = 64
    HIDDEN_DIMS = 10240
    ICI_MESH_SHAPE = (1, 4, 8)
    PERCORE_BATCH_SIZE = 4  # x 32 devices: 128.
