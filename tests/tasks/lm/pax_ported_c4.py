# Pax's C4Spmd2BAdam4Replicas as written in paxml 1.4 (paxml/tasks/lm/params/c4.py), ported
# to paxlite: only the imports changed. docs/pax.md "Porting a Pax experiment" shows this file.
from jax import numpy as jnp

from paxlite import experiment_registry
from praxis_lite import layers
from tasks.lm import c4


@experiment_registry.register
class C4Spmd2BAdam4Replicas(c4.C4SpmdAdam):
  r"""GPT-3 config with 2B params.

  Model Parameters: Global batch size = 1 * 4 * 1 * 32 = 128.
  """
  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  HIDDEN_DIMS = MODEL_DIMS * 4
  NUM_HEADS = 24
  DIMS_PER_HEAD = 128
  PERCORE_BATCH_SIZE = 32
  MAX_SEQ_LEN = 1024
  VOCAB_SIZE = 32000
  FPROP_DTYPE = jnp.bfloat16
  USE_REPEATED_LAYER = True

  SUMMARY_INTERVAL_STEPS = 10
  CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING
  ICI_MESH_SHAPE = [1, 4, 1]
