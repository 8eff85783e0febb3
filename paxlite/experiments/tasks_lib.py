"""What a task trains: the model, the learner, and the step/interval settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import fiddle as fdl

from paxlite.train import trainable
from praxis_lite import config as config_lib
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.optim.optimizers import BaseOptimizer

#: A load rule that loads every variable under its own name (Pax's ``LOAD_ALL``).
LOAD_ALL = ("(.*)", "{}")


class CheckpointLoadingRules(NamedTuple):
    """How a run's parameters are initialised from one checkpoint (Pax's, by name and form).

    Set ``task.train.init_from_checkpoint_rules = {path: CheckpointLoadingRules(...)}``; the
    entries are tried in order and the first to load a variable wins. Variables are named
    ``params/<path>`` (``/`` between keys; ``.`` is read as ``/``): Pax's names for a paxml
    checkpoint (on both sides, through ``paxlite.formats.pax.layout``), paxlite's for a paxlite one.

    Attributes:
      task_p: the task config the checkpoint was trained with; paxlite reads names and
        shapes from the checkpoint itself and uses this only for a paxml checkpoint's
        pipeline layout (None: this run's).
      load_rules: ``(regex, format)`` pairs: a run variable that ``re.match``es regex is
        loaded from the checkpoint's ``format.format(*match.groups())`` (first rule wins).
      safe_load: Pax's flag; paxlite always refuses a load rule that matches nothing.
      ignore_rules: regexes of run variables left freshly initialised.
      step: the step of a job or checkpoints directory (None: the newest).
      load_step: the run starts at the checkpoint's step (T5X's behaviour) rather than 0.
      load_opt_states: the optimizer state too, whole (paxlite checkpoints).
      load_ema_states: Pax's; no EMA state is kept here.
      partial_load_opt_states: the optimizer state of the loaded variables only.
      input_specs_provider_p: Pax's; shapes come from the checkpoint here.
    """

    task_p: Any = None
    load_rules: Sequence[tuple[str, str]] = (LOAD_ALL,)
    safe_load: bool = False
    ignore_rules: Sequence[str] | None = None
    step: int | None = None
    load_step: bool = False
    load_opt_states: bool = False
    load_ema_states: bool = True
    partial_load_opt_states: bool = False
    input_specs_provider_p: Any = None


@dataclasses.dataclass(frozen=True)
class TrainParams:
    """Pax's ``task.train`` level, for what it holds here.

    Attributes:
      init_from_checkpoint_rules: checkpoint path -> :class:`CheckpointLoadingRules`: where
        a run with no checkpoint of its own takes its parameters from (``INIT_FROM``, the
        knob, adds ``{INIT_FROM: CheckpointLoadingRules()}``).
    """

    init_from_checkpoint_rules: Mapping[str, CheckpointLoadingRules] = dataclasses.field(
        default_factory=dict
    )


@dataclasses.dataclass(frozen=True)
class Learner:
    """How parameters are updated.

    Attributes:
      optimizer: the optimizer (learning rate, schedule, clipping, weight decay).
      loss_name: the model metric minimized (a key of the model's ``metrics``; the
        sequence models name their objective ``total_loss``).
      grad_accum_steps: each step's batch runs as this many microbatches, one after the
        other inside the step; their gradients are summed weighted by each microbatch's
        loss weight (tokens), then one update is applied (GRAD_ACCUM_STEPS).
      bprop_variable_inclusion: praxis's: a regex or a list of them over the parameters'
        names (``params/<path>``, the loading rules' form); only the matching parameters
        train (``paxlite.train.trainable``).
      bprop_variable_exclusion: praxis's: the matching parameters are frozen, the others
        train. Not with inclusion. Frozen parameters get no gradient and no optimizer state.
      loss_normalizing_factor: T5X's: None differentiates the loss as the model reports
        it (its mean over its weight, the counted tokens: T5X's
        ``NUM_REAL_TARGET_TOKENS``); a number ``F`` differentiates the loss summed over
        the tokens and divided by ``F`` (T5X's float factors; its ``None``, the plain
        sum, is ``F = 1``). The reported ``loss`` stays the per-token mean.
    """

    optimizer: BaseOptimizer
    loss_name: str = "total_loss"
    grad_accum_steps: int = 1
    bprop_variable_inclusion: str | Sequence[str] = ()
    bprop_variable_exclusion: str | Sequence[str] = ()
    loss_normalizing_factor: float | None = None

    def __post_init__(self) -> None:
        if self.grad_accum_steps < 1:
            raise ValueError(f"Learner.grad_accum_steps must be >= 1, got {self.grad_accum_steps}.")
        factor = self.loss_normalizing_factor
        if factor is not None and not factor > 0:
            raise ValueError(f"Learner.loss_normalizing_factor must be > 0 or None, got {factor}.")
        trainable.check_fields(self.bprop_variable_inclusion, self.bprop_variable_exclusion)


@dataclasses.dataclass(frozen=True)
class SingleTask:
    """One model trained by one learner (Pax's ``SingleTask``).

    Attributes:
      model: a model config (a ``praxis_lite.models.base.BaseModel`` subclass's); it is
        built by the trainer, so it stays a config here.
      learner: see :class:`Learner`.
      num_train_steps: train until this global step.
      save_interval_steps: checkpoint every this many steps (and at the end).
      summary_interval_steps: write TensorBoard scalars and a console line.
      eval_interval_steps: run the eval inputs every this many steps (0 = only at end).
      max_to_keep: checkpoints kept on disk (oldest deleted first); None: all.
      async_timeout_secs: a checkpoint whose asynchronous commit takes longer than this
        (seconds; Pax's ``--async_timeout_secs``, orbax's ``AsyncOptions.timeout_secs``)
        has failed: the run stops with exit code 5.
      skip_nonfinite_updates: on a non-finite loss or gradient, skip that update
        and go on (counted in the ``nonfinite_steps`` summary); if False (default),
        stop at the next summary or save point with an error naming the step,
        keeping the last good checkpoint.
      decode_interval_steps: in train_and_eval, decode the experiment's
        ``decoder_datasets()`` every this many steps and at the end (0 = never;
        ``--mode=decode`` decodes a checkpoint).
      decoder: how to decode: a ``DecoderParams`` config, Hugging Face's names
        (``task.decoder.do_sample``, ``.temperature``, ``.top_k``, ``.top_p``,
        ``.eos_token_id``, ``.max_new_tokens``, ...).
      target_log_pplx: early stopping (Pax's ``EarlyStoppingFn``): training ends,
        with a checkpoint, after an eval in which an input's ``log_pplx`` is at
        most this (nats per token); None: never.
      profiler_capture_step: trace the train steps from the run's this-many-th step on
        (counted from the step it started at; Pax's meaning); None: no trace.
      profiler_num_steps: steps in the trace (more while it is shorter than
        ``profiler_min_duration_sec``).
      profiler_max_num_hosts: only processes with a smaller index trace; None: all.
      train: Pax's ``task.train`` level: ``task.train.init_from_checkpoint_rules`` (see
        :class:`TrainParams`).
      periods_from_step: the save, summary, eval and decode periods count from this step
        (T5X counts them from the step its run started at); 0: multiples of the period.
      summary_layout: where the TensorBoard runs go and what the scalars are called (a
        ``paxlite.train.summaries.SummaryLayout``, e.g. T5X's); None: paxlite's.
      checkpoint_format: where and how the checkpoints are written and read back (a
        ``paxlite.checkpoints.train_checkpoints.CheckpointFormat``, e.g. T5X's
        ``checkpoint_<step>/``); None: paxlite's.
      save_at_start: save the state a run starts from before its first step, unless a
        checkpoint of that step exists (T5X's: ``checkpoint_0``, or the initial
        checkpoint's step).
      inference_evaluator: decodes and scores the decoder inputs' task its own way every
        ``decode_interval_steps`` (``for_job(job, params_shardings)`` -> a program with
        ``run(params, step)`` and ``close()``, as ``DecodeProgram``; e.g. T5X's, seqio's
        evaluator with T5X's outputs); None: paxlite's ``DecodeProgram``.
      resume_input: a resumed run continues its training input where the checkpoint left
        it; False: from its first batch again, with a warning (T5X's
        ``SaveCheckpointConfig.save_dataset = False``).
    """

    model: Any
    learner: Learner
    num_train_steps: int = 1000
    save_interval_steps: int = 100
    summary_interval_steps: int = 10
    eval_interval_steps: int = 0
    max_to_keep: int | None = 3
    async_timeout_secs: int = 1200
    skip_nonfinite_updates: bool = False
    decode_interval_steps: int = 0
    decoder: Any = config_lib.template_field(DecoderParams)
    target_log_pplx: float | None = None
    profiler_capture_step: int | None = None
    profiler_num_steps: int = 2
    profiler_min_duration_sec: float = 1.0
    profiler_max_num_hosts: int | None = None
    train: Any = config_lib.template_field(TrainParams)
    periods_from_step: int = 0
    summary_layout: Any = None
    resume_input: bool = True
    save_at_start: bool = False
    checkpoint_format: Any = None
    inference_evaluator: Any = None

    def __post_init__(self) -> None:
        positive = ("num_train_steps", "save_interval_steps", "summary_interval_steps")
        for name in (*positive, "async_timeout_secs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SingleTask.{name} must be > 0, got {getattr(self, name)}.")
        if self.eval_interval_steps < 0 or (self.max_to_keep is not None and self.max_to_keep <= 0):
            raise ValueError("SingleTask.eval_interval_steps must be >= 0 and max_to_keep > 0.")
        if self.decode_interval_steps < 0:
            raise ValueError(
                f"SingleTask.decode_interval_steps must be >= 0, got {self.decode_interval_steps}."
            )

    def decoder_params(self) -> DecoderParams:
        """The built :class:`DecoderParams` (``decoder`` may be a config or a template)."""
        return _built(self.decoder)

    def train_params(self) -> TrainParams:
        """The :class:`TrainParams` of ``train`` (a config or a template); each rule's
        ``task_p`` stays a config (it describes a checkpoint; nothing of it is built)."""
        value = self.train.value if isinstance(self.train, config_lib.Template) else self.train
        if isinstance(value, fdl.Buildable):
            return TrainParams(**value.__arguments__)
        return value


def _built(field: Any) -> Any:
    """A template field's value, built if it is a config."""
    value = field.value if isinstance(field, config_lib.Template) else field
    return config_lib.instantiate(value) if isinstance(value, fdl.Buildable) else value
