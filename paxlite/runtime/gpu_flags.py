"""XLA's flags for training on NVIDIA GPUs, as MaxText and JAX-Toolbox set them.

On a host with an NVIDIA GPU (a CUDA plugin of jax installed and the driver's device node
present, and ``JAX_PLATFORMS`` not ruling CUDA out) the trainer adds :data:`GPU_XLA_FLAGS` to
``XLA_FLAGS`` before JAX starts its backend, leaving every flag the user's ``XLA_FLAGS``
already sets as the user set it, and prints one line naming what it added.
``--xla_gpu_defaults=false`` adds none.

The set: the latency-hiding scheduler (collectives overlap compute), combining small
collectives up to 128 MiB (all-reduce, all-gather) and 64 MiB (reduce-scatter), the
pipelined all-gather / reduce-scatter / all-reduce of scanned layers (the boolean
``--xla_gpu_enable_pipelined_*=true`` form, which jax 0.10 and 0.11 both parse; 0.10
rejects MaxText's newer ``--xla_gpu_pipeline_*=on``), while-loop double buffering, the
highest-priority stream for collectives, and command buffers off (MaxText's
``--xla_gpu_enable_command_buffer=``). XLA parses its GPU flags on any platform (an unknown
one aborts the process), which is how the tests check them on a CPU.
"""

from __future__ import annotations

import importlib.util
import os

#: (flag, value) pairs added on NVIDIA GPUs unless XLA_FLAGS sets the flag.
GPU_XLA_FLAGS: tuple[tuple[str, str], ...] = (
    ("xla_gpu_enable_latency_hiding_scheduler", "true"),
    ("xla_gpu_enable_highest_priority_async_stream", "true"),
    ("xla_gpu_all_reduce_combine_threshold_bytes", str(128 * 2**20)),
    ("xla_gpu_all_gather_combine_threshold_bytes", str(128 * 2**20)),
    ("xla_gpu_reduce_scatter_combine_threshold_bytes", str(64 * 2**20)),
    ("xla_gpu_enable_pipelined_all_gather", "true"),
    ("xla_gpu_enable_pipelined_reduce_scatter", "true"),
    ("xla_gpu_enable_pipelined_all_reduce", "true"),
    ("xla_gpu_enable_while_loop_double_buffering", "true"),
    ("xla_gpu_enable_command_buffer", ""),
)
_CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def set_in(xla_flags: str) -> set[str]:
    """The flag names an ``XLA_FLAGS`` string sets (``--name=value`` or ``--name``)."""
    return {item[2:].split("=", 1)[0] for item in xla_flags.split() if item.startswith("--")}


def merged(xla_flags: str) -> tuple[str, list[str]]:
    """``xla_flags`` with each of :data:`GPU_XLA_FLAGS` it does not set appended; and the
    ``--flag=value`` items added."""
    taken = set_in(xla_flags)
    added = [f"--{name}={value}" for name, value in GPU_XLA_FLAGS if name not in taken]
    return " ".join([xla_flags.strip(), *added]).strip(), added


def nvidia_gpu_present() -> bool:
    """Whether JAX will start on an NVIDIA GPU: a CUDA plugin installed, the driver's
    device node present, and ``JAX_PLATFORMS`` (if set) naming cuda or gpu."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and not {"cuda", "gpu"} & set(platforms.lower().split(",")):
        return False
    if not os.path.exists("/dev/nvidiactl"):
        return False
    return any(_installed(name) for name in _CUDA_PLUGINS)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def apply(enabled: bool, on_gpu: bool | None = None) -> list[str]:
    """Adds the GPU flags to ``os.environ['XLA_FLAGS']`` (call before JAX's backend starts)
    when ``enabled`` and on an NVIDIA GPU (``on_gpu``; None: :func:`nvidia_gpu_present`).
    Prints and returns what it added."""
    if not enabled or not (nvidia_gpu_present() if on_gpu is None else on_gpu):
        return []
    flags, added = merged(os.environ.get("XLA_FLAGS", ""))
    if added:
        os.environ["XLA_FLAGS"] = flags
        print(f"XLA flags for NVIDIA GPUs (--xla_gpu_defaults=false: none): {' '.join(added)}")
    return added
