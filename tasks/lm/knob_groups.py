"""Knob groups shared by experiment families: the training loop and Pax's learning-rate schedules.

Each group is a mixin declaring its knobs once (Pax's names and meanings) and
building its piece of the task config from them; families list the groups they
use. A preset (a mixin that only sets knobs, e.g. a model size shared by a few
leaves) is marked the same way. Knob groups and presets do not count toward an
experiment's depth (``tests/tasks/test_experiment_depth.py``): a registered
experiment is a family base, at most one intermediate, and the leaf.
"""

from __future__ import annotations

import enum
import math
from typing import Any, TypeVar

from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from paxlite.experiments.tasks_lib import Learner, SingleTask
from paxlite.runtime import mesh, mesh_checks
from praxis_lite import config as config_lib
from praxis_lite.optim import optimizers, schedules
from praxis_lite.sharding import BATCH

_T = TypeVar("_T", bound=type)


def knob_group(cls: _T) -> _T:
    """Marks ``cls`` (a BaseExperiment subclass) as a knob group or preset: a mixin."""
    cls._is_knob_group = True
    return cls


def is_knob_group(cls: type) -> bool:
    """Whether ``cls`` itself (not a subclass of it) is marked with :func:`knob_group`."""
    return bool(vars(cls).get("_is_knob_group", False))


class LrSchedule(enum.Enum):
    """Pax's ``LR_SCHEDULE`` strings (a Pax file's ``'linear_rampup_cosine_decay'`` parses)."""

    LINEAR_RAMPUP_EXPONENTIAL_DECAY = "linear_rampup_exponential_decay"
    LINEAR_RAMPUP_COSINE_DECAY = "linear_rampup_cosine_decay"
    CONSTANT = "constant"


@knob_group
class LrScheduleKnobs(BaseExperiment):
    """Pax's learning-rate schedule knobs (``paxml/tasks/lm/params/c4.py``, ``set_adam_and_lr``).

    LR_SCHEDULE picks the shape; each shape reads its own group (the other
    group is ignored), as Pax does:

    * ``linear_rampup_exponential_decay``: linear from 0 to LR_LRED_MAX over
      LR_LRED_WARMUP steps, then exponential decay from LR_LRED_DECAY_START to
      LR_LRED_MIN_RATIO x LR_LRED_MAX at LR_LRED_DECAY_END.
    * ``linear_rampup_cosine_decay``: the same with a cosine. As in Pax, None
      derives a step count from GPT-3's recipe scaled to the global batch B
      (PERCORE_BATCH_SIZE x the mesh's devices): LR_COS_WARMUP None is
      ceil(265 x 1536 / B), LR_COS_DECAY_START None is LR_COS_WARMUP + 1,
      LR_COS_DECAY_END None is ceil(108600 x 1536 / B).
    * ``constant``: LEARNING_RATE throughout.

    All multiply the optimizer's LEARNING_RATE. Defaults: Pax's
    ``TransformerLmSpmdAdam``.
    """

    LR_SCHEDULE: LrSchedule = LrSchedule.LINEAR_RAMPUP_EXPONENTIAL_DECAY
    LR_LRED_WARMUP: int = 4000
    LR_LRED_DECAY_START: int = 4001
    LR_LRED_DECAY_END: int = 300_000
    LR_LRED_MIN_RATIO: float = 0.1
    LR_LRED_MAX: float = 1.0
    LR_COS_WARMUP: int | None = 4000
    LR_COS_DECAY_START: int | None = None
    LR_COS_DECAY_END: int | None = 300_000
    LR_COS_MIN_RATIO: float = 0.1
    LR_COS_MAX: float = 1.0

    def validate(self) -> None:
        super().validate()
        check_at_least(self, 0, "LR_LRED_WARMUP")
        if self.LR_COS_WARMUP is not None:
            check_at_least(self, 0, "LR_COS_WARMUP")

    def lr_schedule(self) -> config_lib.Config:
        """The schedule config of LR_SCHEDULE from its knob group."""
        if self.LR_SCHEDULE is LrSchedule.CONSTANT:
            return config_lib.Config(schedules.Constant)
        if self.LR_SCHEDULE is LrSchedule.LINEAR_RAMPUP_EXPONENTIAL_DECAY:
            return _rampup(
                schedules.LinearRampupExponentialDecay,
                self.LR_LRED_WARMUP,
                self.LR_LRED_DECAY_START,
                self.LR_LRED_DECAY_END,
                self.LR_LRED_MIN_RATIO,
                self.LR_LRED_MAX,
            )
        warmup = self.LR_COS_WARMUP
        if warmup is None:
            warmup = gpt3_steps_for_batch(265, mesh_global_batch(self))
        decay_start = self.LR_COS_DECAY_START
        decay_end = self.LR_COS_DECAY_END
        if decay_end is None:
            decay_end = gpt3_steps_for_batch(108_600, mesh_global_batch(self))
        return _rampup(
            schedules.LinearRampupCosineDecay,
            warmup,
            warmup + 1 if decay_start is None else decay_start,
            decay_end,
            self.LR_COS_MIN_RATIO,
            self.LR_COS_MAX,
        )


