"""``gpu_mfu.md``: the report of ``benchmarks.gpu_mfu`` as tables people read."""

from __future__ import annotations

from typing import Any

GIB = 2**30


def markdown(report: dict[str, Any]) -> str:
    """The header (device, versions, flags), one row per leg, the plain comparison."""
    lines = [
        f"# paxlite on one {report['device']}: MFU",
        "",
        f"Measured {report['date']} by `python -m benchmarks.gpu_mfu`.",
        "",
        *_header_rows(report),
        "",
        "| leg | batch x seq | step | tokens/s | TFLOP/s per device | MFU (causal) |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("llama_1b", "llama3_8b_lora"):
        if name in report:
            lines.append(_leg_row(name, report[name], report["seq"]))
    if "frozen_base" in report.get("llama3_8b_lora", {}):
        frozen = report["llama3_8b_lora"]["frozen_base"]
        lines += [
            "",
            f"LoRA with the frozen-base count ({frozen['formula']}): "
            f"{frozen['tflops_per_sec_per_device']:.4g} TFLOP/s per device, "
            f"MFU {percent(frozen['mfu'])}.",
        ]
    plain = report.get("plain")
    if plain and "error" in plain:
        lines += ["", f"The plain comparison failed: {plain['error']}"]
    elif plain:
        lines += ["", *_plain_rows(plain, report["seq"])]
    return "\n".join(lines) + "\n"


def _header_rows(report: dict[str, Any]) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    flags = report["xla_flags"] or "(none)"
    peak = report["peak_tflops"]
    driver = f", driver {report['driver']}" if report["driver"] else ""
    return [
        "| | |",
        "|---|---|",
        f"| device | {report['device']} ({report['platform']}){driver} |",
        f"| versions | {versions} |",
        f"| Python, host | {report['machine']['python']}, {report['machine']['cpu']} |",
        f"| XLA_FLAGS | `{flags}` |",
        f"| memory | XLA_PYTHON_CLIENT_MEM_FRACTION={report['mem_fraction']}; batches fitted "
        f"to {report['budget_bytes'] / GIB:.3g} GiB |",
        f"| peak | {peak:.4g} TFLOP/s bfloat16 (dense) |" if peak else "| peak | unknown |",
        f"| settings | seq {report['seq']}, NUM_LOSS_CHUNKS={report['loss_chunks']}, "
        f"CHECKPOINT_POLICY={report['remat']} |",
    ]


def _leg_row(name: str, leg: dict[str, Any], seq: int) -> str:
    if "error" in leg:
        return f"| {name} | failed: {leg['error']} | | | | |"
    f = leg["figures"]
    return (
        f"| {name} ({f['model']['description']}) | {leg['batch']} x {seq} | "
        f"{f['step_time_ms']:.1f} ms | {f['tokens_per_sec']:,.0f} | "
        f"{f['tflops_per_sec_per_device']:.4g} | {percent(f['mfu'])} |"
    )


def _plain_rows(plain: dict[str, Any], seq: int) -> list[str]:
    rows = [
        f"paxlite's llama_1b step against the plain-JAX step of the same shape, batch "
        f"{plain['batch']} x {seq}, alternating rounds (medians):",
        "",
        "| step | tokens/s | rounds | TFLOP/s per device | MFU (causal) |",
        "|---|---|---|---|---|",
    ]
    for label in ("paxlite", "plain"):
        side = plain[label]
        rounds = ", ".join(f"{r:,.0f}" for r in side["tokens_per_sec_rounds"])
        rows.append(
            f"| {label} | {side['tokens_per_sec']:,.0f} | {rounds} | "
            f"{side['tflops_per_sec_per_device']:.4g} | {percent(side['mfu'])} |"
        )
    rows += ["", f"paxlite / plain: **{plain['ratio']:.3f}**"]
    if plain.get("profile_top_ops"):
        rows += [
            "",
            f"Where paxlite's step spends its time (3 traced steps at batch "
            f"{plain['profile_batch']} x {seq}, `profile/`):",
            "",
            "| op / kernel | ms | share |",
            "|---|---|---|",
        ]
        for op in plain["profile_top_ops"]:
            rows.append(f"| `{op['name'][:90]}` | {op['ms']:.2f} | {percent(op['share'])} |")
    return rows


def percent(value: float | None) -> str:
    """``12.3%``, or ``n/a``."""
    return "n/a" if value is None else f"{100 * value:.1f}%"
