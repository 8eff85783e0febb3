"""Mixture-of-experts LMs at real sizes on synthetic tokens: for sizing, speed and memory.

``Mixtral8x7BSynthetic`` is Mixtral-8x7B's shape (MaxText's ``mixtral-8x7b``: 32 layers of
4096 dims, 32 query and 8 key/value heads of 128, RMSNorm, RoPE, a separate output
projection, every layer 8 SwiGLU experts of 14336 hidden dims, top-2 renormalised, dropless)
on uniform random tokens, for ``--mode=compile --compile_topology=...`` and
``benchmarks/moe_tpu_memory.py``. It is not a Hugging Face model (that is ``HfSyntheticLm``
with a Mixtral config.json): nothing is loaded.
"""

from __future__ import annotations

import jax.numpy as jnp

from paxlite.experiments import registry
from praxis_lite.moe import Dispatch
from praxis_lite.sharding import FSDP_RULES
from tasks.lm.lm_cloud import LmCloudSpmd, LmCloudSpmdSynthetic
from tasks.lm.model_params import Activation, Norm


@registry.register
class Mixtral8x7BSynthetic(LmCloudSpmd):
    """Mixtral-8x7B's shape, 46.7B parameters (12.9B active a token), FSDP over 'data'.

    Defaults as MaxText's train_compile of ``mixtral-8x7b`` for its memory figures: sequence
    4096, one sequence a chip, every layer's activations recomputed (remat 'full' =
    SAVE_NOTHING), float32 weights and Adam state, bfloat16 compute, every weight split over
    the 'data' axis (FSDP: MaxText's ``ici_fsdp_parallelism=-1``), experts not split over an
    axis of their own; each chip routes its own tokens (NUM_GROUPS = chips). Set
    ICI_MESH_SHAPE to the slice's chips (1, chips, 1) and NUM_GROUPS to match.
    """

    NUM_LAYERS = 32
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 14336
    NUM_HEADS = 32
    NUM_KV_HEADS = 8
    DIMS_PER_HEAD = 128
    VOCAB_SIZE = 32000
    MAX_SEQ_LEN = 4096
    ACTIVATION_CLS = Activation.SILU
    USE_GATED_ACTIVATION = True
    NORM = Norm.RMS_NORM
    USE_ROTARY_POSITION_EMB = True
    USE_BIAS = False
    SEPARATE_EMBEDDING = True
    FPROP_DTYPE = jnp.bfloat16
    NUM_EXPERTS = 8
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_DISPATCH = Dispatch.DROPLESS
    MOE_ACTIVATION_CLS = Activation.SILU
    MOE_GATED_ACTIVATION = True
    # Mixtral's router_aux_loss_coef 0.02 weighs one loss over all 32 layers' routes (Hugging
    # Face's load_balancing_loss_func); paxlite adds a loss a layer: 0.02 / 32 each.
    MOE_LOAD_BALANCE_LOSS_WEIGHT = 0.02 / 32
    EXPERT_MESH_AXIS = None
    LOGICAL_AXIS_RULES = FSDP_RULES
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = (1, 16, 1)
    NUM_GROUPS = 16
    TPU_TARGET = "v5p-32"  # The smallest v5p slice it fits (docs/tpu-sizing.md).

    datasets = LmCloudSpmdSynthetic.datasets
