"""Checkpoints restore resharded: written on 8 devices, read on 4 and 2, and written on 2, read
on 8; training goes on with the same losses."""

import shutil

import jax
import numpy as np
import pytest

from paxlite import base_experiment, train
from tasks.lm.synthetic import LmSyntheticTiny


def _run(job_dir, ici, devices, steps):
    cls = base_experiment.with_overrides(
        LmSyntheticTiny,
        {
            "ICI_MESH_SHAPE": ici,
            "NUM_TRAIN_STEPS": steps,
            "SUMMARY_INTERVAL_STEPS": 1,
            "SAVE_INTERVAL_STEPS": 10,
            "PERCORE_BATCH_SIZE": 1,
        },
    )
    exp = cls()
    job = train.build_job(exp, exp.task(), exp.datasets(), job_dir, devices=devices)
    return train.run(job, train.Mode.TRAIN)


@pytest.fixture(scope="module")
def trained_on_8(tmp_path_factory):
    job = tmp_path_factory.mktemp("eight") / "job"
    _run(job, (1, 8, 1), jax.devices(), 10)
    reference = _run(job, (1, 8, 1), jax.devices(), 14)  # continues on the same 8 devices
    return job, [s["loss"] for step, s in reference["history"] if step > 10]


@pytest.mark.parametrize("count", [4, 2])
def test_restore_on_fewer_devices_continues_with_the_same_losses(tmp_path, trained_on_8, count):
    job8, reference_losses = trained_on_8
    job = tmp_path / "job"
    shutil.copytree(job8, job)
    shutil.rmtree(job / "checkpoints" / "14")  # start again from the step-10 checkpoint
    result = _run(job, (1, count, 1), jax.devices()[:count], 14)
    leaf = jax.tree_util.tree_leaves(result["state"].params)[0]
    assert len(leaf.sharding.device_set) == count
    losses = [s["loss"] for step, s in result["history"] if step > 10]
    np.testing.assert_allclose(losses, reference_losses, rtol=2e-5, atol=2e-5)


def test_restore_on_more_devices_continues_with_the_same_losses(tmp_path, trained_on_8):
    """Written on 2 devices, restored on 8: the same losses as the run that stayed on 8."""
    job8, reference_losses = trained_on_8
    job = tmp_path / "job"
    _run(job, (1, 2, 1), jax.devices()[:2], 10)
    result = _run(job, (1, 8, 1), jax.devices(), 14)
    leaf = jax.tree_util.tree_leaves(result["state"].params)[0]
    assert len(leaf.sharding.device_set) == 8
    losses = [s["loss"] for step, s in result["history"] if step > 10]
    np.testing.assert_allclose(losses, reference_losses, rtol=2e-5, atol=2e-5)
