"""Tiny Pax experiments (paxml 1.4 classes, small sizes) whose checkpoints and logits become
fixtures: one per model family of the catalogue. Imported by make_checkpoints.py in the paxml
venv; paxlite's side builds the same models from its own classes of the same Pax names.

Each trains 3 steps on Pax's synthetic data and saves at step 3.
"""

from jax import numpy as jnp
from paxml import experiment_registry
from paxml.tasks.lm.params import c4, lm_cloud
from praxis import layers

STEPS = 3


class _Tiny:
    """Small sizes, float32, one device, a checkpoint at STEPS."""

    NUM_LAYERS = 2
    MODEL_DIMS = 32
    HIDDEN_DIMS = 64
    NUM_HEADS = 4
    DIMS_PER_HEAD = 8
    VOCAB_SIZE = 128
    MAX_SEQ_LEN = 16
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 1, 1]
    FPROP_DTYPE = jnp.float32
    CHECKPOINT_EVERY_N_STEPS = STEPS
    CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING

    def task(self):
        task_p = super().task()
        task_p.train.num_train_steps = STEPS
        return task_p


@experiment_registry.register
class TinyLmCloudSpmd(_Tiny, lm_cloud.LmCloudSpmd):
    """LmCloudSpmd's model: scanned layers, combined q/k/v, logit caps 50/30, per-dim scale,
    sinusoidal positions, shared softmax with a bias."""


@experiment_registry.register
class TinyC4SpmdAdam(_Tiny, lm_cloud.SyntheticDataset, c4.C4SpmdAdam):
    """C4SpmdAdam's model (one-hot matmul lookup, Pax's Adam recipe) as Pax registers it:
    unscanned layers (x_layers_i); 3 layers of 6 heads x 8, vocabulary 96."""

    NUM_LAYERS = 3
    MODEL_DIMS = 48
    HIDDEN_DIMS = 96
    NUM_HEADS = 6
    VOCAB_SIZE = 96
    MAX_SEQ_LEN = 12


@experiment_registry.register
class TinyC4SpmdGpt3AdamOrgHP(_Tiny, lm_cloud.SyntheticDataset, c4.C4SpmdGpt3AdamOrgHP):
    """GPT-3's model: learned positions, biases, no caps, no per-dim scale, no softmax bias,
    tanh GELU, LayerNorm epsilon 1e-5, unscaled embeddings; 2 layers of 5 heads x 8."""

    MODEL_DIMS = 40
    HIDDEN_DIMS = 160
    NUM_HEADS = 5
    VOCAB_SIZE = 112
    TRAINABLE_PE_MAX_SEQ_LEN = 32
