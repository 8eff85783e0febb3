"""FLOPs and MFU of a train step, as the trainer counts them.

* XLA's FLOP count of the compiled step and its correction for scanned layers
  (:func:`xla_flops`, :func:`corrected_xla_flops`);
* what one step costs by every count, and the peak MFU is taken against
  (:class:`StepCost`, :func:`step_cost`);
* achieved model TFLOP/s per device and MFU from FLOPs per step and a step rate
  (:func:`achieved_flops`: the one place this arithmetic is written).

The model-FLOPs definitions and counts come from the model itself (the model
contract's ``train_flops``, see ``praxis_lite.flops``); the device peaks come from
``paxlite.perf.mfu``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from paxlite.perf.mfu import Peak
from praxis_lite.flops import DEFAULT_DEFINITION, FlopsDefinition, TrainFlops


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


class AchievedFlops(NamedTuple):
    """What a step rate achieves, per device.

    Attributes:
      tflops_per_sec_per_device: model TFLOP/s of one device.
      mfu: that over the device's peak, a fraction (1.0: the peak); None without a peak.
    """

    tflops_per_sec_per_device: float
    mfu: float | None


def achieved_flops(
    flops_per_step: float, steps_per_sec: float, num_devices: int, peak: Peak | None
) -> AchievedFlops:
    """Achieved TFLOP/s per device and MFU of ``flops_per_step`` FLOPs (all devices together)
    done ``steps_per_sec`` times a second on ``num_devices`` devices, against ``peak``.

    A "step" is any unit of work counted at the rate given: FLOPs per token at tokens/s
    give the same figures as FLOPs per step at steps/s.
    """
    flops_per_device = steps_per_sec * flops_per_step / num_devices
    mfu = flops_per_device / peak.flops if peak is not None else None
    return AchievedFlops(flops_per_device / 1e12, mfu)


def model_dtype(model: Any) -> Any:
    """The model's fprop dtype (what its matmuls run in; a BaseLayer field); float32 if unset."""
    return getattr(model, "fprop_dtype", None) or jnp.float32


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one train step costs, by every count, and the peak it is measured against.

    Attributes:
      definition: the model-FLOPs definition MFU uses.
      analytic_flops: ``{definition value: FLOPs per step}`` (all devices); empty
        if the model does not count its FLOPs (its ``train_flops`` is None).
      xla_flops: XLA's count of the compiled step (``cost_analysis``), all
        devices; 0 if unknown.
      xla_flops_note: how to read ``xla_flops`` (loops counted once, remat).
      peak: the peak per device (None: no MFU).
      num_devices: devices the step runs on.
      global_batch: ``B`` examples per step.
      seq_len: ``T``, tokens per example (1 for a model without sequences).
      train_flops: the model's own count (None if it does not count).
    """

    definition: Any
    analytic_flops: dict[str, float]
    xla_flops: float
    xla_flops_note: str
    peak: Peak | None
    num_devices: int
    global_batch: int
    seq_len: int
    train_flops: TrainFlops | None = None

    @property
    def model_flops_per_step(self) -> float:
        """FLOPs per step under ``definition`` (XLA's count if there is no analytic one)."""
        return self.analytic_flops.get(self.definition.value, self.xla_flops)

    def describe(self) -> str:
        """Two console lines: the FLOPs by each count and the peak."""
        counts = ", ".join(f"{name} {format_flops(v)}" for name, v in self.analytic_flops.items())
        line = f"Model FLOPs per step ({self.global_batch}x{self.seq_len} tokens): "
        line += counts or "not counted (the model has no train_flops)"
        if self.train_flops is not None:
            line += f" of {self.train_flops.description}"
        line += f"; XLA {format_flops(self.xla_flops)} ({self.xla_flops_note})"
        if self.peak is None:
            return line
        return line + (
            f"\nMFU: {self.definition.value} FLOPs over a peak of {self.peak.tflops:.4g} "
            f"TFLOP/s per device ({self.peak.device_kind}, {self.peak.dtype}; {self.peak.source})"
        )


def step_cost(
    model: Any,
    global_batch: Any,
    compiled: Any = None,
    *,
    num_devices: int | None = None,
    definition: FlopsDefinition | None = None,
    peak: Peak | None = None,
    grad_accum_steps: int = 1,
) -> StepCost:
    """The :class:`StepCost` of a train step of ``model`` on ``global_batch`` (arrays or shapes).

    The model counts its own FLOPs (the model contract's ``train_flops``);
    ``compiled`` (a ``jax.stages.Compiled``) adds XLA's count; ``peak`` (from
    :func:`paxlite.perf.mfu.peak_for`, taken before any mesh is set) is what MFU is
    measured against (None: no MFU); ``definition`` defaults to ``DEFAULT_DEFINITION``;
    ``grad_accum_steps``: the step runs the batch as that many microbatches (XLA's count is
    of one).
    """
    examples = int(jax.tree_util.tree_leaves(global_batch)[0].shape[0])
    counted = model.train_flops(global_batch)
    num_devices = num_devices or jax.device_count()
    xla_raw = xla_flops(compiled, num_devices) if compiled is not None else 0.0
    xla, note = corrected_xla_flops(xla_raw, counted, examples, grad_accum_steps)
    return StepCost(
        definition=definition or DEFAULT_DEFINITION,
        analytic_flops=counted.per_step(examples) if counted else {},
        xla_flops=xla,
        xla_flops_note=note,
        peak=peak,
        num_devices=num_devices,
        global_batch=examples,
        seq_len=counted.tokens_per_example if counted else 1,
        train_flops=counted,
    )
