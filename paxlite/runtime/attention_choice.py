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
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish

from praxis_lite.layers import attention_kernels
from praxis_lite.layers.attentions import ATTENTION_IMPLS, DotProductAttention


class AttentionChoiceError(ValueError):
    """ATTENTION_IMPL names no implementation."""


def platform_default(devices: Sequence[Any]) -> str:
    """The implementation for ``devices``' platform (see the module docstring)."""
    device = devices[0]
    if device.platform == "tpu":
        return "splash"
    kind = getattr(device, "device_kind", "").lower()
    if device.platform in ("gpu", "cuda") and ("nvidia" in kind or device.platform == "cuda"):
        return "cudnn"
    return "einsum"


def choose(requested: str | None, devices: Sequence[Any]) -> tuple[str, bool]:
    """``(implementation, explicit)`` for the ATTENTION_IMPL knob's value and the mesh's
    devices."""
    if requested is None:
        return platform_default(devices), False
    if requested not in ATTENTION_IMPLS:
        raise AttentionChoiceError(
            f"ATTENTION_IMPL={requested!r} is none of {', '.join(ATTENTION_IMPLS)}; "
            "e.g. --set ATTENTION_IMPL=einsum (or leave it unset: by platform)."
        )
    return requested, True


def block_sizes(experiment: Any) -> fdl.Config:
    """Splash's block sizes from the experiment's SA_BLOCK_* knobs (a config: the job's
    config files serialize it)."""
    return fdl.Config(
        attention_kernels.SplashBlockSizes,
        block_q=experiment.SA_BLOCK_Q,
        block_kv=experiment.SA_BLOCK_KV,
        block_kv_compute=experiment.SA_BLOCK_KV_COMPUTE,
        block_q_dkv=experiment.SA_BLOCK_Q_DKV,
        block_kv_dkv=experiment.SA_BLOCK_KV_DKV,
        block_kv_dkv_compute=experiment.SA_BLOCK_KV_DKV_COMPUTE,
        block_q_dq=experiment.SA_BLOCK_Q_DQ,
        block_kv_dq=experiment.SA_BLOCK_KV_DQ,
    )


def apply(task_cfg: Any, experiment: Any, devices: Sequence[Any]) -> str:
    """Sets the chosen implementation on every attention layer config of ``task_cfg`` (in
    place); returns its name."""
    impl, explicit = choose(experiment.ATTENTION_IMPL, devices)
    sizes = block_sizes(experiment)
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
