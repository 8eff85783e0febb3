"""What one train step costs: the model's FLOPs, XLA's count, and the peak MFU is taken against."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from paxlite.perf import flops
from paxlite.perf.mfu import Peak
from praxis_lite.flops import DEFAULT_DEFINITION, FlopsDefinition, TrainFlops


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
        counts = ", ".join(
            f"{name} {flops.format_flops(v)}" for name, v in self.analytic_flops.items()
        )
        line = f"Model FLOPs per step ({self.global_batch}x{self.seq_len} tokens): "
        line += counts or "not counted (the model has no train_flops)"
        if self.train_flops is not None:
            line += f" of {self.train_flops.description}"
        line += f"; XLA {flops.format_flops(self.xla_flops)} ({self.xla_flops_note})"
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
    :func:`peak_for`, taken before any mesh is set) is what MFU is measured
    against (None: no MFU); ``definition`` defaults to ``DEFAULT_DEFINITION``;
    ``grad_accum_steps``: the step runs the batch as that many microbatches (XLA's count is
    of one).
    """
    examples = int(jax.tree_util.tree_leaves(global_batch)[0].shape[0])
    counted = model.train_flops(global_batch)
    num_devices = num_devices or jax.device_count()
    xla_raw = flops.xla_flops(compiled, num_devices) if compiled is not None else 0.0
    xla, note = flops.corrected_xla_flops(xla_raw, counted, examples, grad_accum_steps)
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
