"""TensorBoard summaries and the console progress line.

Event files are written with TensorBoard's own record writer and protos, so writing
summaries imports no TensorFlow (a run on synthetic data never loads it).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import jax
import numpy as np
from absl import logging
from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from paxlite.perf import flops
from paxlite.runtime import best_effort, storage

if TYPE_CHECKING:
    from paxlite.experiments.tasks_lib import SingleTask
    from paxlite.perf.flops import StepCost


class SummaryWriter:
    """Scalars into one TensorBoard event file in ``logdir``; on processes > 0, log lines only.

    Each scalar is stored as TensorFlow 2 stores it (a float32 tensor with the scalar
    plugin's metadata): ``tensorboard --logdir`` plots it, and TensorBoard's
    ``EventAccumulator.Tensors(tag)`` reads it back. In a bucket (``gs://``), where an
    object cannot be appended to, the file is written locally and uploaded whole at every
    flush (as TensorFlow's GCS file system does), so TensorBoard sees it during the run.
    Summaries are best-effort (``paxlite.runtime.best_effort``): a failed write is reported and
    training goes on; a later flush writes the whole file again.
    """

    def __init__(self, logdir: str | os.PathLike) -> None:
        self._records: RecordWriter | None = None
        self._local: pathlib.Path | None = None  # A bucket's file, written here first.
        self._writes_files = jax.process_index() == 0
        if not self._writes_files:
            return
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.v2"
        self._target = epath.Path(logdir) / name
        if storage.is_remote(self._target):
            local_dir = tempfile.mkdtemp(prefix="paxlite-summaries-")
            # Removed when the writer goes (or the process exits) unless close() did it.
            weakref.finalize(self, shutil.rmtree, local_dir, ignore_errors=True)
            self._local = pathlib.Path(local_dir) / name
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Appends ``{tag: value}`` at ``step`` and flushes (processes > 0: logs them)."""
        if not self._writes_files:
            logging.info("[%d] %s", step, ", ".join(f"{k}={v:.6g}" for k, v in scalars.items()))
            return
        metadata = scalar_metadata.create_summary_metadata(display_name="", description="")
        values = [
            summary_pb2.Summary.Value(
                tag=tag,
                metadata=metadata,
                tensor=tensor_util.make_tensor_proto(np.float32(value)),
            )
            for tag, value in scalars.items()
        ]
        event = event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
        )
        self._write(event)

    def close(self) -> None:
        if self._records is not None:
            self._records.close()
            self._records = None
        if self._local is not None:
            shutil.rmtree(self._local.parent, ignore_errors=True)

    def _write(self, event: event_pb2.Event) -> None:
        best_effort.write(best_effort.Output.SUMMARIES, self._target, lambda: self._append(event))

    def _append(self, event: event_pb2.Event) -> None:
        """Appends ``event`` and flushes; a bucket's object is then written whole, as TF does."""
        if self._records is None:  # The first event, or the file could not be opened before.
            if self._local is None:
                self._target.parent.mkdir(parents=True, exist_ok=True)
            self._records = RecordWriter((self._local or self._target).open("wb"))
        self._records.write(event.SerializeToString())
        self._records.flush()
        if self._local is not None:
            self._target.write_bytes(self._local.read_bytes())


def create_writer(job_log_dir: epath.PathLike, name: str) -> SummaryWriter:
    """A writer of TensorBoard event files under ``<job_log_dir>/summaries/<name>``.

    Only process 0 writes files; other processes only log.
    """
    return SummaryWriter(epath.Path(job_log_dir) / "summaries" / name)


#: A decode pass's own statistics (``decode_lib.run_decode_pass``); its other metrics are the
#: task's (SeqIO's metric functions).
DECODE_STATISTICS = ("num_examples", "num_batches", "mean_score", "mean_decode_length", "seconds")


class SummaryLayout(Protocol):
    """Where a run's TensorBoard runs go (relative to the job directory) and what their
    scalars are called: a task's ``summary_layout`` (None: :class:`PaxliteSummaries`).

    ``train_scalars`` gets the train step's metrics of every step of the summary period
    (``steps``, oldest first, host floats) and the period's rates
    (:meth:`Progress.report`'s); ``eval_scalars`` one eval pass's metrics
    (``eval_lib.run_eval_pass``'s); ``decode_scalars`` one decode pass's
    (``decode_lib.run_decode_pass``'s: :data:`DECODE_STATISTICS` and the task's metrics);
    ``first_step_scalars`` the compile time and time to
    the first step (``compile_time_s``, ``time_to_first_step_s``, seconds).
    """

    def train_run(self) -> str: ...

    def eval_run(self, input_name: str) -> str: ...

    def train_scalars(
        self, steps: Sequence[Mapping[str, float]], rates: Mapping[str, float]
    ) -> dict[str, float]: ...

    def eval_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]: ...

    def decode_run(self, input_name: str) -> str: ...

    def decode_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]: ...

    def first_step_scalars(self, first: Mapping[str, float]) -> dict[str, float]: ...


class PaxliteSummaries:
    """paxlite's runs: ``summaries/train`` (the summary step's metrics and the period's
    rates, as ``train/<name>``), ``summaries/eval_<input>`` (``eval_<input>/<name>``) and
    ``summaries/decode_<input>`` (``decode_<input>/<name>``)."""

    uses_every_step = False

    def train_run(self) -> str:
        return "summaries/train"

    def eval_run(self, input_name: str) -> str:
        return f"summaries/eval_{input_name}"

    def train_scalars(
        self, steps: Sequence[Mapping[str, float]], rates: Mapping[str, float]
    ) -> dict[str, float]:
        return {f"train/{k}": float(v) for k, v in {**steps[-1], **rates}.items()}

    def eval_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]:
        return {f"eval_{input_name}/{k}": float(v) for k, v in metrics.items()}

    def decode_run(self, input_name: str) -> str:
        return f"summaries/decode_{input_name}"

    def decode_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]:
        return {f"decode_{input_name}/{k}": float(v) for k, v in metrics.items()}

    def first_step_scalars(self, first: Mapping[str, float]) -> dict[str, float]:
        return {f"train/{k}": float(v) for k, v in first.items()}


