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


class _TinyMoe:
    """Mixture-of-experts feed-forwards (praxis' TransformerFeedForwardMoe, GShard top-2) in
    the MOE_LAYERS of each group of MOE_GROUP layers; a scanned stack repeats the group
    (praxis' StackedTransformerRepeated over a StackedTransformer of MOE_GROUP layers)."""

    NUM_EXPERTS = 4
    NUM_GROUPS = 2
    MOE_GROUP = 2
    MOE_LAYERS = (1,)
    CAPACITY_FACTOR = 1.0
    MOE_GATED = False

    def task(self):
        task_p = super().task()
        stacked = task_p.model.lm_tpl.stacked_transformer_tpl
        if self.USE_REPEATED_LAYER:
            stacked.x_times = self.NUM_LAYERS // self.MOE_GROUP
            stacked = stacked.block
            stacked.num_layers = self.MOE_GROUP
        stacked.moe_layers = list(self.MOE_LAYERS)
        stacked.num_experts = self.NUM_EXPERTS
        stacked.num_groups = self.NUM_GROUPS
        stacked.moe_layer_tpl.unadjusted_expert_capacity_factor = self.CAPACITY_FACTOR
        stacked.moe_layer_tpl.use_gated_activation = self.MOE_GATED
        return task_p


@experiment_registry.register
class TinyLmCloudSpmdMoe(_TinyMoe, _Tiny, lm_cloud.LmCloudSpmd):
    """TinyLmCloudSpmd with 4 layers scanned as 2 groups of (dense, MoE): 4 experts, 2
    routing groups, capacity factor 1 (second choices overflow)."""

    NUM_LAYERS = 4


@experiment_registry.register
class TinyC4SpmdAdamMoe(_TinyMoe, TinyC4SpmdAdam):
    """TinyC4SpmdAdam's model, unscanned, with gated (ReLU) MoE feed-forwards in layers 0
    and 2 of 3, capacity factor 0.5 (4 slots an expert: most second choices dropped)."""

    MOE_GROUP = 3
    MOE_LAYERS = (0, 2)
    CAPACITY_FACTOR = 0.5
    MOE_GATED = True
