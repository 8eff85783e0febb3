"""Which of JAX's platforms a process uses, chosen before JAX starts its backends.

Left to itself, JAX initialises every backend it has a plugin for: with libtpu installed
(paxlite's ``[tpu]`` extra) a CPU-only host then has libtpu probe for a TPU and print a
block of errors ("unexpected worker hostname", "Failed to find host bounds") that look
like a failure. When libtpu is installed, the user has not set ``JAX_PLATFORMS`` and the
host has no TPU device nodes, paxlite names the platforms that are there (the CPU, and
NVIDIA GPUs where jax's CUDA plugin and a driver are: ``gpu_flags.nvidia_gpu_present``), so
libtpu is never asked. TPU sizing
(``jax.experimental.topologies``) still finds libtpu: it does not go through the
platforms. A process on a TPU host, or one whose user chose, is left as it is.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import jax

from paxlite.runtime import gpu_flags

#: Device nodes of an attached TPU: /dev/accel* (v2-v4, v5p) or /dev/vfio/<n> (v5e and later).
_TPU_NODES = ("/dev/accel*", "/dev/vfio/[0-9]*")
#: JAX plugins of accelerators other than TPUs and NVIDIA GPUs: with one, JAX chooses.
_OTHER_PLUGINS = ("jax_rocm60_plugin", "jax_rocm7_plugin", "jax_plugins.xla_rocm", "jax_metal")


def choose() -> str | None:
    """Sets JAX's platforms to those present when libtpu is installed, nobody chose them
    and there is no TPU; returns what it chose (``"cpu"``, ``"cuda,cpu"``), or None when it
    left JAX alone (no libtpu to probe; ``JAX_PLATFORMS`` set, even empty; a TPU attached;
    another accelerator's plugin installed; JAX's backends already started)."""
    from jax._src import xla_bridge

    if "JAX_PLATFORMS" in os.environ or jax.config.jax_platforms:
        return None
    if not _installed("libtpu") or any(_installed(p) for p in _OTHER_PLUGINS):
        return None
    if xla_bridge.backends_are_initialized() or _tpu_attached():
        return None
    platforms = "cuda,cpu" if gpu_flags.nvidia_gpu_present() else "cpu"
    jax.config.update("jax_platforms", platforms)
    return platforms


def describe(chosen: str) -> str:
    """The console line saying which platforms :func:`choose` chose, and why."""
    return (
        f"Platform: {chosen} (no TPU attached: no /dev/accel* or /dev/vfio device; set "
        "JAX_PLATFORMS to choose)."
    )


def _tpu_attached() -> bool:
    return any(glob.glob(pattern) for pattern in _TPU_NODES)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # A namespace package's parent missing.
        return False
