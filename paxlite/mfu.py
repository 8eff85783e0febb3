"""Peak FLOP/s per device: a table for accelerators, a calibration on CPU.

MFU = achieved model FLOP/s per device / the device's peak FLOP/s. The peak
comes, in order, from ``--peak_tflops``, from :data:`PEAK_TFLOPS` by
``device_kind`` and dtype, or (CPU, or an unknown device) from timing a jitted
matmul of the run's dtype on this machine at the start of the run
(:func:`calibrate`; never cached, so each run is measured against the machine
as it is then).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

#: Dense (no sparsity) peak TFLOP/s per device (a TPU chip / a GPU), by
#: ``(device_kind prefix, dtype)``. Sources: Google Cloud TPU system architecture
#: pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e: "peak compute per chip,
#: bf16"); NVIDIA A100 datasheet (2021), H100 datasheet (SXM5 / PCIe), H200
#: datasheet (SXM); sparsity figures halved. float32 on TPUs runs through the
#: bf16 MXU at JAX's default matmul precision, so its peak is the bf16 one; on
#: A100/H100/H200 JAX's default float32 matmul uses TF32 tensor cores (the
#: TF32 figure; with ``precision='highest'`` use the plain FP32 one: A100 19.5,
#: H100 SXM 67, H100 PCIe 51, H200 67).
PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("TPU v4", "bfloat16"): 275.0,
    ("TPU v4", "float32"): 275.0,
    ("TPU v5 lite", "bfloat16"): 197.0,  # v5e
    ("TPU v5 lite", "float32"): 197.0,
    ("TPU v5p", "bfloat16"): 459.0,
    ("TPU v5p", "float32"): 459.0,
    ("TPU v5", "bfloat16"): 459.0,  # v5p reports "TPU v5" on some runtimes
    ("TPU v5", "float32"): 459.0,
    ("TPU v6 lite", "bfloat16"): 918.0,  # v6e (Trillium)
    ("TPU v6 lite", "float32"): 918.0,
    ("NVIDIA A100", "bfloat16"): 312.0,
    ("NVIDIA A100", "float16"): 312.0,
    ("NVIDIA A100", "float32"): 156.0,  # TF32
    ("NVIDIA H100 PCIe", "bfloat16"): 756.0,
    ("NVIDIA H100 PCIe", "float16"): 756.0,
    ("NVIDIA H100 PCIe", "float32"): 378.0,  # TF32
    ("NVIDIA H100", "bfloat16"): 989.0,  # SXM5 (e.g. "NVIDIA H100 80GB HBM3")
    ("NVIDIA H100", "float16"): 989.0,
    ("NVIDIA H100", "float32"): 494.5,  # TF32
    ("NVIDIA H200", "bfloat16"): 989.0,
    ("NVIDIA H200", "float16"): 989.0,
    ("NVIDIA H200", "float32"): 494.5,  # TF32
}


@dataclasses.dataclass(frozen=True)
class Peak:
    """A device's peak.

    Attributes:
      tflops: peak TFLOP/s of one device.
      source: where it came from (``--peak_tflops``, ``table: <entry>``,
        ``calibrated ...``).
      device_kind: ``jax.Device.device_kind``.
      dtype: the dtype it applies to.
    """

    tflops: float
    source: str
    device_kind: str
    dtype: str

    @property
    def flops(self) -> float:
        return self.tflops * 1e12


def dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name if dtype is not jnp.bfloat16 else "bfloat16"


def table_peak(device_kind: str, dtype: Any) -> tuple[str, float] | None:
    """The longest matching ``(prefix, TFLOP/s)`` of :data:`PEAK_TFLOPS`, or None."""
    name = dtype_name(dtype)
    matches = [
        (prefix, tflops)
        for (prefix, d), tflops in PEAK_TFLOPS.items()
        if d == name and device_kind.startswith(prefix)
    ]
    return max(matches, key=lambda m: len(m[0])) if matches else None


def measure_matmul_tflops(
    dtype: Any = jnp.float32, size: int = 1024, repeats: int = 10, device: Any = None
) -> float:
    """Best TFLOP/s of a jitted ``[size, size] @ [size, size]`` in ``dtype`` on ``device``.

    Each timed call runs 4 chained matmuls (``8 * size**3`` FLOPs) and blocks on
    the result; the first call (compile) is not timed. The fastest of
    ``repeats`` calls is the peak: other work on the machine only slows calls
    down.
    """
    device = device or jax.local_devices()[0]
    operand = np.random.default_rng(0).standard_normal((size, size), np.float32)
    a = jax.device_put(operand.astype(jnp.dtype(dtype)), device)
    scale = 1.0 / float(np.sqrt(size))  # A Python float: keeps the operand's dtype.

    @jax.jit
    def chain(x):
        for _ in range(4):
            x = (x @ a) * scale
        return x

    # Under a job's mesh context (in-process callers): run on a mesh of this one device.
    with jax.set_mesh(jax.sharding.Mesh(np.array([device]), ("calibration",))):
        chain(a).block_until_ready()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            chain(a).block_until_ready()
            times.append(time.perf_counter() - start)
    return 8.0 * size**3 / min(times) / 1e12


def calibrate(dtype: Any = jnp.float32) -> Peak:
    """This machine's matmul peak per device, measured now, once for the whole job.

    Process 0 times the matmul on its first local device and every process
    receives its figure (:func:`jax.experimental.multihost_utils.broadcast_one_to_all`),
    so all processes report MFU against one peak. On CPU the fake devices share
    the cores: one matmul uses all of them, so the peak per device is the
    measured figure divided by the local device count. Nothing is cached: a
    figure measured under another load would skew every later run. Call it
    before any mesh is set (all processes, collectively).
    """
    device = jax.local_devices()[0]
    measured = measure_matmul_tflops(dtype, device=device) if jax.process_index() == 0 else 0.0
    if jax.process_count() > 1:
        measured = float(multihost_utils.broadcast_one_to_all(np.float32(measured)))
    per_device = measured / (len(jax.local_devices()) if device.platform == "cpu" else 1)
    when = time.strftime("%Y-%m-%d %H:%M")
    source = f"calibrated {when} (best jitted {dtype_name(dtype)} matmul on this machine)"
    return Peak(per_device, source, device.device_kind, dtype_name(dtype))


def peak_for(dtype: Any, *, override_tflops: float | None = None) -> Peak:
    """The peak used for MFU: the override, the table, or a calibration (in that order).

    A calibration runs collectively on every process (see :func:`calibrate`);
    the override and the table need no device work.
    """
    device = jax.local_devices()[0]
    name = dtype_name(dtype)
    if override_tflops:
        return Peak(float(override_tflops), "--peak_tflops", device.device_kind, name)
    entry = table_peak(device.device_kind, dtype)
    if entry is not None and device.platform != "cpu":
        return Peak(entry[1], f"table: {entry[0]} {name}", device.device_kind, name)
    return calibrate(dtype)


def model_dtype(model_cfg: Any) -> Any:
    """The fprop dtype of the model (what its matmuls run in); float32 if not found."""
    from paxlite.flops import unwrap_template

    return getattr(unwrap_template(model_cfg), "fprop_dtype", None) or jnp.float32


@dataclasses.dataclass(frozen=True)
class StepCost:
    """What one train step costs, by every count, and the peak it is measured against.

    Attributes:
      definition: the model-FLOPs definition MFU uses.
      analytic_flops: ``{definition value: FLOPs per step}`` (all devices); empty
        if the model is not a Transformer LM :mod:`paxlite.flops` can count.
      xla_flops: XLA's count of the compiled step (``cost_analysis``), all
        devices; 0 if unknown.
      xla_flops_note: how to read ``xla_flops`` (loops counted once, remat).
      peak: the peak per device (None: no MFU).
      num_devices: devices the step runs on.
      global_batch: ``B``; seq_len: ``T``.
      shape: the counted model shape (None if not counted).
    """

    definition: Any
    analytic_flops: dict[str, float]
    xla_flops: float
    xla_flops_note: str
    peak: Peak | None
    num_devices: int
    global_batch: int
    seq_len: int
    shape: Any = None

    @property
    def model_flops_per_step(self) -> float:
        """FLOPs per step under ``definition`` (XLA's count if there is no analytic one)."""
        return self.analytic_flops.get(self.definition.value, self.xla_flops)

    def describe(self) -> str:
        """Two console lines: the FLOPs by each count and the peak."""
        from paxlite import flops

        counts = ", ".join(
            f"{name} {flops.format_flops(v)}" for name, v in self.analytic_flops.items()
        )
        line = f"Model FLOPs per step ({self.global_batch}x{self.seq_len} tokens): "
        line += counts or "not counted (not a Transformer LM)"
        line += f"; XLA {flops.format_flops(self.xla_flops)} ({self.xla_flops_note})"
        if self.peak is None:
            return line
        return line + (
            f"\nMFU: {self.definition.value} FLOPs over a peak of {self.peak.tflops:.4g} "
            f"TFLOP/s per device ({self.peak.device_kind}, {self.peak.dtype}; {self.peak.source})"
        )


def batch_dims(batch: Any) -> tuple[int, int]:
    """``(B, T)`` of an LM batch (its ``ids``, else its first 2-D leaf)."""
    ids = batch["ids"] if "ids" in batch else None
    if ids is None:
        ids = next(x for x in jax.tree_util.tree_leaves(batch) if len(x.shape) == 2)
    return int(ids.shape[0]), int(ids.shape[1])


def step_cost(
    model_cfg: Any,
    global_batch: Any,
    compiled: Any = None,
    *,
    num_devices: int | None = None,
    definition: Any = None,
    peak: Peak | None = None,
) -> StepCost:
    """The :class:`StepCost` of a train step of ``model_cfg`` on ``global_batch``.

    ``compiled`` (a ``jax.stages.Compiled``) adds XLA's count; ``peak`` (from
    :func:`peak_for`, taken before any mesh is set) is what MFU is measured
    against (None: no MFU); ``definition`` defaults to ``flops.DEFAULT_DEFINITION``.
    """
    from paxlite import flops

    definition = definition or flops.DEFAULT_DEFINITION
    b, t = batch_dims(global_batch)
    try:
        shape = flops.lm_shape(model_cfg)
        analytic = shape.all_definitions(b, t)
    except flops.ModelShapeError:
        shape, analytic = None, {}
    xla_raw = flops.xla_flops(compiled) if compiled is not None else 0.0
    note = "exact count of the compiled program"
    trips = flops.scan_trip_count(model_cfg)
    if flops.has_pipeline(model_cfg):
        note = "loop bodies (pipeline iterations, scanned layers) counted once; not corrected"
    elif trips > 1 and shape is not None and xla_raw:
        remat = flops.uses_remat(model_cfg)
        xla = flops.xla_flops_scan_corrected(xla_raw, shape, trips, b, t, remat)
        note = (
            f"XLA counted the scanned body once ({flops.format_flops(xla_raw)}); "
            f"estimated for {trips} trips{' with remat' if remat else ''}"
        )
        xla_raw = xla
    return StepCost(
        definition=definition,
        analytic_flops=analytic,
        xla_flops=xla_raw,
        xla_flops_note=note,
        peak=peak,
        num_devices=num_devices or jax.device_count(),
        global_batch=b,
        seq_len=t,
        shape=shape,
    )
