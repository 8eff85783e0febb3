"""Benchmark an experiment's train step: throughput, model FLOPs, MFU; a report people read.

``paxlite --exp=NAME --job_log_dir=DIR --mode=benchmark [--bench_steps=N --bench_warmup=K]``
(or ``paxlite-bench --exp=NAME --job_log_dir=DIR [--steps=N --warmup=K]``) initializes
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
import json
import math
import os
import pathlib
import platform
import sys
import time
from importlib import metadata
from typing import Any

import flax.linen as nn
import jax

import paxlite
from paxlite import flops, mfu, prefetch, summaries, train, trainer_lib


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
    definition: flops.FlopsDefinition = flops.DEFAULT_DEFINITION

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 1:
            raise ValueError(
                f"Benchmark needs at least 1 timed and 1 warm-up step (the warm-up waits for "
                f"compilation); got --bench_steps={self.steps} --bench_warmup={self.warmup}."
            )


def init_state(job: train.Job) -> tuple[Any, Any, Any, Any]:
    """``(state, jitted train step, global sample batch, replicated key)``: fresh, no checkpoint."""
    batch_sharding = train.batch_sharding_of(job)
    sample = job.train_input.get_next()
    job.train_input.reset()
    global_sample = train._to_global(sample, batch_sharding)
    init_fn = trainer_lib.make_init_fn(job.task)
    _, shardings = train.abstract_train_state(job, init_fn, global_sample)
    init_key, train_key = jax.random.split(jax.random.key(job.experiment.SEED))
    init = jax.jit(lambda k, b: nn.unbox(init_fn(k, b)), out_shardings=shardings)
    state = init(init_key, global_sample)
    step = train.jit_train_step(job, shardings, batch_sharding)
    key = train.replicate(train_key, job.mesh)
    return state, step, global_sample, key


def run_benchmark(job: train.Job, settings: BenchSettings) -> dict[str, Any]:
    """Runs the benchmark in this process; returns the report's figures (see module doc)."""
    start = time.perf_counter()
    batch_sharding = train.batch_sharding_of(job)
    peak = mfu.peak_for(mfu.model_dtype(job.task.model), override_tflops=settings.peak_tflops)
    with jax.set_mesh(job.mesh), nn.logical_axis_rules(job.rules):
        state, jitted, global_sample, key = init_state(job)
        step_fn, compile_s = train.compile_train_step(jitted, state, global_sample, key)
        cost = mfu.step_cost(
            job.task.model,
            global_sample,
            step_fn,
            num_devices=job.mesh.size,
            definition=settings.definition,
            peak=peak,
        )
        summaries.log(f"Compiled the train step in {compile_s:.1f} s. {cost.describe()}")
        to_global = lambda b: train._to_global(b, batch_sharding)  # noqa: E731
        batches = prefetch.Prefetcher(job.train_input, to_global)
        try:
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
    job: train.Job,
    settings: BenchSettings,
    cost: mfu.StepCost,
    compile_s: float,
    first_step_s: float,
    tokens_per_step: float,
    windows: list[dict],
) -> dict[str, Any]:
    n = job.mesh.size
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
        flops_per_device = overall["steps_per_sec"] * per_step / n
        by_definition[name] = {
            "formula": _formula(name),
            "flops_per_step": per_step,
            "tflops_per_sec_per_device": flops_per_device / 1e12,
            "mfu": flops_per_device / cost.peak.flops if cost.peak else None,
        }
    exp = type(job.experiment)
    return {
        "experiment": f"{exp.__module__}.{exp.__qualname__}",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_description(),
        "devices": device_description(job),
        "versions": versions(),
        "model": {
            "shape": dataclasses.asdict(cost.shape) if cost.shape else None,
            "description": flops.describe(cost.shape) if cost.shape else None,
            "dtype": mfu.dtype_name(mfu.model_dtype(job.task.model)),
            "non_embedding_params": cost.shape.non_embedding_params if cost.shape else None,
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
    return flops.FlopsDefinition(name).formula


def machine_description() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), cpu)
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }


def device_description(job: train.Job) -> dict[str, Any]:
    device = job.mesh.devices.flat[0]
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "num_devices": job.mesh.size,
        "num_processes": jax.process_count(),
        "mesh": {k: int(v) for k, v in job.mesh.shape.items()},
    }


