"""The benchmark's report: ``benchmark.json``, ``benchmark.md`` and ``benchmark.png``, and what ran.

The figures come from ``paxlite.perf.bench.run_benchmark``; this module renders them
and describes the machine, the devices and the library versions.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from importlib import metadata
from typing import Any

import jax
from etils import epath

import paxlite
from paxlite.perf import flops


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


def device_description(job: Any) -> dict[str, Any]:
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
        f"Model: {model['description'] or 'FLOPs not counted'}, {model['dtype']}; "
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


def plot(fig: dict[str, Any], path: epath.Path) -> bool:
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
    with path.open("wb") as f:  # A local path or a bucket's.
        figure.savefig(f, format="png", dpi=100)
    plt.close(figure)
    return True


def _cumulative(values):
    total = 0
    for v in values:
        total += v
        yield total


def write_report(fig: dict[str, Any], job_log_dir: epath.Path) -> list[epath.Path]:
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
