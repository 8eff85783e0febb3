"""LmCloudSpmd2B shrunk, as paxml 1.4 runs it, for timing paxml's own main.py against paxlite.

Run in the paxml venv (``tools/pax_fixtures/make_venv.sh``), never by CI::

    JAX_PLATFORMS=cpu /tmp/paxml-venv/bin/python -m paxml.main \
        --exp=tools.pax_speed.shrunk_2b.LmCloudSpmd2BShrunk --job_log_dir=/tmp/pax_speed \
        --mode=train

paxml logs its steps/s; ``tools/pax_speed/compare.sh`` runs both sides and prints both.
The same shape as ``benchmarks/compare_plain.py``'s "ref" with Pax's defaults kept (logit
caps 50/30, matmul lookup, the shared softmax's bias, the per-dim query scale, sinusoidal
positions): 2 layers, MODEL_DIMS 256, HIDDEN_DIMS 1024, 4 heads x 64, VOCAB_SIZE 32000,
MAX_SEQ_LEN 256, PERCORE_BATCH_SIZE 8 on one device, float32, no rematerialisation.
"""

from jax import numpy as jnp
from paxml import experiment_registry
from paxml.tasks.lm.params import lm_cloud
from praxis import layers

#: Steps of one run; paxml's steps/s in its log covers the steps after the first.
STEPS = 60


@experiment_registry.register
class LmCloudSpmd2BShrunk(lm_cloud.LmCloudSpmd2B):
    """See the module docstring; tools/pax_speed/compare.sh gives paxlite the same sizes."""

    NUM_LAYERS = 2
    MODEL_DIMS = 256
    HIDDEN_DIMS = 1024
    NUM_HEADS = 4
    DIMS_PER_HEAD = 64
    VOCAB_SIZE = 32000
    MAX_SEQ_LEN = 256
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 1, 1]
    FPROP_DTYPE = jnp.float32
    CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING
    CHECKPOINT_EVERY_N_STEPS = 1_000_000
    SUMMARY_INTERVAL_STEPS = 10

    def task(self):
        task_p = super().task()
        task_p.train.num_train_steps = STEPS
        return task_p
