"""Which of JAX's platforms a process uses, chosen before JAX starts its backends.

Left to itself, JAX initialises every backend it has a plugin for: with libtpu installed
(paxlite's ``[tpu]`` extra) a CPU-only host then has libtpu probe for a TPU and print a
block of errors ("unexpected worker hostname", "Failed to find host bounds") that look
like a failure. When the user has not set ``JAX_PLATFORMS`` and the host has no TPU
device nodes, paxlite names the platforms that are there (the CPU, and NVIDIA GPUs where
jax's CUDA plugin and a driver are), so libtpu is never asked. TPU sizing
(``jax.experimental.topologies``) still finds libtpu: it does not go through the
platforms. A process on a TPU host, or one whose user chose, is left as it is.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import jax

#: Device nodes of an attached TPU: /dev/accel* (v2-v4, v5p) or /dev/vfio/* (v5e and later).
_TPU_NODES = ("/dev/accel*", "/dev/vfio/*")
#: Device nodes of an NVIDIA driver, and jax's CUDA plugins.
_NVIDIA_NODES = ("/dev/nvidia[0-9]*",)
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def choose() -> str | None:
    """Sets JAX's platforms to those present when nobody chose them and there is no TPU;
    returns what it chose (``"cpu"``, ``"cuda,cpu"``), or None when it left JAX alone
    (``JAX_PLATFORMS`` set, a TPU attached, or JAX's backends already started)."""
    from jax._src import xla_bridge

    if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
        return None
    if xla_bridge.backends_are_initialized() or _any(_TPU_NODES):
        return None
    platforms = "cuda,cpu" if _any(_NVIDIA_NODES) and _cuda_plugin_installed() else "cpu"
    jax.config.update("jax_platforms", platforms)
    return platforms


def describe(chosen: str) -> str:
    """The console line saying which platforms :func:`choose` chose, and why."""
    return (
        f"Platform: {chosen} (no TPU attached: no /dev/accel* or /dev/vfio; set JAX_PLATFORMS "
        "to choose)."
    )


def _any(patterns: tuple[str, ...]) -> bool:
    return any(glob.glob(pattern) for pattern in patterns)


def _cuda_plugin_installed() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in _CUDA_PLUGINS)
