"""Pax's classification MLP family (``ClassificationModelAdam``) and a tiny CPU experiment.

The model (``praxis_lite.models.ClassificationMlpModel``) classifies every token of
a synthetic sequence on its own: ``ids [B, T]`` in, a class per token out, with
``INPUT_DIM`` classes. Pax's catalogue leaves (SmallMlp, LargeMlp) are not here.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from paxlite import experiment_registry
from paxlite.base_experiment import BaseExperiment, KnobError
from praxis_lite import config as config_lib
from praxis_lite import schedules
from praxis_lite.synthetic_input import SyntheticLmInput
from tasks.lm import model_params

#: Batches of one eval pass (the eval input is finite and rewinds after each pass).
EVAL_NUM_BATCHES = 4


class ClassificationModelAdam(BaseExperiment):
    """Family base: Pax's classification MLP trained with Adam on synthetic sequences.

    Pax's defaults (``paxml/tasks/lm/model_params.py``), with Pax's
    ``CHECKPOINT_EVERY_N_STEPS`` spelled SAVE_INTERVAL_STEPS as in the LM family.
    The optimizer is Pax's ``set_default_adam``: Adam(W) with betas (0.9, 0.99),
    epsilon 1e-6, gradients clipped at CLIP_GRADIENT_NORM_TO_VALUE, a linear ramp
    over LR_WARMUP_STEPS, then exponential decay from LR_DECAY_START to
    LR_DECAY_END down to LR_MIN_RATIO x LEARNING_RATE. The data is Pax's
    ``SyntheticDataset``: PERCORE_BATCH_SIZE x devices sequences of MAX_SEQ_LEN
    tokens, here SyntheticLmInput's progressions (each label follows from its
    token up to the stride, so the loss can fall) for training and for eval.

    Attributes (knobs):
      NUM_LAYER: FeedForward layers of the MLP.
      INPUT_DIM: the embedding dims and the number of classes (Pax ties the two).
      HIDDEN_DIM: the MLP's hidden dims.
      OUTPUT_DIM: the MLP's output dims; equal to INPUT_DIM (the output feeds the
        shared softmax table).
      MAX_SEQ_LEN: tokens per example.
      FPROP_DTYPE: compute dtype (weights stay float32).
      LEARNING_RATE, WEIGHT_DECAY, CLIP_GRADIENT_NORM_TO_VALUE, LR_WARMUP_STEPS,
        LR_DECAY_START, LR_DECAY_END, LR_MIN_RATIO: the optimizer, as above.
      NUM_TRAIN_STEPS, SAVE_INTERVAL_STEPS, SUMMARY_INTERVAL_STEPS,
        EVAL_INTERVAL_STEPS (0: eval at the end only), MAX_TO_KEEP: the loop.
    """

    NUM_LAYER: int = 8
    INPUT_DIM: int = 4096
    HIDDEN_DIM: int = 7168
    OUTPUT_DIM: int = 4096
    MAX_SEQ_LEN: int = 1024
    PERCORE_BATCH_SIZE = 16
    FPROP_DTYPE: Any = jnp.float32

    LEARNING_RATE: float = 1e-3
    WEIGHT_DECAY: float = 1e-3
    CLIP_GRADIENT_NORM_TO_VALUE: float = 5.0
    LR_WARMUP_STEPS: int = 4000
    LR_DECAY_START: int = 4001
    LR_DECAY_END: int = 300_000
    LR_MIN_RATIO: float = 0.1

    NUM_TRAIN_STEPS: int = 10
    SAVE_INTERVAL_STEPS: int = 5
    SUMMARY_INTERVAL_STEPS: int = 5
    EVAL_INTERVAL_STEPS: int = 0
    MAX_TO_KEEP: int = 10

    def validate(self) -> None:
        """Sizes are positive and the MLP's output fits the shared softmax table."""
        super().validate()
        name = type(self).__qualname__
        for knob in ("NUM_LAYER", "INPUT_DIM", "HIDDEN_DIM", "OUTPUT_DIM", "MAX_SEQ_LEN"):
            if getattr(self, knob) < 1:
                raise KnobError(f"{name}.{knob} = {getattr(self, knob)}; it must be at least 1.")
        if self.OUTPUT_DIM != self.INPUT_DIM:
            raise KnobError(
                f"{name}: OUTPUT_DIM={self.OUTPUT_DIM} != INPUT_DIM={self.INPUT_DIM}; the MLP's "
                "output is multiplied by the INPUT_DIM-wide shared softmax table, so set "
                "OUTPUT_DIM to INPUT_DIM."
            )

    def datasets(self) -> list[Any]:
        """Train and eval inputs: this host's share of PERCORE_BATCH_SIZE x devices."""
        common = dict(
            batch_size=self.infeed_batch_size(),
            seq_len=self.MAX_SEQ_LEN,
            vocab_size=self.INPUT_DIM,
        )
        train = config_lib.Config(SyntheticLmInput, seed=self.SEED, **common)
        evaluation = config_lib.Config(
            SyntheticLmInput,
            name="test",
            is_training=False,
            reset_for_eval=True,
            num_batches=EVAL_NUM_BATCHES,
            seed=self.SEED + 1,
            **common,
        )
        return [train, evaluation]

    def task(self) -> Any:
        learner = model_params.adam_learner(
            learning_rate=self.LEARNING_RATE,
            weight_decay=self.WEIGHT_DECAY,
            beta1=0.9,
            beta2=0.99,
            epsilon=1e-6,
            clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE,
            warmup_steps=self.LR_WARMUP_STEPS,
            decay_start=self.LR_DECAY_START,
            decay_end=self.LR_DECAY_END,
            min_ratio=self.LR_MIN_RATIO,
            decay=schedules.LinearRampupExponentialDecay,
        )
        model = model_params.classification_mlp(
            num_layers=self.NUM_LAYER,
            input_dims=self.INPUT_DIM,
            hidden_dims=self.HIDDEN_DIM,
            output_dims=self.OUTPUT_DIM,
            fprop_dtype=self.FPROP_DTYPE,
        )
        return model_params.single_task(
            model,
            learner,
            num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.SAVE_INTERVAL_STEPS,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS,
            max_to_keep=self.MAX_TO_KEEP,
        )


@experiment_registry.register
class MlpSyntheticTiny(ClassificationModelAdam):
    """A 3-layer MLP over 64 classes: trains on one CPU device in seconds.

    On N devices: ``--set=ICI_MESH_SHAPE=1,N,1`` (the 'data' axis takes them).
    """

    NUM_LAYER = 3
    INPUT_DIM = 64
    HIDDEN_DIM = 32
    OUTPUT_DIM = 64
    MAX_SEQ_LEN = 16
    PERCORE_BATCH_SIZE = 32
    LEARNING_RATE = 1e-2
    WEIGHT_DECAY = 0.0
    LR_WARMUP_STEPS = 10
    LR_DECAY_START = 10
    LR_DECAY_END = 200
    NUM_TRAIN_STEPS = 200
    SAVE_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 20
    EVAL_INTERVAL_STEPS = 100
    MAX_TO_KEEP = 2
