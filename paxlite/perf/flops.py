"""XLA's FLOP count of a compiled step, its correction for scanned layers, and formatting.

The model-FLOPs definitions and counts come from the model itself (the model
contract's ``train_flops``, see ``praxis_lite.flops``); this module adds
what the compiled program says.
"""

from __future__ import annotations

import math
from typing import Any

from praxis_lite.flops import TrainFlops


def cost_analysis(compiled: Any) -> dict[str, float]:
    """``compiled.cost_analysis()`` as one dict (JAX returns a list on some versions)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return dict(cost or {})


def xla_flops(compiled: Any, num_devices: int) -> float:
    """XLA's own FLOP count of a compiled step on all ``num_devices`` devices together.

    ``cost_analysis()['flops']`` of an SPMD program is one device's share (one
    partition's program), so it is multiplied by the devices. It counts what the
    program executes: rematerialized forwards, the full
    (masked) attention map, elementwise work and the optimizer update; but the
    body of a ``scan`` (while loop) only once. See :func:`corrected_xla_flops`.
    """
    return float(cost_analysis(compiled).get("flops", 0.0)) * num_devices


def corrected_xla_flops(
    xla_raw: float, train_flops: TrainFlops | None, global_batch: int, microbatches: int = 1
) -> tuple[float, str]:
    """``(FLOPs, note)``: XLA's count, estimated for every trip of a scanned body.

    Adds ``scan_trips - 1`` scan bodies (the model's ``scan_body_per_example``
    for each of ``global_batch`` examples). Exact (unchanged) without a scan;
    left as counted, with a note saying so, when the model says its loops cannot
    be corrected (a pipeline). With gradient accumulation (``microbatches`` > 1) XLA
    counted one microbatch's pass: the estimate is ``microbatches`` of them (the
    optimizer's few FLOPs included each time).
    """
    if microbatches > 1:
        part, note = corrected_xla_flops(xla_raw, train_flops, global_batch // microbatches)
        return part * microbatches, f"{note}; x {microbatches} accumulated microbatches"
    if train_flops is not None and train_flops.xla_note:
        return xla_raw, train_flops.xla_note
    if train_flops is None or train_flops.scan_trips <= 1 or not xla_raw:
        return xla_raw, "exact count of the compiled program"
    trips = train_flops.scan_trips
    corrected = xla_raw + (trips - 1) * train_flops.scan_body_per_example * global_batch
    note = (
        f"XLA counted the scanned body once ({format_flops(xla_raw)}); estimated for {trips} trips"
    )
    return corrected, note


def format_flops(flops: float) -> str:
    """``1.234 TFLOP`` style (SI prefixes)."""
    if flops <= 0 or not math.isfinite(flops):
        return f"{flops:g} FLOP"
    exponent = min(int(math.log10(flops) // 3), 5)
    prefix = ["", "k", "M", "G", "T", "P"][exponent]
    return f"{flops / 1000**exponent:.4g} {prefix}FLOP"