def layout_of(task: SingleTask) -> SummaryLayout:
    """The task's summary layout (paxlite's when it sets none)."""
    return PaxliteSummaries() if task.summary_layout is None else task.summary_layout


def writer_of(job_log_dir: epath.PathLike, run: str) -> SummaryWriter:
    """A writer of the TensorBoard run ``run`` (a directory relative to the job's)."""
    return SummaryWriter(epath.Path(job_log_dir) / run)


def write_scalars(
    writer: SummaryWriter, step: int, prefix: str, scalars: Mapping[str, float]
) -> None:
    """Writes ``prefix/name`` scalars at ``step`` and flushes."""
    writer.write_scalars(step, {f"{prefix}/{k}": float(v) for k, v in scalars.items()})


class Progress:
    """Measures throughput between summary points and formats the console line.

    The window starts at :meth:`start_window` (call it once the warm-up steps,
    which include compilation, are done and their results are ready), so the
    first interval's rates exclude them. With ``cost`` (a
    :class:`paxlite.perf.flops.StepCost`), reports also carry TFLOP/s per device and
    MFU under ``cost.definition``.
    """

    def __init__(self, start_step: int, total_steps: int, cost: StepCost | None = None):
        self._total = total_steps
        self._cost = cost
        self._last_step = start_step
        self._last_time = time.perf_counter()
        self._warmup: tuple[int, float] | None = None

    def start_window(self, step: int) -> None:
        """Rates from now on count steps after ``step`` (whose results are ready).

        A report at ``step`` itself (nothing timed yet) gives the warm-up's rates.
        """
        now = time.perf_counter()
        self._warmup = (step - self._last_step, now - self._last_time)
        self._last_step, self._last_time = step, now

    @contextlib.contextmanager
    def paused(self, pending: object = None) -> Iterator[None]:
        """Leaves the time spent inside (eval, decode) out of the training rates.

        ``pending`` (e.g. the train state) is waited for first, so steps still
        running on the devices stay in the window.
        """
        jax.block_until_ready(pending)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._last_time += time.perf_counter() - start

    def report(self, step: int, tokens_per_step: float) -> dict[str, float]:
        """Rates since the last report (and resets the window).

        Returns ``steps_per_sec``, ``step_time_ms``, ``tokens_per_sec`` (global,
        counted tokens: ``tokens_per_step`` is the batch's non-padding tokens),
        ``tokens_per_sec_per_device`` and, with a cost, ``tflops_per_sec_per_device``
        (model FLOPs) and ``mfu`` (a fraction of the peak).
        """
        now = time.perf_counter()
        steps = step - self._last_step
        seconds = max(now - self._last_time, 1e-9)
        if steps == 0 and self._warmup is not None:
            steps, seconds = self._warmup
        self._last_step, self._last_time = step, now
        return rates(steps, seconds, tokens_per_step, self._cost)

    def line(self, step: int, loss: float, rates: Mapping[str, float]) -> str:
        remaining = (self._total - step) / max(rates["steps_per_sec"], 1e-9)
        eta = time.strftime("%H:%M:%S", time.gmtime(remaining))
        text = (
            f"step {step:>7d}/{self._total} | loss {loss:8.4f} | "
            f"{rates['step_time_ms']:8.1f} ms/step | {rates['steps_per_sec']:7.2f} steps/s | "
            f"{rates['tokens_per_sec']:10.0f} tokens/s "
            f"({rates['tokens_per_sec_per_device']:.0f}/device)"
        )
        if "mfu" in rates:
            text += (
                f" | {rates['tflops_per_sec_per_device']:.4g} TFLOP/s/device | "
                f"MFU {100 * rates['mfu']:.2f}% ({self._cost.definition.value})"
            )
        return text + f" | ETA {eta}"


def rates(
    steps: int, seconds: float, tokens_per_step: float, cost: StepCost | None
) -> dict[str, float]:
    """Throughput of ``steps`` steps in ``seconds`` (see :meth:`Progress.report`)."""
    steps_per_sec = steps / seconds if steps > 0 else 0.0
    num_devices = cost.num_devices if cost is not None else jax.device_count()
    out = {
        "steps_per_sec": steps_per_sec,
        "step_time_ms": 1000.0 * seconds / steps if steps > 0 else 0.0,
        "tokens_per_sec": steps_per_sec * tokens_per_step,
        "tokens_per_sec_per_device": steps_per_sec * tokens_per_step / num_devices,
    }
    if cost is not None and cost.model_flops_per_step > 0:
        achieved = flops.achieved_flops(
            cost.model_flops_per_step, steps_per_sec, num_devices, cost.peak
        )
        out["tflops_per_sec_per_device"] = achieved.tflops_per_sec_per_device
        if achieved.mfu is not None:
            out["mfu"] = achieved.mfu
    return out


def log(message: str) -> None:
    """A progress message on the console (process 0 only) and in the absl log file."""
    if jax.process_index() == 0:  # One write: lines of two threads never interleave.
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    if logging.get_absl_handler().use_absl_log_file:
        logging.info(message)
