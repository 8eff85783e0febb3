"""The platform a job's program runs on, told to the layers that pick kernels by it.

A mixture-of-experts layer runs dropless experts as ``ragged_dot`` on accelerators and as
blocked matmuls on a CPU (``praxis_lite.moe.dispatch``); it asks its ``platform`` field,
which is set here from the mesh's devices, not this process's backend: a
``--compile_topology`` compile on a CPU host builds the TPU's program. (Attention kernels:
``attention_choice``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish

from praxis_lite.moe import MoeFeedForward


def apply(task_cfg: Any, devices: Sequence[Any]) -> str:
    """Sets ``platform`` on every mixture-of-experts layer config of ``task_cfg`` to the
    devices' platform (in place); returns it."""
    platform = devices[0].platform
    for value, _ in daglish.iterate(task_cfg):
        target = getattr(value, "__fn_or_cls__", None)
        if isinstance(target, type) and issubclass(target, MoeFeedForward):
            fdl.Buildable.__setattr__(value, "platform", platform)
    return platform
