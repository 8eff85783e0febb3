"""The same tiny experiment on 1 device and on 8 (data, FSDP, tensor parallel): same losses."""

import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite import sharding
from tasks.lm.synthetic import LmSyntheticTiny

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

STEPS = 3  # Equal losses (dropout on) and weights show in 3 steps.


def _losses(tmp_path, name, devices, ici, rules):
    cls = base_experiment.with_overrides(
        LmSyntheticTiny,
        {
            "ICI_MESH_SHAPE": ici,
            "LOGICAL_AXIS_RULES": rules,
            "NUM_TRAIN_STEPS": STEPS,
            "SUMMARY_INTERVAL_STEPS": 1,
            "CHECKPOINT_EVERY_N_STEPS": 1000,
            "PERCORE_BATCH_SIZE": 1,
            "DROPOUT_PROB": 0.1,
        },
    )
    exp = cls()
    job = build_job(exp, exp.task(), exp.datasets(), tmp_path / name, devices=devices)
    result = train_loop.run(job, peak_tflops=1.0)  # (No MFU calibration.)
    params = result.state.params
    return [s["loss"] for _, s in result.history], params


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One device, batch 8 (PERCORE_BATCH_SIZE 1 x 8 devices in this process)."""
    return _losses(
        tmp_path_factory.mktemp("ref"),
        "one",
        jax.devices()[:1],
        (1, 1, 1),
        sharding.DATA_PARALLEL_RULES,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, ici, rules",
    [
        ("data", (1, 8, 1), sharding.DATA_PARALLEL_RULES),
        ("fsdp", (1, 8, 1), sharding.FSDP_RULES),
        ("tensor", (1, 2, 4), sharding.TENSOR_PARALLEL_RULES),
        ("fsdp_tensor", (2, 2, 2), sharding.FSDP_AND_TENSOR_PARALLEL_RULES),
    ],
)
def test_sharded_losses_match_one_device(tmp_path, reference, name, ici, rules):
    ref_losses, ref_params = reference
    losses, params = _losses(tmp_path, name, jax.devices(), ici, rules)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
    w1 = params["lm"]["transformer"]["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    if name in ("fsdp", "fsdp_tensor"):
        assert "data" in str(w1.sharding.spec)
    if name in ("tensor", "fsdp_tensor"):
        assert "mdl" in str(w1.sharding.spec)
    for a, b in zip(
        jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
