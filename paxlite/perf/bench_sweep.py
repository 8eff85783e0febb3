"""Weak-scaling sweep: the benchmark at growing device counts, one combined report.

    python -m paxlite.perf.bench_sweep --job_log_dir=DIR [--devices=1,2,4,8] [--exp=LmSyntheticTiny]

Like Pax's TPU v4 weak-scaling chart: the model grows with the device count.
Here each point is a separate ``paxlite --mode=benchmark`` process on ``n`` fake
CPU devices (``--xla_force_host_platform_device_count=n``), run one after
another, with mesh ``(1, n, 1)``, the experiment's per-device batch, and model
width ``MODEL_DIMS = base * sqrt(n)`` rounded to a multiple of 32 (hidden dims
4x). On CPU the fake devices share this machine's cores, and each point's peak
per device is the machine's matmul peak (measured in that process) divided by
``n``, so MFU stays comparable across points. Writes ``DIR/sweep.json``,
``DIR/sweep.md`` and ``DIR/sweep.png`` (MFU and TFLOP/s per device against device
count); each point's own report is in ``DIR/devices_<n>/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Any

from paxlite.experiments import registry


def model_dims_for(devices: int, base: int = 64) -> int:
    """``base * sqrt(devices)`` rounded to a multiple of 32 (at least ``base``)."""
    return max(base, 32 * round(base * math.sqrt(devices) / 32))


def point_command(exp: str, devices: int, job_dir: pathlib.Path, steps: int, warmup: int):
    dims = model_dims_for(devices)
    return [
        sys.executable,
        "-m",
        "paxlite.main",
        f"--exp={exp}",
        f"--job_log_dir={job_dir}",
        "--mode=benchmark",
        f"--bench_steps={steps}",
        f"--bench_warmup={warmup}",
        f"--set=ICI_MESH_SHAPE=1,{devices},1",
        f"--set=MODEL_DIMS={dims}",
        f"--set=HIDDEN_DIMS={4 * dims}",
    ]


def run_point(
    exp: str, devices: int, job_dir: pathlib.Path, steps: int, warmup: int, timeout: int = 900
) -> dict[str, Any]:
    """Runs one benchmark process on ``devices`` fake CPU devices; returns its benchmark.json."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.run(
        point_command(exp, devices, job_dir, steps, warmup),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"The benchmark on {devices} devices failed (exit {proc.returncode}):\n"
            f"{proc.stderr[-2000:]}"
        )
    return json.loads((job_dir / "benchmark.json").read_text())


def combine(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's rows: one per point, the figures a weak-scaling chart needs."""
    rows = []
    for p in points:
        rows.append(
            {
                "devices": p["devices"]["num_devices"],
                "model": p["model"]["description"],
                "non_embedding_params": p["model"]["non_embedding_params"],
                "global_batch": p["global_batch"],
                "step_time_ms": p["step_time_ms"],
                "tokens_per_sec": p["tokens_per_sec"],
                "tokens_per_sec_per_device": p["tokens_per_sec_per_device"],
                "tflops_per_sec_per_device": p["tflops_per_sec_per_device"],
                "peak_tflops_per_device": (p["peak"] or {}).get("tflops"),
                "mfu": p["mfu"],
                "mfu_definition": p["mfu_definition"],
            }
        )
    return {"experiment": points[0]["experiment"] if points else None, "rows": rows}


def format_markdown(sweep: dict[str, Any]) -> str:
    lines = [
        f"# Weak-scaling sweep: {sweep['experiment']}",
        "",
        "| devices | model | global batch | step time | tokens/s | tokens/s/device | "
        "TFLOP/s/device | peak/device | MFU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sweep["rows"]:
        mfu = f"{100 * r['mfu']:.2f}% ({r['mfu_definition']})" if r["mfu"] is not None else "-"
        lines.append(
            f"| {r['devices']} | {r['model']} | {r['global_batch']} | "
            f"{r['step_time_ms']:.1f} ms | {r['tokens_per_sec']:,.0f} | "
            f"{r['tokens_per_sec_per_device']:,.0f} | {r['tflops_per_sec_per_device']:.4g} | "
            f"{r['peak_tflops_per_device']:.4g} | {mfu} |"
        )
    return "\n".join(lines) + "\n"


def plot(sweep: dict[str, Any], path: pathlib.Path) -> bool:
    """MFU (left axis) and TFLOP/s per device (right axis) against device count."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = sweep["rows"]
    devices = [r["devices"] for r in rows]
    figure, left = plt.subplots(figsize=(6.5, 4))
    left.plot(devices, [100 * (r["mfu"] or 0) for r in rows], "o-", color="C0", label="MFU")
    left.set_xscale("log", base=2)
    left.set_xticks(devices, [str(d) for d in devices])
    left.set_xlabel("devices (model grows with them)")
    left.set_ylabel("MFU (%)", color="C0")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(
        devices, [r["tflops_per_sec_per_device"] for r in rows], "s--", color="C1", label="TFLOP/s"
    )
    right.set_ylabel("TFLOP/s per device", color="C1")
    right.set_ylim(bottom=0)
    definition = rows[0]["mfu_definition"] if rows else ""
    left.set_title(f"Weak scaling: {sweep['experiment']} ({definition} FLOPs)", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def write_report(sweep: dict[str, Any], job_log_dir: pathlib.Path) -> list[pathlib.Path]:
    job_log_dir.mkdir(parents=True, exist_ok=True)
    paths = [job_log_dir / "sweep.json", job_log_dir / "sweep.md"]
    paths[0].write_text(json.dumps(sweep, indent=2) + "\n")
    paths[1].write_text(format_markdown(sweep))
    if plot(sweep, job_log_dir / "sweep.png"):
        paths.append(job_log_dir / "sweep.png")
    return paths


def parser() -> argparse.ArgumentParser:
    """The sweep's command line (``--exp`` is a name ``paxlite --exp`` takes)."""
    arguments = argparse.ArgumentParser(
        description="Weak-scaling benchmark sweep (see module doc)."
    )
    arguments.add_argument("--job_log_dir", required=True)
    arguments.add_argument("--exp", default=registry.EXAMPLE_EXPERIMENT)
    arguments.add_argument("--devices", default="1,2,4,8")
    arguments.add_argument("--steps", type=int, default=20)
    arguments.add_argument("--warmup", type=int, default=3)
    return arguments


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    root = pathlib.Path(args.job_log_dir)
    points = []
    for n in (int(d) for d in args.devices.split(",")):
        point = run_point(args.exp, n, root / f"devices_{n}", args.steps, args.warmup)
        print(
            f"{n} devices: {point['model']['description']}, {point['step_time_ms']:.1f} ms/step, "
            f"MFU {100 * (point['mfu'] or 0):.2f}%",
            flush=True,
        )
        points.append(point)
    paths = write_report(combine(points), root)
    print("Wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
