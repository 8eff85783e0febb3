"""Benchmark an experiment's train step: throughput, model FLOPs, MFU; a report people read.

``paxlite --exp=NAME --job_log_dir=DIR --mode=benchmark [--bench_steps=N --bench_warmup=K]``
(or the console script ``paxlite-bench --exp=NAME --job_log_dir=DIR [--steps=N --warmup=K]``)
initializes
fresh parameters (no checkpoint is read or written), compiles the train step,
runs ``K`` warm-up steps (untimed), then ``N`` timed steps on the experiment's
own training input (prefetched, as in training), and writes into ``DIR``:

* ``benchmark.json``: every figure, the machine and devices, library versions,
  and the name and formula of every FLOPs definition;
* ``benchmark.md``: the same as tables;
* ``benchmark.png``: throughput per timing window and MFU by definition.

The timed steps are cut into windows (one device sync at the end of each; none
between steps), so the report gives a spread without slowing the steps down.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import jax

from paxlite.perf import bench_report, flops, mfu
from paxlite.perf.flops import model_dtype
from paxlite.runtime import storage
from paxlite.runtime.job import Job
from paxlite.train import prefetch, summaries, train_setup
from praxis_lite.flops import DEFAULT_DEFINITION, FlopsDefinition


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """How to benchmark.

    Attributes:
      steps: timed steps.
      warmup: untimed steps first (the first one also waits for compilation).
      windows: the timed steps are cut into this many windows (at most ``steps``).
      peak_tflops: override of the peak per device (TFLOP/s).
      definition: the FLOPs definition of the headline MFU.
    """

    steps: int = 20
    warmup: int = 3
    windows: int = 5
    peak_tflops: float | None = None
    definition: FlopsDefinition = DEFAULT_DEFINITION

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 1:
            raise ValueError(
                f"Benchmark needs at least 1 timed and 1 warm-up step (the warm-up waits for "
                f"compilation); got --bench_steps={self.steps} --bench_warmup={self.warmup}."
            )


def run_benchmark(job: Job, settings: BenchSettings) -> dict[str, Any]:
    """Runs the benchmark in this process; returns the report's figures (see module doc)."""
    start = time.perf_counter()
    peak = mfu.peak_for(model_dtype(job.task.model), override_tflops=settings.peak_tflops)
    with job.scope():
        run = train_setup.init_or_restore(job, train_setup.StateSource.FRESH)
        step_fn, compile_s, cost = train_setup.compile_with_cost(
            job, run, peak, settings.definition
        )
        batches = prefetch.Prefetcher(job.train_input, job.to_global)
        try:
            state, key = run.state, run.train_key
            for i in range(settings.warmup):
                state, metrics = step_fn(state, batches.next(), key)
                if i == 0:
                    jax.block_until_ready(state)
                    first_step_s = time.perf_counter() - start
            jax.block_until_ready(state)
            tokens = float(jax.device_get(metrics)["num_tokens"])
            windows = _timed_windows(step_fn, state, batches, key, settings)
        finally:
            batches.close()
    return _figures(job, settings, cost, compile_s, first_step_s, tokens, windows)


def run_and_report(job: Job, settings: BenchSettings) -> None:
    """``--mode=benchmark``: runs the benchmark, writes the report, prints where (process 0).

    Raises:
      StorageWriteError: the report could not be written (the figures are printed first).
    """
    figures = run_benchmark(job, settings)
    if jax.process_index() == 0:
        print(bench_report.summary_line(figures))
        try:
            paths = bench_report.write_report(figures, job.job_log_dir)
        except Exception as e:  # noqa: BLE001 (file systems and gcsfs raise many kinds)
            raise storage.StorageWriteError(
                f"the benchmark report could not be written to {job.job_log_dir}: "
                f"{storage.one_line(e)} (rerun the same command once the storage works)"
            ) from e
        print("Wrote " + ", ".join(str(p) for p in paths))


def _timed_windows(step_fn, state, batches, key, settings: BenchSettings) -> list[dict]:
    """``[{'steps': n, 'seconds': s}]`` for consecutive windows of the timed steps."""
    count = max(1, min(settings.windows, settings.steps))
    sizes = [settings.steps // count + (i < settings.steps % count) for i in range(count)]
    windows = []
    for size in sizes:
        begin = time.perf_counter()
        for _ in range(size):
            state, _ = step_fn(state, batches.next(), key)
        jax.block_until_ready(state)
        windows.append({"steps": size, "seconds": time.perf_counter() - begin})
    return windows


def _figures(
    job: Job,
    settings: BenchSettings,
    cost: flops.StepCost,
    compile_s: float,
    first_step_s: float,
    tokens_per_step: float,
    windows: list[dict],
) -> dict[str, Any]:
    steps = sum(w["steps"] for w in windows)
    seconds = sum(w["seconds"] for w in windows)
    overall = summaries.rates(steps, seconds, tokens_per_step, cost)
    per_window = [
        summaries.rates(w["steps"], w["seconds"], tokens_per_step, cost) | w for w in windows
    ]
    by_definition = {}
    counts = dict(cost.analytic_flops)
    if cost.xla_flops:
        counts["xla"] = cost.xla_flops
    for name, per_step in counts.items():
        achieved = flops.achieved_flops(
            per_step, overall["steps_per_sec"], cost.num_devices, cost.peak
        )
        by_definition[name] = {
            "formula": _formula(name),
            "flops_per_step": per_step,
            "tflops_per_sec_per_device": achieved.tflops_per_sec_per_device,
            "mfu": achieved.mfu,
        }
    exp = type(job.experiment)
    counted = cost.train_flops
    return {
        "experiment": f"{exp.__module__}.{exp.__qualname__}",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": bench_report.machine_description(),
        "devices": bench_report.device_description(job),
        "versions": bench_report.versions(),
        "model": {
            "description": counted.description if counted else None,
            "dtype": mfu.dtype_name(model_dtype(job.task.model)),
            "non_embedding_params": counted.non_embedding_params if counted else None,
        },
        "global_batch": cost.global_batch,
        "seq_len": cost.seq_len,
        "tokens_per_step": cost.global_batch * cost.seq_len,
        "counted_tokens_per_step": tokens_per_step,
        "compile_time_s": compile_s,
        "time_to_first_step_s": first_step_s,
        "warmup_steps": settings.warmup,
        "timed_steps": steps,
        "timed_seconds": seconds,
        "step_time_ms": overall["step_time_ms"],
        "step_time_ms_windows": [1000 * w["seconds"] / w["steps"] for w in windows],
        "steps_per_sec": overall["steps_per_sec"],
        "tokens_per_sec": overall["tokens_per_sec"],
        "tokens_per_sec_per_device": overall["tokens_per_sec_per_device"],
        "peak": dataclasses.asdict(cost.peak) if cost.peak else None,
        "mfu_definition": cost.definition.value,
        "mfu": overall.get("mfu"),
        "tflops_per_sec_per_device": overall.get("tflops_per_sec_per_device"),
        "by_definition": by_definition,
        "xla_flops_note": cost.xla_flops_note,
        "windows": per_window,
    }


def _formula(name: str) -> str:
    if name == "xla":
        return "XLA cost_analysis()['flops'] of the compiled step (executed work)"
    return FlopsDefinition(name).formula