#: The global batch that GPT-3's published step counts are for (Pax's MLPerf reference).
GPT3_REFERENCE_BATCH = 1536


def gpt3_steps_for_batch(steps_at_1536: int, global_batch: int) -> int:
    """Pax's scaling of a GPT-3 step count to another global batch: same number of examples."""
    return math.ceil(steps_at_1536 * GPT3_REFERENCE_BATCH / global_batch - 1e-6)


def mesh_global_batch(experiment: BaseExperiment) -> int:
    """PERCORE_BATCH_SIZE x the devices of the experiment's mesh (ICI x DCN)."""
    devices = mesh.mesh_size(experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE)
    return experiment.global_batch_size(devices)


def _rampup(
    schedule: type, warmup: int, decay_start: int, decay_end: int, min_ratio: float, peak: float
) -> config_lib.Config:
    """A linear-rampup schedule config (the decay starts after the warmup, ends after it starts)."""
    decay_start = max(decay_start, warmup)
    return config_lib.Config(
        schedule,
        warmup_steps=warmup,
        decay_start=decay_start,
        decay_end=max(decay_end, decay_start + 1),
        min_ratio=min_ratio,
        max=peak,
    )


@knob_group
class AdamKnobs(BaseExperiment):
    """Adam(W)'s knobs (Pax's names): LEARNING_RATE (the peak; the schedule multiplies
    it; None: Pax's MLPerf rule, 2e-5 for a global batch up to 3584, else 3e-5),
    WEIGHT_DECAY (decoupled), ADAM_BETA1, ADAM_BETA2, ADAM_EPSILON, ADAM_EPSILON_ROOT
    (inside the root), ADAM_CLIP_THRESHOLD (caps the RMS of each tensor's raw update,
    praxis's default 1.0; negative: off, as Pax writes -1) and
    CLIP_GRADIENT_NORM_TO_VALUE (global-norm clipping; 0: none)."""

    LEARNING_RATE: float | None = 2.5e-4
    WEIGHT_DECAY: float = 1e-3
    ADAM_BETA1: float = 0.9
    ADAM_BETA2: float = 0.99
    ADAM_EPSILON: float = 1e-6
    ADAM_EPSILON_ROOT: float = 0.0
    ADAM_CLIP_THRESHOLD: float = 1.0
    CLIP_GRADIENT_NORM_TO_VALUE: float = 1.0

    def peak_learning_rate(self) -> float:
        """LEARNING_RATE, or Pax's batch-size rule when it is None."""
        if self.LEARNING_RATE is not None:
            return self.LEARNING_RATE
        return 2e-5 if mesh_global_batch(self) <= 3584 else 3e-5

    def learner(self, lr_schedule: config_lib.Config) -> config_lib.Config:
        """The ``Learner`` config: Adam of these knobs with ``lr_schedule``."""
        optimizer = config_lib.Config(
            optimizers.Adam,
            learning_rate=self.peak_learning_rate(),
            beta1=self.ADAM_BETA1,
            beta2=self.ADAM_BETA2,
            epsilon=self.ADAM_EPSILON,
            epsilon_root=self.ADAM_EPSILON_ROOT,
            clip_threshold=self.ADAM_CLIP_THRESHOLD,
            weight_decay=self.WEIGHT_DECAY,
            clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE,
            lr_schedule=lr_schedule,
        )
        return config_lib.Config(Learner, optimizer=optimizer)


