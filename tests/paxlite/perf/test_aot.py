"""Compile-only dry run on 8 fake devices: figures agree with the real sharded state."""

import math

import jax
import pytest

from paxlite.experiments import base_experiment
from paxlite.perf import aot
from paxlite.runtime.job import build_job
from praxis_lite import sharding
from tasks.lm.synthetic import LmSyntheticTiny


@pytest.mark.slow
def test_compile_reports_sizes_without_allocating(tmp_path):
    cls = base_experiment.with_overrides(
        LmSyntheticTiny,
        {
            "ICI_MESH_SHAPE": (1, 4, 2),
            "LOGICAL_AXIS_RULES": sharding.FSDP_AND_TENSOR_PARALLEL_RULES,
        },
    )
    exp = cls()
    job = build_job(exp, exp.task(), exp.datasets(), tmp_path / "job")
    figures = aot.compile_train_step(job)
    assert figures["num_devices"] == 8 and figures["mesh"] == {"replica": 1, "data": 4, "mdl": 2}
    assert figures["num_params"] == 104_192
    total_param_bytes = figures["num_params"] * 4
    # Sharded over 8 devices (norm scales etc. partly replicated): well under the full size.
    assert total_param_bytes / 8 <= figures["params_bytes_per_device"] < total_param_bytes / 2
    # Adam keeps two moments per parameter, sharded like the parameters.
    assert math.isclose(
        figures["opt_state_bytes_per_device"], 2 * figures["params_bytes_per_device"], rel_tol=0.05
    )
    assert figures["xla_flops_per_step"] > 0 and figures["global_batch"] == 128
    assert not (tmp_path / "job").exists()
    assert "XLA FLOPs per step" in aot.format_report("LmSyntheticTiny", figures)
    assert jax.device_count() == 8
