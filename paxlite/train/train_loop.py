"""The training loop: step, then the periodic actions (summaries, checkpoints, eval, decode).

Setup (state, compiled step, actions) is in :func:`_prepare`; the loop itself is
:func:`run`. Evaluation-only and decode-only runs are ``paxlite.evaluation.eval_run`` and
``paxlite.evaluation.decode_run``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from paxlite.checkpoints import train_checkpoints
from paxlite.checkpoints.init_from import abstract_of
from paxlite.evaluation import decode_lib, eval_lib
from paxlite.perf import mfu, profiling
from paxlite.perf.flops import model_dtype
from paxlite.runtime.job import Job
from paxlite.train import prefetch, summaries, train_setup
from paxlite.train.periodic_actions import (
    Checkpointing,
    Decoding,
    Evaluation,
    FirstStepReport,
    RunResult,
    StepContext,
    TrainSummaries,
)
from praxis_lite.flops import FlopsDefinition


@dataclasses.dataclass
class _Loop:
    """What the loop needs, built by :func:`_prepare`."""

    step_fn: Any
    run: train_setup.RunState
    batches: prefetch.Prefetcher
    actions: list[Any]
    checkpointing: Checkpointing
    checkpointer: train_checkpoints.Checkpointer
    progress: summaries.Progress
    profiling: profiling.Profiling
    closers: list[Any]

    def close(self) -> None:
        """Stops what runs beside the loop (on success, error or preemption alike)."""
        self.profiling.close()
        self.batches.close()
        self.checkpointing.close()
        self.checkpointer.close()
        for closer in self.closers:
            closer.close()


def run(
    job: Job,
    *,
    evaluate: bool = False,
    stop_at_step: int | None = None,
    peak_tflops: float | None = None,
    flops_definition: FlopsDefinition | None = None,
    restore_fallback: bool = False,
) -> RunResult:
    """Trains to ``task.num_train_steps`` from the latest checkpoint (or a fresh state).

    ``evaluate`` runs the eval inputs every ``task.eval_interval_steps`` and at the
    end, and decodes every ``task.decode_interval_steps`` when the job has decoder
    inputs. ``stop_at_step`` ends training early at that step (checkpointed), as if
    the job had been preempted there; running again resumes to ``num_train_steps``.
    ``peak_tflops`` (per device) overrides the peak MFU is measured against;
    ``flops_definition`` picks the model-FLOPs count. ``restore_fallback``: resume from the
    newest checkpoint that reads, damaged newer ones moved aside
    (``Checkpointer.restore_latest``).

    Raises:
      DivergenceError: a non-finite loss/gradient (unless the task skips them);
        the checkpoints written before it stay, nothing after it is saved.
      CheckpointSaveError: a checkpoint could not be written (at the latest at the
        next save point); the complete ones before it stay.
      CheckpointCorruptError: the checkpoint to resume from cannot be read.
    """
    run_start = time.perf_counter()
    task = job.task
    peak = mfu.peak_for(model_dtype(task.model), override_tflops=peak_tflops)
    result = RunResult()
    last_step = min(task.num_train_steps, stop_at_step or task.num_train_steps)
    with job.scope():
        checkpointer = train_checkpoints.Checkpointer(
            job.job_log_dir,
            max_to_keep=task.max_to_keep,
            timeout_secs=task.async_timeout_secs,
            restore_fallback=restore_fallback,
            checkpoint_format=task.checkpoint_format,
        )
        try:
            loop = _prepare(
                job, result, evaluate, (last_step, run_start), peak, flops_definition, checkpointer
            )
        except BaseException:
            checkpointer.close()  # Its orbax manager (and a save it may have started).
            raise

        state, step = loop.run.state, int(loop.run.state.step)
        try:
            while step < last_step:
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, metrics = loop.step_fn(state, loop.batches.next(), loop.run.train_key)
                step += 1
                ctx = StepContext(
                    step,
                    state,
                    metrics,
                    last_step,
                    task.num_train_steps,
                    result,
                    loop.progress,
                    periods_from=task.periods_from_step,
                )
                for action in loop.actions:
                    action(ctx)
                if ctx.stop:
                    break
            loop.checkpointing.finish()  # The last save is complete, or this raises.
        finally:
            loop.close()
    result.state = state
    return result


def _prepare(
    job: Job,
    result: RunResult,
    evaluate: bool,
    last_step_and_start: tuple[int, float],
    peak: mfu.Peak,
    definition: FlopsDefinition | None,
    checkpointer: train_checkpoints.Checkpointer,
) -> _Loop:
    """State (restored or fresh), the compiled step, its cost and the periodic actions.

    ``last_step_and_start``: the step this run stops at, and when it started
    (``time.perf_counter()``)."""
    task = job.task
    last_step, run_start = last_step_and_start
    run = train_setup.init_or_restore(job, train_setup.StateSource.LATEST_OR_FRESH, checkpointer)
    train_setup.log_state_sizes(job, run)
    if jax.process_index() == 0:  # What the checkpoint format keeps about the state (T5X's).
        checkpointer.format.describe(job.job_log_dir, abstract_of(run.state))
    step = int(run.state.step)
    step_fn, compile_s = None, 0.0
    if step >= task.num_train_steps:
        summaries.log(f"Already at step {step} >= num_train_steps; nothing to train.")
    elif step < last_step:
        step_fn, compile_s, result.cost = train_setup.compile_with_cost(job, run, peak, definition)
    batches = prefetch.Prefetcher(job.train_input, job.to_global, replay=run.input_replay)
    layout = summaries.layout_of(task)
    writer = summaries.writer_of(job.job_log_dir, layout.train_run())
    checkpointing = Checkpointing(task.save_interval_steps, checkpointer, batches, task)
    if task.save_at_start and step not in checkpointer.all_steps():
        checkpointing.save(step, run.state)  # T5X's: the state the run starts from.
    tracing = profiling.Profiling(task, step, job.job_log_dir)
    evaluations = _evaluation_actions(job, run, evaluate)
    actions = [  # Evaluation before Checkpointing: an early stop is saved at its step.
        tracing,
        FirstStepReport(step, run_start, compile_s, writer, layout),
        TrainSummaries(task.summary_interval_steps, writer, task, checkpointer),
        *evaluations,
        checkpointing,
    ]
    progress = summaries.Progress(step, task.num_train_steps, result.cost)
    closers = [writer, *evaluations]
    return _Loop(
        step_fn, run, batches, actions, checkpointing, checkpointer, progress, tracing, closers
    )


def _evaluation_actions(job: Job, run: train_setup.RunState, evaluate: bool) -> list[Any]:
    """Eval actions, and decode actions when the job has decoder inputs and a decode interval."""
    task = job.task
    if not evaluate:
        return []
    actions: list[Any] = []
    if job.eval_inputs:
        eval_step = train_setup.jit_eval_step(job, run.shardings.params)
        evaluator = eval_lib.Evaluator(
            eval_step, job.eval_inputs, job.job_log_dir, job.to_global, summaries.layout_of(task)
        )
        actions.append(Evaluation(task.eval_interval_steps, evaluator, task.target_log_pplx))
    if task.decode_interval_steps and job.decoder_inputs:
        programs = task.inference_evaluator or decode_lib.DecodeProgram
        program = programs.for_job(job, run.shardings.params)
        actions.append(Decoding(task.decode_interval_steps, program))
    return actions
