"""The mesh's platform reaches every mixture-of-experts layer config (not this process's:
a TPU compile on a CPU host builds the TPU's program)."""

from types import SimpleNamespace

import jax
from fiddle import daglish

from paxlite.experiments.base_experiment import with_overrides
from paxlite.runtime import platform_kernels
from praxis_lite.moe import MoeFeedForward
from tasks.lm.synthetic import LmSyntheticTinyMoe


def _moe_platforms(task_cfg) -> list:
    return [
        value.platform
        for value, _ in daglish.iterate(task_cfg)
        if getattr(value, "__fn_or_cls__", None) is MoeFeedForward
    ]


def test_every_moe_layer_gets_the_devices_platform():
    task_cfg = with_overrides(LmSyntheticTinyMoe, {})().task()
    assert set(_moe_platforms(task_cfg)) == {None}
    tpu = SimpleNamespace(platform="tpu")
    assert platform_kernels.apply(task_cfg, [tpu]) == "tpu"
    assert set(_moe_platforms(task_cfg)) == {"tpu"}
    assert platform_kernels.apply(task_cfg, jax.devices()) == "cpu"
    assert set(_moe_platforms(task_cfg)) == {"cpu"}
