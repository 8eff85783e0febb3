"""Peak FLOP/s per device, the denominator of MFU: a table for accelerators, a calibration on CPU.

This module holds only the peaks. MFU = achieved model FLOP/s per device / the
device's peak FLOP/s; that division, and the model FLOPs of a step, are in
``paxlite.perf.flops`` (:func:`paxlite.perf.flops.achieved_flops`).

The peak comes, in order, from ``--peak_tflops``, from :data:`PEAK_TFLOPS` by
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
