"""Which attention implementation a job's layers use (the ``ATTENTION_IMPL`` knob).

Asked for explicitly, every ``DotProductAttention`` of the task uses it, and a call it
cannot honour is an ``AttentionImplError`` (one line). Left to the default, it follows
the platform of the mesh's devices (not of this process: a ``--compile_topology`` compile
on a CPU host picks the TPU's): ``splash`` on TPUs, ``cudnn`` on NVIDIA GPUs, ``einsum``
elsewhere; a layer whose settings rule the kernel out (a logit cap with cuDNN, a
relative bias with splash, ...) uses the einsums, with one logged line saying why.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish

from paxlite.experiments.base_experiment import BaseExperiment
from praxis_lite.layers.attention_kernels import SplashBlockSizes
from praxis_lite.layers.attentions import AttentionImpl, DotProductAttention


def platform_default(devices: Sequence[Any]) -> AttentionImpl:
    """The implementation for ``devices``' platform (see the module docstring)."""
    device = devices[0]
    if device.platform == "tpu":
        return AttentionImpl.SPLASH
    kind = getattr(device, "device_kind", "").lower()
    if device.platform in ("gpu", "cuda") and ("nvidia" in kind or device.platform == "cuda"):
        return AttentionImpl.CUDNN
    return AttentionImpl.EINSUM


def choose(requested: AttentionImpl | None, devices: Sequence[Any]) -> tuple[AttentionImpl, bool]:
    """``(implementation, explicit)`` for the ATTENTION_IMPL knob's value and the mesh's
    devices."""
    if requested is None:
        return platform_default(devices), False
    return requested, True


def apply(task_cfg: Any, experiment: BaseExperiment, devices: Sequence[Any]) -> AttentionImpl:
    """Sets the chosen implementation and splash's tiles (as a config: the job's config
    files serialize it) on every attention layer config of ``task_cfg`` (in place); returns
    the implementation."""
    settings = experiment.attention_settings()
    impl, explicit = choose(settings.impl, devices)
    sizes = fdl.Config(SplashBlockSizes, **dataclasses.asdict(settings.splash_block_sizes))
    for value, _ in daglish.iterate(task_cfg):
        if isinstance(value, fdl.Buildable) and _is_attention(value):
            fdl.Buildable.__setattr__(value, "attention_impl", impl)
            fdl.Buildable.__setattr__(value, "attention_fallback", not explicit)
            fdl.Buildable.__setattr__(value, "splash_block_sizes", copy.copy(sizes))
            fdl.Buildable.__setattr__(value, "splash_interpret", devices[0].platform != "tpu")
    return impl


def _is_attention(cfg: fdl.Buildable) -> bool:
    """Whether ``cfg`` builds a DotProductAttention (or a subclass)."""
    target = cfg.__fn_or_cls__
    return isinstance(target, type) and issubclass(target, DotProductAttention)
