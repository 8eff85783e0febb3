"""Pax's multi-slice C4 experiments (paxml/tasks/lm/params/c4_multislice.py).

Each slice is one ICI mesh; DCN_MESH_SHAPE stacks slices along 'replica', so
only the data-parallel gradient reduction crosses the data-centre network.
Global batch: PERCORE_BATCH_SIZE x chips in all slices.
"""

from __future__ import annotations

import jax.numpy as jnp

from paxlite import experiment_registry
from tasks.lm.c4 import C4SpmdGpt3AdamOrgHP, C4SpmdLmBase
from tasks.lm.knob_groups import knob_group
from tasks.lm.lm_cloud import LmCloudSpmd


class C4Spmd22BAdamMaxText(C4SpmdLmBase):
    """Pax's copy of MaxText's 22B model: 48 layers of 24 heads x 256, vocabulary 32768.

    Leaves set the mesh (Pax also registers this base, on its default 8-chip mesh).
    """

    NUM_LAYERS = 48
    MODEL_DIMS = 6144
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 24
    DIMS_PER_HEAD = 256
    VOCAB_SIZE = 32768
    PERCORE_BATCH_SIZE = 16


@experiment_registry.register
class C4Spmd22BAdam1xv4_128(C4Spmd22BAdamMaxText):
    """22B on one v4-128 slice (64 chips): global batch 1 x 64 x 1 x 16 = 1024."""

    ICI_MESH_SHAPE = (1, 64, 1)


@experiment_registry.register
class C4Spmd22BAdam2xv4_128(C4Spmd22BAdamMaxText):
    """22B on two v4-128 slices: global batch 2 x 64 x 16 = 2048."""

    ICI_MESH_SHAPE = (1, 64, 1)
    DCN_MESH_SHAPE = (2, 1, 1)


@experiment_registry.register
class C4Spmd22BAdam4xv4_128(C4Spmd22BAdamMaxText):
    """22B on four v4-128 slices: global batch 4 x 64 x 16 = 4096."""

    ICI_MESH_SHAPE = (1, 64, 1)
    DCN_MESH_SHAPE = (4, 1, 1)


@knob_group
class V4_8Sizes(LmCloudSpmd):
    """Preset: Pax's 0.87B model under the 22B name (16 layers of 8 heads x 256) on v4-8s."""

    NUM_LAYERS = 16
    MODEL_DIMS = 2048
    HIDDEN_DIMS = MODEL_DIMS * 4
    NUM_HEADS = 8
    ICI_MESH_SHAPE = (1, 4, 1)


@experiment_registry.register
class C4Spmd22BAdam1xv4_8(V4_8Sizes, C4Spmd22BAdamMaxText):
    """A 0.87B stand-in under Pax's 22B name, on one v4-8 slice: global batch 4 x 16 = 64.

    16 layers of 8 heads x 256, for trying the multi-slice setup on small slices.
    """


@experiment_registry.register
class C4Spmd22BAdam2xv4_8(V4_8Sizes, C4Spmd22BAdamMaxText):
    """C4Spmd22BAdam1xv4_8 on two v4-8 slices: global batch 2 x 4 x 16 = 128."""

    DCN_MESH_SHAPE = (2, 1, 1)


@experiment_registry.register
class C4Spmd22BAdam4xv4_8(V4_8Sizes, C4Spmd22BAdamMaxText):
    """C4Spmd22BAdam1xv4_8 on four v4-8 slices: global batch 4 x 4 x 16 = 256."""

    DCN_MESH_SHAPE = (4, 1, 1)


@experiment_registry.register
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
    FPROP_DTYPE = jnp.bfloat16
    NUM_TRAIN_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 2000