def versions() -> dict[str, str]:
    """paxlite's own version (from the source that runs, installed or not) and its libraries'."""
    out = {"paxlite": paxlite.__version__}
    for name in ("jax", "jaxlib", "flax", "optax", "numpy", "fiddle"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def format_markdown(fig: dict[str, Any]) -> str:
    """``benchmark.md``: what ran, the headline figures, FLOPs by definition."""
    dev, model = fig["devices"], fig["model"]
    peak = fig["peak"]
    lines = [
        f"# Benchmark: {fig['experiment']}",
        "",
        f"{fig['date']} on {fig['machine']['cpu']} ({fig['machine']['cpu_count']} cores), "
        f"{dev['num_devices']} {dev['platform']} device(s) ({dev['device_kind']}), "
        f"mesh {dev['mesh']}, {dev['num_processes']} process(es).",
        f"Model: {model['description'] or 'not a Transformer LM'}, {model['dtype']}; "
        f"batch {fig['global_batch']} x {fig['seq_len']} tokens.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in fig["versions"].items()) + ".",
        "",
        "| figure | value |",
        "|---|---|",
        f"| compile time | {fig['compile_time_s']:.2f} s |",
        f"| time to first step | {fig['time_to_first_step_s']:.2f} s |",
        f"| warm-up steps (not timed) | {fig['warmup_steps']} |",
        f"| timed steps | {fig['timed_steps']} in {fig['timed_seconds']:.2f} s |",
        f"| step time (mean) | {fig['step_time_ms']:.2f} ms |",
        "| step time per window | "
        + ", ".join(f"{t:.1f}" for t in fig["step_time_ms_windows"])
        + " ms |",
        f"| tokens/s (global) | {fig['tokens_per_sec']:,.0f} |",
        f"| tokens/s per device | {fig['tokens_per_sec_per_device']:,.0f} |",
    ]
    if peak:
        lines.append(
            f"| peak per device | {peak['tflops']:.4g} TFLOP/s ({peak['dtype']}; "
            f"{peak['source']}) |"
        )
    if fig["mfu"] is not None:
        lines.append(f"| **MFU ({fig['mfu_definition']})** | **{100 * fig['mfu']:.2f}%** |")
    lines += [
        "",
        "| FLOPs count | formula | FLOPs per step | TFLOP/s per device | MFU |",
        "|---|---|---|---|---|",
    ]
    for name, row in fig["by_definition"].items():
        mfu_text = f"{100 * row['mfu']:.2f}%" if row["mfu"] is not None else "-"
        lines.append(
            f"| {name} | `{row['formula']}` | {flops.format_flops(row['flops_per_step'])} | "
            f"{row['tflops_per_sec_per_device']:.4g} | {mfu_text} |"
        )
    lines += ["", f"XLA count: {fig['xla_flops_note']}.", ""]
    return "\n".join(lines)


def plot(fig: dict[str, Any], path: pathlib.Path) -> bool:
    """``benchmark.png``: tokens/s per window (left), MFU by FLOPs count (right).

    Returns False (and writes nothing) if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    windows = fig["windows"]
    ends = list(_cumulative(w["steps"] for w in windows))
    left.plot(ends, [w["tokens_per_sec"] for w in windows], marker="o")
    left.set_xlabel(f"timed step (after {fig['warmup_steps']} warm-up)")
    left.set_ylabel("tokens/s (global)")
    left.set_ylim(bottom=0)
    left.set_title("Throughput per window")
    names = list(fig["by_definition"])
    values = [100 * (fig["by_definition"][n]["mfu"] or 0.0) for n in names]
    bars = right.bar(names, values, color=["C0" if n != "xla" else "C7" for n in names])
    right.bar_label(bars, fmt="%.1f%%")
    right.set_ylabel("% of peak")
    right.set_title(f"MFU by FLOPs count (headline: {fig['mfu_definition']})")
    figure.suptitle(f"{fig['experiment'].rsplit('.', 1)[-1]}: {fig['model']['description']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _cumulative(values):
    total = 0
    for v in values:
        total += v
        yield total


def write_report(fig: dict[str, Any], job_log_dir: pathlib.Path) -> list[pathlib.Path]:
    """Writes benchmark.json, benchmark.md and benchmark.png; returns their paths."""
    job_log_dir.mkdir(parents=True, exist_ok=True)
    paths = [job_log_dir / "benchmark.json", job_log_dir / "benchmark.md"]
    paths[0].write_text(json.dumps(fig, indent=2, default=_json_default) + "\n")
    paths[1].write_text(format_markdown(fig))
    if plot(fig, job_log_dir / "benchmark.png"):
        paths.append(job_log_dir / "benchmark.png")
    return paths


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def summary_line(fig: dict[str, Any]) -> str:
    mfu_text = f", MFU {100 * fig['mfu']:.2f}% ({fig['mfu_definition']})" if fig["mfu"] else ""
    return (
        f"Benchmark: {fig['step_time_ms']:.1f} ms/step, {fig['tokens_per_sec']:,.0f} tokens/s "
        f"({fig['tokens_per_sec_per_device']:,.0f} per device), "
        f"{fig['tflops_per_sec_per_device'] or 0:.4g} TFLOP/s per device{mfu_text}"
    )


def run() -> None:
    """``paxlite-bench --exp=NAME --job_log_dir=DIR [--steps=N --warmup=K]`` (console script)."""
    from paxlite import main

    renames = {"--steps": "--bench_steps", "--warmup": "--bench_warmup"}
    argv = [sys.argv[0], "--mode=benchmark"]
    for arg in sys.argv[1:]:
        name, sep, value = arg.partition("=")
        argv.append(renames.get(name, name) + sep + value)
    sys.argv = argv
    main.run()
