"""Pax's classification MLP family (``ClassificationModelAdam``) and a tiny CPU experiment.

The model (``praxis_lite.models.classification.ClassificationMlpModel``) classifies every token of
a synthetic sequence on its own: ``ids [B, T]`` in, a class per token out, with
``INPUT_DIM`` classes. Pax registers its catalogue leaves (SmallMlp, LargeMlp) in
``lm_cloud``; they are in ``tasks.lm.lm_cloud`` here too.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from praxis_lite import config as config_lib
from praxis_lite.inputs.synthetic_input import SyntheticLmInput
from tasks.lm import model_params
from tasks.lm.knob_groups import AdamKnobs, LoopKnobs, LrScheduleKnobs

#: Batches of one eval pass (the eval input is finite and rewinds after each pass).
EVAL_NUM_BATCHES = 4


class ClassificationModelAdam(AdamKnobs, LrScheduleKnobs, LoopKnobs):
    """Family base: Pax's classification MLP trained with Adam on synthetic sequences.

    Pax's defaults (``paxml/tasks/lm/model_params.py``). The optimizer is Pax's
    ``set_default_adam``: Adam(W) with betas (0.9, 0.99), epsilon 1e-6, gradients
    clipped at CLIP_GRADIENT_NORM_TO_VALUE, and Pax's
    ``linear_rampup_exponential_decay`` (the LR_LRED_* knobs of
    ``LrScheduleKnobs``: ramp over 4000 steps, decay from 4001 to 0.1 x peak at
    300,000; Pax hard-codes these numbers, here they are knobs). The data is Pax's
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
      LEARNING_RATE, WEIGHT_DECAY, CLIP_GRADIENT_NORM_TO_VALUE: the optimizer, as above;
        the schedule and the loop: ``LrScheduleKnobs`` and ``LoopKnobs``.
      MESH_SHAPE: Pax's name for this family's mesh ('replica', 'data', 'mdl'): when
        set, it is the ICI_MESH_SHAPE.
      MLP_WEIGHT_SHARDING, SOFTMAX_WEIGHT_SHARDING: Pax's per-weight mesh mappings;
        None or all -1 (replicated, what Pax's leaves use) work; other mappings are
        refused (split weights through LOGICAL_AXIS_RULES instead).
      TRAINING_OPTIMIZED_SHARDING: Pax's switch between training and serving layouts;
        True (training) is what paxlite does; False is refused.
    """

    NUM_LAYER: int = 8
    INPUT_DIM: int = 4096
    HIDDEN_DIM: int = 7168
    OUTPUT_DIM: int = 4096
    MAX_SEQ_LEN: int = 1024
    PERCORE_BATCH_SIZE = 16
    FPROP_DTYPE: Any = jnp.float32

    MESH_SHAPE: tuple[int, ...] | None = None
    MLP_WEIGHT_SHARDING: tuple[int | str, ...] | None = None
    SOFTMAX_WEIGHT_SHARDING: tuple[int | str, ...] | None = None
    TRAINING_OPTIMIZED_SHARDING: bool = True

    LEARNING_RATE = 1e-3
    WEIGHT_DECAY = 1e-3
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """MESH_SHAPE, where a class sets it (and not ICI_MESH_SHAPE too), is its
        ICI_MESH_SHAPE: Pax's spelling for this family."""
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if own.get("MESH_SHAPE") is not None and "ICI_MESH_SHAPE" not in own:
            cls.ICI_MESH_SHAPE = tuple(cls.MESH_SHAPE)

    NUM_TRAIN_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 5
    SUMMARY_INTERVAL_STEPS = 5

    def validate(self) -> None:
        """Sizes are positive and the MLP's output fits the shared softmax table."""
        super().validate()
        name = type(self).__qualname__
        for knob in ("NUM_LAYER", "INPUT_DIM", "HIDDEN_DIM", "OUTPUT_DIM", "MAX_SEQ_LEN"):
            if getattr(self, knob) < 1:
                raise KnobError(f"{name}.{knob} = {getattr(self, knob)}; it must be at least 1.")
        for knob in ("MLP_WEIGHT_SHARDING", "SOFTMAX_WEIGHT_SHARDING"):
            mapping = getattr(self, knob)
            if mapping is not None and any(axis != -1 for axis in mapping):
                raise KnobError(
                    f"{name}.{knob} = {mapping!r}: per-weight mesh mappings are not supported "
                    "here; use None or all -1 (replicated) and split weights with "
                    "LOGICAL_AXIS_RULES."
                )
        if not self.TRAINING_OPTIMIZED_SHARDING:
            raise KnobError(
                f"{name}.TRAINING_OPTIMIZED_SHARDING = False: paxlite lays weights out for "
                "training only; remove the setting."
            )
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
        model = model_params.classification_mlp(
            num_layers=self.NUM_LAYER,
            input_dims=self.INPUT_DIM,
            hidden_dims=self.HIDDEN_DIM,
            output_dims=self.OUTPUT_DIM,
            fprop_dtype=self.FPROP_DTYPE,
        )
        return self.single_task(model, self.learner(self.lr_schedule()))


@registry.register
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
    LR_LRED_WARMUP = 10
    LR_LRED_DECAY_START = 10
    LR_LRED_DECAY_END = 200
    NUM_TRAIN_STEPS = 200
    CHECKPOINT_EVERY_N_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 20
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 2
