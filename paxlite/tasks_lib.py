"""What a task trains: the model, the learner, and the step/interval settings."""

from __future__ import annotations

import dataclasses
from typing import Any

import fiddle as fdl

from praxis_lite import config as config_lib
from praxis_lite.decoding import DecoderParams
from praxis_lite.optimizers import BaseOptimizer


@dataclasses.dataclass(frozen=True)
class Learner:
    """How parameters are updated.

    Attributes:
      optimizer: the optimizer (learning rate, schedule, clipping, weight decay).
      loss_name: the model metric minimized (a key of the model's ``metrics``; LanguageModel
        names its objective ``total_loss``).
      grad_accum_steps: each step's batch runs as this many microbatches, one after the
        other inside the step; their gradients are summed weighted by each microbatch's
        loss weight (tokens), then one update is applied (GRAD_ACCUM_STEPS).
    """

    optimizer: BaseOptimizer
    loss_name: str = "total_loss"
    grad_accum_steps: int = 1

    def __post_init__(self) -> None:
        if self.grad_accum_steps < 1:
            raise ValueError(f"Learner.grad_accum_steps must be >= 1, got {self.grad_accum_steps}.")


@dataclasses.dataclass(frozen=True)
class SingleTask:
    """One model trained by one learner (Pax's ``SingleTask``).

    Attributes:
      model: a layer config (e.g. ``TransformerLm.HParams.config(...)``); it is
        built by the trainer, so it stays a config here.
      learner: see :class:`Learner`.
      num_train_steps: train until this global step.
      save_interval_steps: checkpoint every this many steps (and at the end).
      summary_interval_steps: write TensorBoard scalars and a console line.
      eval_interval_steps: run the eval inputs every this many steps (0 = only at end).
      max_to_keep: checkpoints kept on disk (oldest deleted first).
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
      decoder: how to decode: a ``DecoderParams`` config (``task.decoder.temperature``,
        ``.top_k``, ``.top_p``, ``.eos_id``, ``.max_decode_steps``, ...).
      target_log_pplx: early stopping (Pax's ``EarlyStoppingFn``): training ends,
        with a checkpoint, after an eval in which an input's ``log_pplx`` is at
        most this (nats per token); None: never.
      profiler_capture_step: trace the train steps from the run's this-many-th step on
        (counted from the step it started at; Pax's meaning); None: no trace.
      profiler_num_steps: steps in the trace (more while it is shorter than
        ``profiler_min_duration_sec``).
      profiler_max_num_hosts: only processes with a smaller index trace; None: all.
    """

    model: Any
    learner: Learner
    num_train_steps: int = 1000
    save_interval_steps: int = 100
    summary_interval_steps: int = 10
    eval_interval_steps: int = 0
    max_to_keep: int = 3
    async_timeout_secs: int = 1200
    skip_nonfinite_updates: bool = False
    decode_interval_steps: int = 0
    decoder: Any = config_lib.template_field(DecoderParams)
    target_log_pplx: float | None = None
    profiler_capture_step: int | None = None
    profiler_num_steps: int = 2
    profiler_min_duration_sec: float = 1.0
    profiler_max_num_hosts: int | None = None

    def __post_init__(self) -> None:
        positive = ("num_train_steps", "save_interval_steps", "summary_interval_steps")
        for name in (*positive, "async_timeout_secs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SingleTask.{name} must be > 0, got {getattr(self, name)}.")
        if self.eval_interval_steps < 0 or self.max_to_keep <= 0:
            raise ValueError("SingleTask.eval_interval_steps must be >= 0 and max_to_keep > 0.")
        if self.decode_interval_steps < 0:
            raise ValueError(
                f"SingleTask.decode_interval_steps must be >= 0, got {self.decode_interval_steps}."
            )

    def decoder_params(self) -> DecoderParams:
        """The built :class:`DecoderParams` (``decoder`` may be a config or a template)."""
        value = (
            self.decoder.value if isinstance(self.decoder, config_lib.Template) else self.decoder
        )
        return config_lib.instantiate(value) if isinstance(value, fdl.Buildable) else value
