"""What the training loop does besides stepping, each with its own cadence.

The loop (``paxlite.train.train_loop``) calls every action after every step with a
:class:`StepContext`; an action decides from the step whether it is due (as
``clu.periodic_actions`` do). A new cadence is a new action, not a new branch in
the loop.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

from paxlite.checkpoints import input_positions, train_checkpoints
from paxlite.evaluation import decode_lib, eval_lib
from paxlite.perf.flops import StepCost
from paxlite.train import prefetch, summaries, trainable

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: "stopped by the scheduler, resumable".


class DivergenceError(RuntimeError):
    """The loss or gradient became non-finite and the task does not skip such updates."""


@dataclasses.dataclass
class RunResult:
    """What a run did.

    Attributes:
      train: the last summary's scalars; history: ``(step, scalars)`` of every summary.
      eval: the last eval metrics by input name; decode: the last decode metrics by name.
      state: the final TrainState.
      preempted: stopped by SIGTERM (or a preemption sync point) after saving.
      first_step: compile time and time to the first step (seconds).
      cost: the train step's cost (FLOPs, peak), when it was compiled.
      reached_target: stopped early: an eval reached the task's ``target_log_pplx``.
    """

    train: dict[str, float] = dataclasses.field(default_factory=dict)
    history: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    eval: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    decode: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    state: Any = None
    preempted: bool = False
    first_step: dict[str, float] | None = None
    cost: StepCost | None = None
    reached_target: bool = False


@dataclasses.dataclass
class StepContext:
    """The loop's state after a step, shared by the actions.

    Attributes:
      step: the step just taken (1-based: the state's step counter).
      state: the TrainState after it; metrics: its (device) metrics.
      last_step: the loop ends at this step (``num_train_steps`` or an earlier stop).
      final_step: ``num_train_steps``.
      result: the run's result, filled in by the actions.
      progress: the throughput window (paused around evals and decodes).
      stop: set by an action to end the loop after this step.
      periods_from: the task's ``periods_from_step``.
    """

    step: int
    state: Any
    metrics: Any
    last_step: int
    final_step: int
    result: RunResult
    progress: summaries.Progress
    stop: bool = False
    periods_from: int = 0

    def due(self, interval: int) -> bool:
        """Whether a period of ``interval`` steps (0: none) ends at this step; periods count
        from step ``periods_from``."""
        return bool(interval and (self.step - self.periods_from) % interval == 0)

    def every(self, interval: int) -> bool:
        """Due every ``interval`` steps (0: never) and at the end of training."""
        return self.due(interval) or self.step == self.final_step


def check_finite(state: Any, task: Any, checkpointer: train_checkpoints.Checkpointer) -> None:
    """Raises DivergenceError if a step was non-finite and the task does not skip those."""
    if task.skip_nonfinite_updates or int(state.nonfinite_steps) == 0:
        return
    raise DivergenceError(
        f"Non-finite loss or gradient at step {int(state.first_nonfinite_step) + 1}; "
        f"training stopped. The last good checkpoint (step {checkpointer.latest_step()}) is "
        f"kept in {checkpointer.directory}. Lower the learning rate or raise clipping, or set "
        "task.skip_nonfinite_updates=True to skip such steps."
    )


class FirstStepReport:
    """After the first step of the run: compile time, time to first step and the step's loss
    (the run's start, which the summary lines' losses are read against); starts the rates."""

    def __init__(
        self,
        first_step: int,
        run_start: float,
        compile_s: float,
        writer: Any,
        layout: summaries.SummaryLayout,
    ):
        self._first, self._start, self._compile_s = first_step, run_start, compile_s
        self._writer, self._layout = writer, layout

    def __call__(self, ctx: StepContext) -> None:
        if ctx.step != self._first + 1:
            return
        jax.block_until_ready(ctx.state)
        ctx.progress.start_window(ctx.step)
        first = {
            "compile_time_s": self._compile_s,
            "time_to_first_step_s": time.perf_counter() - self._start,
        }
        self._writer.write_scalars(ctx.step, self._layout.first_step_scalars(first))
        loss = float(jax.device_get(ctx.metrics["loss"]))
        summaries.log(
            f"First step done {first['time_to_first_step_s']:.1f} s after start "
            f"(compile {self._compile_s:.1f} s); loss {loss:.4f}; rates below exclude it."
        )
        ctx.result.first_step = first


class TrainSummaries:
    """Every ``interval`` steps: the period's scalars and rates to TensorBoard (named by the
    task's summary layout) and the console (the step's loss)."""

    def __init__(self, interval: int, writer: Any, task: Any, checkpointer: Any):
        self._interval, self._writer = interval, writer
        self._task, self._checkpointer = task, checkpointer
        self._layout = summaries.layout_of(task)
        self._period: list[Any] = []  # Each step's device metrics, when the layout reads them.

    def __call__(self, ctx: StepContext) -> None:
        if self._layout.uses_every_step:
            self._period.append(ctx.metrics)
        if not ctx.every(self._interval):
            return
        check_finite(ctx.state, self._task, self._checkpointer)
        steps = self._period_metrics(ctx.metrics)
        scalars = dict(steps[-1])
        rates = ctx.progress.report(ctx.step, tokens_per_step=scalars["num_tokens"])
        scalars.update(rates)
        self._writer.write_scalars(ctx.step, self._layout.train_scalars(steps, rates))
        summaries.log(ctx.progress.line(ctx.step, scalars["loss"], scalars))
        ctx.result.train = scalars
        ctx.result.history.append((ctx.step, scalars))

    def _period_metrics(self, last: Any) -> list[dict[str, float]]:
        """The host metrics of each step of the period (only the last when the layout
        reads no other), fetched at once: one stacked array per metric."""
        period, self._period = self._period or [last], []
        if len(period) == 1:
            return [{name: float(v) for name, v in jax.device_get(period[0]).items()}]
        stacked = jax.device_get(jax.tree.map(lambda *xs: jnp.stack(xs), *period))
        return [
            {name: float(values[i]) for name, values in stacked.items()} for i in range(len(period))
        ]


class Checkpointing:
    """Saves every ``interval`` steps and at the last step; on preemption, saves and stops.

    A save that fails raises :class:`train_checkpoints.CheckpointSaveError` at the latest at
    the next save point (or from :meth:`finish`); nothing complete is deleted before a
    newer save has committed: orbax deletes old checkpoints only then, and their input
    positions go only once orbax has deleted them.
    """

    def __init__(self, interval: int, checkpointer: Any, batches: prefetch.Prefetcher, task: Any):
        self._interval, self._checkpointer = interval, checkpointer
        self._batches, self._task = batches, task
        self._preemption = PreemptionWatch()

    def __call__(self, ctx: StepContext) -> None:
        ckpt = self._checkpointer
        if self._preemption.should_stop(ctx.step):
            check_finite(ctx.state, self._task, ckpt)
            self._save(ctx)
            self.finish()  # Exit code 143 says "resumable": only once the save is complete.
            summaries.log(
                f"Preempted (SIGTERM) at step {ctx.step}: checkpoint saved in {ckpt.directory}. "
                "Run the same command again to resume."
            )
            ctx.result.preempted = ctx.stop = True
        elif ctx.due(self._interval) or ctx.step == ctx.last_step or ctx.stop:
            check_finite(ctx.state, self._task, ckpt)
            self._save(ctx)

    def _save(self, ctx: StepContext) -> None:
        self.save(ctx.step, ctx.state)

    def save(self, step: int, state: Any) -> None:
        """Once the previous save is complete: this host's input position (the reader's
        own), then orbax's save of the state and the input's JSON state."""
        ckpt = self._checkpointer
        self.finish()
        with ckpt.writing(step):
            self._batches.save_position(
                lambda inp, pending: input_positions.save(ckpt.directory, step, inp, pending)
            )
        ckpt.save(step, trainable.saved(state, self._task.learner), self._batches.input_state())

    def finish(self) -> None:
        """Waits until the last save is complete, then prunes the input positions of the
        checkpoints orbax deleted after it (raises CheckpointSaveError if it failed)."""
        ckpt = self._checkpointer
        ckpt.finish_pending()
        try:
            input_positions.prune(ckpt.directory, set(ckpt.all_steps()))
        except Exception:  # noqa: BLE001 (nothing is lost: a later prune removes them)
            pass

    def close(self) -> None:
        self._preemption.close()


class Evaluation:
    """Every ``interval`` steps (0: only at the end) and at the end: every eval input.

    With ``target_log_pplx``, an eval whose ``log_pplx`` (of any input) is at most
    it stops training after this step (Checkpointing, which runs after, saves it).
    """

    def __init__(
        self, interval: int, evaluator: eval_lib.Evaluator, target_log_pplx: float | None = None
    ):
        self._interval, self._evaluator = interval, evaluator
        self._target = target_log_pplx

    def __call__(self, ctx: StepContext) -> None:
        if not ctx.every(self._interval):
            return
        with ctx.progress.paused(ctx.state):
            ctx.result.eval = self._evaluator.run(ctx.state.params, ctx.step)
        if self._target is None:
            return
        reached = {
            name: m["log_pplx"]
            for name, m in ctx.result.eval.items()
            if m.get("log_pplx", float("inf")) <= self._target
        }
        if reached and ctx.step < ctx.last_step:
            name, value = next(iter(reached.items()))
            summaries.log(
                f"eval '{name}' log_pplx {value:.4f} <= target {self._target} "
                f"(TARGET_LOG_PPLX): training stops at step {ctx.step}."
            )
            ctx.result.reached_target = ctx.stop = True

    def close(self) -> None:
        self._evaluator.close()


class Decoding:
    """Every ``interval`` steps and at the end: decode every decoder input."""

    def __init__(self, interval: int, program: decode_lib.DecodeProgram):
        self._interval, self._program = interval, program

    def __call__(self, ctx: StepContext) -> None:
        if ctx.every(self._interval):
            with ctx.progress.paused(ctx.state):
                ctx.result.decode = self._program.run(ctx.state.params, ctx.step)

    def close(self) -> None:
        self._program.close()


class PreemptionWatch:
    """Notices SIGTERM (and JAX's multi-host preemption sync point) during training."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True

    def should_stop(self, step: int) -> bool:
        """True at the step where every process should save and exit."""
        if jax.process_count() > 1:
            try:
                from jax.experimental import multihost_utils

                return multihost_utils.reached_preemption_sync_point(step)
            except Exception:  # No preemption service: fall back to this process's signal.
                pass
        return self.signalled

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
