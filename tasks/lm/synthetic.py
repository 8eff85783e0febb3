"""The tiny CPU experiment: a small LM on learnable synthetic sequences."""

from __future__ import annotations

from typing import Any

import numpy as np

from paxlite.experiments import registry
from praxis_lite import config as config_lib
from praxis_lite.inputs.synthetic_input import SyntheticLmInput
from tasks.lm.knob_groups import knob_group
from tasks.lm.lm_cloud import LmCloudSpmd, LmTrainer
from tasks.lm.model_params import Activation


@knob_group
class SyntheticLmData(LmTrainer):
    """LmSyntheticTiny's data and run for any decoder-only LM: learnable synthetic rows
    (``SyntheticLmInput``) of MAX_SEQ_LEN tokens over the model's vocabulary, an eval of 4
    batches, greedy-decodable progressions, and a short CPU run's loop (300 steps, cosine
    learning rate from 3e-3, a checkpoint every 100 steps)."""

    MAX_SEQ_LEN = 32
    FPROP_DTYPE = np.float32
    PERCORE_BATCH_SIZE = 16
    LEARNING_RATE = 3e-3
    WEIGHT_DECAY = 0.0
    LR_COS_WARMUP = 20
    LR_COS_DECAY_START = 20
    LR_COS_MIN_RATIO = 0.1
    NUM_TRAIN_STEPS = 300
    LR_COS_DECAY_END = NUM_TRAIN_STEPS
    CHECKPOINT_EVERY_N_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 25
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 2

    def datasets(self) -> list[Any]:
        train = self._rows(seed=self.SEED)
        evaluation = self._held_out(name="test", num_batches=4, seed=self.SEED + 1)
        return [train, evaluation]

    def decoder_datasets(self) -> list[Any]:
        """Prompts of 3..8 progression tokens; greedy decoding should continue them exactly."""
        decode = self._held_out(
            name="progressions",
            num_batches=1,
            seq_len=16,
            prompt_len=8,
            min_prompt_len=3,
            seed=self.SEED + 2,
        )
        return [decode]

    def _rows(self, **fields: Any) -> config_lib.Config:
        """This host's batches of rows (MAX_SEQ_LEN tokens unless ``fields`` say) over the
        model's vocabulary."""
        rows = {"seq_len": self.MAX_SEQ_LEN, "vocab_size": self.vocab_size(), **fields}
        return config_lib.Config(SyntheticLmInput, batch_size=self.train_batch_size(), **rows)

    def _held_out(self, **fields: Any) -> config_lib.Config:
        """:meth:`_rows` read from the start at each eval."""
        return self._rows(is_training=False, reset_for_eval=True, **fields)

    def train_batch_size(self) -> int:
        """This host's share of PERCORE_BATCH_SIZE x devices."""
        return self.infeed_batch_size()


@registry.register
class LmSyntheticTiny(SyntheticLmData, LmCloudSpmd):
    """A 2-layer, 64-dim LM on SyntheticLmInput: trains on a laptop CPU in about a minute."""

    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 256
    NUM_HEADS = 4
    VOCAB_SIZE = 64
    ACTIVATION_CLS = Activation.GELU
    USE_REPEATED_LAYER = True


@registry.register
class LmSyntheticTinyPipeline(LmSyntheticTiny):
    """LmSyntheticTiny with 4 layers pipelined over 2 stages, 4 microbatches, on 2 devices.

    ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` gives a CPU its 2
    devices. With NUM_STAGES=1 and ICI_MESH_SHAPE=1,1,2,1 it is the same model
    unpipelined (same initial weights, same losses).
    """

    NUM_LAYERS = 4
    NUM_STAGES = 2
    NUM_MICROBATCHES = 4
    MESH_AXIS_NAMES = ("stage", "replica", "data", "mdl")
    ICI_MESH_SHAPE = (2, 1, 1, 1)
    PERCORE_BATCH_SIZE = 8


@registry.register
class LmSyntheticTinyMoe(LmSyntheticTiny):
    """LmSyntheticTiny with 4 layers, every second one a mixture of 8 experts (GShard top-2
    with capacity, Pax's routing), scanned as 2 groups of (dense, MoE). MOE_DISPATCH=dropless
    routes every token to its top 2 instead; trains on a CPU in under a minute."""

    NUM_LAYERS = 4
    NUM_EXPERTS = 8
    MOE_EVERY_N = 2
    MOE_HIDDEN_DIMS = 128
    MOE_ACTIVATION_CLS = Activation.GELU
    NUM_TRAIN_STEPS = 200
    LR_COS_DECAY_END = NUM_TRAIN_STEPS
