"""The tiny CPU encoder-decoder: a small T5 learns to reverse short sequences.

::

    paxlite --exp=tasks.t5.tiny.T5Tiny --job_log_dir=/tmp/t5_tiny --mode=train_and_eval

Inputs are 1..``MAX_LEN`` random tokens (ids 2..VOCAB_SIZE-1) and an EOS (1); the target
is the same tokens reversed (``SEQ2SEQ_TASK=sort``: sorted) and the EOS. Greedy decoding of
held-out inputs is scored by exact match.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paxlite.experiments import registry
from praxis_lite import config as config_lib
from praxis_lite.inputs.synthetic_input import Seq2SeqTask, SyntheticSeq2SeqInput
from tasks.lm.knob_groups import LrSchedule
from tasks.t5.t5_base import T5Spmd

#: SyntheticSeq2SeqInput's EOS id.
_EOS = 1


@registry.register
class T5Tiny(T5Spmd):
    """A T5 1.1-shaped model (2 + 2 layers, 64 dims) on synthetic reversal: about a
    minute on a laptop CPU.

    Attributes (knobs, beyond the family's):
      MAX_LEN: the longest input (tokens before its EOS); inputs and targets are
        MAX_LEN + 1 long.
      SEQ2SEQ_TASK: 'reverse' or 'sort'.
    """

    NUM_ENCODER_LAYERS = 2
    NUM_DECODER_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 128
    NUM_HEADS = 4
    VOCAB_SIZE = 32
    FPROP_DTYPE = np.float32
    PERCORE_BATCH_SIZE = 32
    LEARNING_RATE = 3e-3
    WEIGHT_DECAY = 0.0
    LR_SCHEDULE = LrSchedule.LINEAR_RAMPUP_COSINE_DECAY
    LR_COS_WARMUP = 50
    LR_COS_DECAY_START = 50
    LR_COS_MIN_RATIO = 0.05
    NUM_TRAIN_STEPS = 2000
    LR_COS_DECAY_END = NUM_TRAIN_STEPS
    CHECKPOINT_EVERY_N_STEPS = 500
    SUMMARY_INTERVAL_STEPS = 100
    EVAL_INTERVAL_STEPS = 500
    CHECKPOINT_MAX_TO_KEEP = 2
    MAX_LEN: int = 8
    SEQ2SEQ_TASK: Seq2SeqTask = Seq2SeqTask.REVERSE

    def task(self) -> Any:
        """The family's task; decoding stops at the EOS; train_and_eval decodes at the end."""
        task = super().task()
        task.decoder.eos_token_id = _EOS
        task.decode_interval_steps = self.NUM_TRAIN_STEPS
        return task

    def _input(self, **fields: Any) -> config_lib.Config:
        return config_lib.Config(
            SyntheticSeq2SeqInput,
            batch_size=self.infeed_batch_size(),
            vocab_size=self.VOCAB_SIZE,
            max_len=self.MAX_LEN,
            task=self.SEQ2SEQ_TASK,
            **fields,
        )

    def datasets(self) -> list[Any]:
        train = self._input(seed=self.SEED)
        evaluation = self._input(
            name="test", is_training=False, reset_for_eval=True, num_batches=4, seed=self.SEED + 1
        )
        return [train, evaluation]

    def decoder_datasets(self) -> list[Any]:
        """Held-out inputs; greedy decoding should reproduce their targets exactly."""
        decode = self._input(
            name="reversals",
            is_training=False,
            reset_for_eval=True,
            num_batches=1,
            decode=True,
            seed=self.SEED + 2,
        )
        return [decode]
