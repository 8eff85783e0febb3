"""Profiler traces of chosen train steps (Pax's PROFILER_* knobs), where TensorBoard finds them.

Pax's meanings: the trace starts before the run's ``profiler_capture_step``-th train step,
counted from the step the run started at (0: its first step, as Pax counts
``step - initial_step``), and covers ``profiler_num_steps`` steps, longer if they take
less than ``profiler_min_duration_sec``; only processes with an index below
``profiler_max_num_hosts`` (None: all) trace. ``jax.profiler`` writes::

    <job_log_dir>/summaries/train/plugins/profile/<run>/<host>.xplane.pb
                                                        <host>.trace.json.gz (Perfetto)

(TensorBoard's profile plugin reads the first with ``--logdir <job_log_dir>/summaries``;
ui.perfetto.dev opens the second). For a ``gs://`` job dir the trace is written locally
and then copied there. A trace that cannot be written is reported and training goes on
(``paxlite.runtime.best_effort``).
"""

from __future__ import annotations

import functools
import pathlib
import tempfile
import time
from typing import Any

import jax
from etils import epath

from paxlite.runtime import best_effort, storage
from paxlite.train import summaries


def trace_dir(job_log_dir: epath.PathLike) -> epath.Path:
    """The directory whose ``plugins/profile`` TensorBoard reads (the 'train' run's)."""
    return epath.Path(job_log_dir) / "summaries" / "train"


class Profiling:
    """A loop action: starts a trace before the capture step, stops it after enough steps."""

    def __init__(self, task: Any, initial_step: int, job_log_dir: epath.PathLike) -> None:
        capture = task.profiler_capture_step
        hosts = task.profiler_max_num_hosts
        chosen = hosts is None or jax.process_index() < hosts
        #: The state's step counter before the first traced step (None: no trace here).
        self._start_at = initial_step + capture if capture is not None and chosen else None
        self._num_steps, self._min_seconds = task.profiler_num_steps, task.profiler_min_duration_sec
        self._target = trace_dir(job_log_dir)
        self._local: tempfile.TemporaryDirectory | None = None
        self._started: float | None = None
        if self._start_at == initial_step:
            self._start()

    def __call__(self, ctx: Any) -> None:
        if self._start_at is None:
            return
        if self._started is None:
            if ctx.step == self._start_at:
                self._start()
            return
        traced = ctx.step - self._start_at
        long_enough = time.perf_counter() - self._started >= self._min_seconds
        if (traced >= self._num_steps and long_enough) or ctx.step == ctx.last_step:
            jax.block_until_ready(ctx.state)  # The traced steps' device work is in the trace.
            self._stop(ctx.step)

    def close(self) -> None:
        """Ends a trace the loop left running (an error, a preemption)."""
        if self._started is not None:
            self._stop(None)

    def _start(self) -> None:
        where = self._target
        if storage.is_remote(where):
            self._local = tempfile.TemporaryDirectory(prefix="paxlite-profile-")
            where = pathlib.Path(self._local.name)
        jax.profiler.start_trace(str(where), create_perfetto_trace=True)
        self._started = time.perf_counter()

    def _stop(self, last_step: int | None) -> None:
        where = self._target / "plugins" / "profile"
        written = best_effort.write(best_effort.Output.PROFILE, where, jax.profiler.stop_trace)
        seconds = time.perf_counter() - self._started
        self._started, first = None, self._start_at + 1
        self._start_at = None  # One capture per run, as Pax's.
        if self._local is not None:
            copy = functools.partial(_copy_tree, pathlib.Path(self._local.name), self._target)
            written = written and best_effort.write(best_effort.Output.PROFILE, where, copy)
            self._local.cleanup()
        if not written:
            return
        steps = f"steps {first}-{last_step}" if last_step else f"from step {first}"
        summaries.log(
            f"Profile of train {steps} ({seconds:.1f} s) in {where}: "
            f"tensorboard --logdir {self._target.parent} (Profile tab), or the .trace.json.gz "
            "in ui.perfetto.dev"
        )


def _copy_tree(local: pathlib.Path, target: epath.Path) -> None:
    """Copies every file under ``local`` to the same relative path under ``target``."""
    for file in sorted(p for p in local.rglob("*") if p.is_file()):
        destination = target / file.relative_to(local).as_posix()
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(file.read_bytes())
