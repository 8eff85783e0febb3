"""Pax's multi-slice C4 experiments (paxml/tasks/lm/params/c4_multislice.py).

Each slice is one ICI mesh; DCN_MESH_SHAPE stacks slices along 'replica', so
only the data-parallel gradient reduction crosses the data-centre network.
Global batch: PERCORE_BATCH_SIZE x chips in all slices.
"""

from __future__ import annotations

import jax.numpy as jnp

from paxlite.experiments import registry
from tasks.lm.c4 import Bf16Scanned, C4SpmdGpt3AdamOrgHP, C4SpmdLmBase
from tasks.lm.knob_groups import knob_group


@knob_group
class Model22B(Bf16Scanned):
    """Preset: Pax's copy of MaxText's 22B model: 48 layers of 24 heads x 256, vocabulary
    32768, 16 examples per chip (bfloat16, scanned, full remat)."""

    NUM_LAYERS = 48
    MODEL_DIMS = 6144
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 24
    DIMS_PER_HEAD = 256
    VOCAB_SIZE = 32768
    PERCORE_BATCH_SIZE = 16


@registry.register
class C4Spmd22BAdamMaxText(Model22B, C4SpmdLmBase):
    """The 22B model on Pax's default 8-chip mesh: global batch 8 x 16 = 128."""


@registry.register
class C4Spmd22BAdam1xv4_128(Model22B, C4SpmdLmBase):
    """22B on one v4-128 slice (64 chips): global batch 1 x 64 x 1 x 16 = 1024."""

    ICI_MESH_SHAPE = (1, 64, 1)
    TPU_TARGET = "v4-128"


@registry.register
class C4Spmd22BAdam2xv4_128(Model22B, C4SpmdLmBase):
    """22B on two v4-128 slices: global batch 2 x 64 x 16 = 2048."""

    ICI_MESH_SHAPE = (1, 64, 1)
    TPU_TARGET = "v4-128"
    DCN_MESH_SHAPE = (2, 1, 1)


@registry.register
class C4Spmd22BAdam4xv4_128(Model22B, C4SpmdLmBase):
    """22B on four v4-128 slices: global batch 4 x 64 x 16 = 4096."""

    ICI_MESH_SHAPE = (1, 64, 1)
    TPU_TARGET = "v4-128"
    DCN_MESH_SHAPE = (4, 1, 1)


@registry.register
class C4Spmd22BAdam1xv4_128LimitSteps(C4Spmd22BAdam1xv4_128):
    """C4Spmd22BAdam1xv4_128 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4Spmd22BAdam2xv4_128LimitSteps(C4Spmd22BAdam2xv4_128):
    """C4Spmd22BAdam2xv4_128 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4Spmd22BAdam4xv4_128LimitSteps(C4Spmd22BAdam4xv4_128):
    """C4Spmd22BAdam4xv4_128 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4Spmd22BAdam1xv4_384(Bf16Scanned, C4SpmdLmBase):
    """Pax's 25B variant of the 22B name for v4-384 (192 chips): 24 layers of 24 heads x
    384, vocabulary 32768; global batch 192 x 10 = 1920."""

    NUM_LAYERS = 24
    MODEL_DIMS = 9216
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 24
    DIMS_PER_HEAD = 384
    VOCAB_SIZE = 32768
    PERCORE_BATCH_SIZE = 10
    ICI_MESH_SHAPE = (1, 192, 1)
    TPU_TARGET = "v4-384"


@registry.register
class C4Spmd22BAdam2xv4_384(C4Spmd22BAdam1xv4_384):
    """C4Spmd22BAdam1xv4_384 on two v4-384 slices: global batch 2 x 192 x 10 = 3840."""

    DCN_MESH_SHAPE = (2, 1, 1)


@knob_group
class V4_8Sizes(Model22B):
    """Preset: Pax's 0.87B model under the 22B name (16 layers of 8 heads x 256) on v4-8s."""

    NUM_LAYERS = 16
    MODEL_DIMS = 2048
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 8
    ICI_MESH_SHAPE = (1, 4, 1)
    TPU_TARGET = "v4-8"


@registry.register
class C4Spmd22BAdam1xv4_8(V4_8Sizes, C4SpmdLmBase):
    """A 0.87B stand-in under Pax's 22B name, on one v4-8 slice: global batch 4 x 16 = 64.

    16 layers of 8 heads x 256, for trying the multi-slice setup on small slices.
    """


@registry.register
class C4Spmd22BAdam2xv4_8(V4_8Sizes, C4SpmdLmBase):
    """C4Spmd22BAdam1xv4_8 on two v4-8 slices: global batch 2 x 4 x 16 = 128."""

    DCN_MESH_SHAPE = (2, 1, 1)


@registry.register
class C4Spmd22BAdam4xv4_8(V4_8Sizes, C4SpmdLmBase):
    """C4Spmd22BAdam1xv4_8 on four v4-8 slices: global batch 4 x 4 x 16 = 256."""

    DCN_MESH_SHAPE = (4, 1, 1)


@registry.register
class C4Spmd22BAdam1xv4_8LimitSteps(C4Spmd22BAdam1xv4_8):
    """C4Spmd22BAdam1xv4_8 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4Spmd22BAdam2xv4_8LimitSteps(C4Spmd22BAdam2xv4_8):
    """C4Spmd22BAdam2xv4_8 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4Spmd22BAdam4xv4_8LimitSteps(C4Spmd22BAdam4xv4_8):
    """C4Spmd22BAdam4xv4_8 for 300 steps."""

    NUM_TRAIN_STEPS = 300


@registry.register
class C4SpmdGpt3AdamDataParallel2x16x16(C4SpmdGpt3AdamOrgHP):
    """GPT-3 175B in bfloat16 on two 256-chip slices: global batch 2 x 16 x 16 x 0.5 = 256.

    Pax's run is 100 steps, checkpointed every 2000. Pax's vocabulary (50257)
    splits unevenly over the 16-way 'mdl' axis, which jit here refuses; it is
    rounded up to 16 x 3142 = 50272, the shard shape GSPMD gives Pax.
    """

    VOCAB_SIZE = 50272
    PERCORE_BATCH_SIZE = 0.5
    ICI_MESH_SHAPE = (1, 16, 16)
    DCN_MESH_SHAPE = (2, 1, 1)
    TPU_TARGET = "v5e-256"  # Two 16x16 slices: 2D layouts are v5e's (and v6e's).
    FPROP_DTYPE = jnp.bfloat16
    NUM_TRAIN_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 2000


@registry.register
class C4Spmd32BAdam1xv5_256(Bf16Scanned, C4SpmdLmBase):
    """32B on one v5e-256 slice: 40 layers of 32 heads x 256, vocabulary 32768, sequences
    of 2048; global batch 128 x 2 = 256 (Pax's docstring says 2048; its knobs make 256)."""

    NUM_LAYERS = 40
    MODEL_DIMS = 8192
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 32
    DIMS_PER_HEAD = 256
    VOCAB_SIZE = 32768
    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 2
    ICI_MESH_SHAPE = (1, 128, 1)
    # "v5_256" with 128 devices: v5p-256 (128 chips; v5p names count TensorCores).
    TPU_TARGET = "v5p-256"


@registry.register
class C4Spmd32BAdam2xv5_256(C4Spmd32BAdam1xv5_256):
    """C4Spmd32BAdam1xv5_256 on two v5e-256 slices: global batch 2 x 128 x 2 = 512."""

    DCN_MESH_SHAPE = (2, 1, 1)