@knob_group
class LoopKnobs(BaseExperiment):
    """The training loop's knobs (Pax's names) and the ``SingleTask`` built from them.

    NUM_TRAIN_STEPS: train until this step. CHECKPOINT_EVERY_N_STEPS: save every
    this many steps (and at the end). CHECKPOINT_MAX_TO_KEEP: checkpoints kept (None:
    all, as T5X's ``keep = None``). CHECKPOINT_ASYNC_TIMEOUT_SECS: a save whose
    asynchronous commit takes longer has failed (Pax's --async_timeout_secs; the run
    stops with exit code 5).
    SUMMARY_INTERVAL_STEPS: TensorBoard scalars and a console line.
    EVAL_INTERVAL_STEPS: eval every this many steps (0: at the end only).
    TARGET_LOG_PPLX: stop (with a checkpoint) after an eval whose log-perplexity
    is at most this (Pax's ``EarlyStoppingFn``); None: train to NUM_TRAIN_STEPS.
    PROFILER_CAPTURE_STEP: trace the train steps from the run's this-many-th step
    (counted from where it started, as Pax counts; None: no trace) into
    ``<job_log_dir>/summaries/train/plugins/profile``. PROFILER_NUM_STEPS: steps
    traced, more while the trace is shorter than PROFILER_MIN_DURATION_SEC.
    PROFILER_MAX_NUM_HOSTS: only processes below this index trace (None: all).
    GRAD_ACCUM_STEPS: each step's global batch runs as this many microbatches inside
    the step, their gradients summed weighted by tokens, one update per step (Pax's
    ShardedStaticAccumulator): a recipe's batch on fewer chips. Each microbatch (the
    global batch / GRAD_ACCUM_STEPS) must still split evenly over the batch shards.
    """

    NUM_TRAIN_STEPS: int = 500_000
    CHECKPOINT_EVERY_N_STEPS: int = 5000
    CHECKPOINT_MAX_TO_KEEP: int | None = 10
    CHECKPOINT_ASYNC_TIMEOUT_SECS: int = 1200
    SUMMARY_INTERVAL_STEPS: int = 100
    EVAL_INTERVAL_STEPS: int = 0
    TARGET_LOG_PPLX: float | None = None
    PROFILER_CAPTURE_STEP: int | None = None
    PROFILER_NUM_STEPS: int = 2
    PROFILER_MIN_DURATION_SEC: float = 1.0
    PROFILER_MAX_NUM_HOSTS: int | None = None
    GRAD_ACCUM_STEPS: int = 1

    def validate(self) -> None:
        super().validate()
        check_at_least(
            self,
            1,
            "CHECKPOINT_EVERY_N_STEPS",
            "SUMMARY_INTERVAL_STEPS",
            "CHECKPOINT_ASYNC_TIMEOUT_SECS",
            "PROFILER_NUM_STEPS",
            "GRAD_ACCUM_STEPS",
        )
        check_at_least(
            self, 0, "NUM_TRAIN_STEPS", "EVAL_INTERVAL_STEPS", "PROFILER_MIN_DURATION_SEC"
        )
        if self.CHECKPOINT_MAX_TO_KEEP is not None:
            check_at_least(self, 1, "CHECKPOINT_MAX_TO_KEEP")
        if self.PROFILER_CAPTURE_STEP is not None:
            check_at_least(self, 0, "PROFILER_CAPTURE_STEP")
        if self.PROFILER_MAX_NUM_HOSTS is not None:
            check_at_least(self, 1, "PROFILER_MAX_NUM_HOSTS")
        self._check_grad_accum_split()

    def _check_grad_accum_split(self) -> None:
        """Raises unless each of GRAD_ACCUM_STEPS microbatches splits over the batch shards."""
        steps = self.GRAD_ACCUM_STEPS
        if steps == 1:
            return
        batch = mesh_global_batch(self)
        shards = mesh_checks.MeshPlan.of(self).ways(BATCH)
        if batch % steps or (batch // steps) % shards:
            raise KnobError(
                f"{type(self).__qualname__}: GRAD_ACCUM_STEPS={steps} does not split the global "
                f"batch of {batch} into microbatches that divide evenly over its {shards} batch "
                f"shards; pick GRAD_ACCUM_STEPS dividing {batch // shards}."
            )

    def single_task(self, model: config_lib.Config, learner: config_lib.Config) -> Any:
        """The ``SingleTask`` config of ``model`` and ``learner`` with this loop."""
        learner.grad_accum_steps = self.GRAD_ACCUM_STEPS
        return config_lib.Config(
            SingleTask,
            model=model,
            learner=learner,
            num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.CHECKPOINT_EVERY_N_STEPS,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS,
            max_to_keep=self.CHECKPOINT_MAX_TO_KEEP,
            async_timeout_secs=self.CHECKPOINT_ASYNC_TIMEOUT_SECS,
            target_log_pplx=self.TARGET_LOG_PPLX,
            profiler_capture_step=self.PROFILER_CAPTURE_STEP,
            profiler_num_steps=self.PROFILER_NUM_STEPS,
            profiler_min_duration_sec=self.PROFILER_MIN_DURATION_SEC,
            profiler_max_num_hosts=self.PROFILER_MAX_NUM_HOSTS,
        )


def check_at_least(experiment: BaseExperiment, low: int, *knobs: str) -> None:
    """Raises KnobError for the first of ``knobs`` below ``low``."""
    for knob in knobs:
        value = getattr(experiment, knob)
        if value < low:
            raise KnobError(
                f"{type(experiment).__qualname__}.{knob} = {value}; it must be "
                f"{'at least 1' if low == 1 else f'>= {low}'}."
            )
