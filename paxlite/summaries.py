"""TensorBoard summaries (clu metric writers) and the console progress line."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Mapping

import jax
from absl import logging
from clu import metric_writers


def create_writer(job_log_dir: pathlib.Path, name: str) -> metric_writers.MetricWriter:
    """A writer of TensorBoard event files under ``<job_log_dir>/summaries/<name>``.

    Only process 0 writes files; other processes only log.
    """
    logdir = pathlib.Path(job_log_dir) / "summaries" / name
    return metric_writers.create_default_writer(
        str(logdir), just_logging=jax.process_index() > 0, asynchronous=False
    )


def write_scalars(
    writer: metric_writers.MetricWriter, step: int, prefix: str, scalars: Mapping[str, float]
) -> None:
    """Writes ``prefix/name`` scalars at ``step`` and flushes."""
    writer.write_scalars(step, {f"{prefix}/{k}": float(v) for k, v in scalars.items()})
    writer.flush()


class Progress:
    """Measures throughput between summary points and formats the console line."""

    def __init__(self, start_step: int, total_steps: int):
        self._total = total_steps
        self._last_step = start_step
        self._last_time = time.perf_counter()

    def report(self, step: int, tokens_per_step: float) -> dict[str, float]:
        """steps/s and tokens/s since the last report (and resets the window)."""
        now = time.perf_counter()
        steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
        self._last_step, self._last_time = step, now
        return {"steps_per_sec": steps_per_sec, "tokens_per_sec": steps_per_sec * tokens_per_step}

    def line(self, step: int, loss: float, rates: Mapping[str, float]) -> str:
        remaining = (self._total - step) / max(rates["steps_per_sec"], 1e-9)
        eta = time.strftime("%H:%M:%S", time.gmtime(remaining))
        return (
            f"step {step:>7d}/{self._total} | loss {loss:8.4f} | "
            f"{rates['steps_per_sec']:7.2f} steps/s | {rates['tokens_per_sec']:10.0f} tokens/s | "
            f"ETA {eta}"
        )


def log(message: str) -> None:
    """A progress message on the console (process 0 only) and in the absl log file."""
    if jax.process_index() == 0:
        print(message, flush=True)
    if logging.get_absl_handler().use_absl_log_file:
        logging.info(message)
