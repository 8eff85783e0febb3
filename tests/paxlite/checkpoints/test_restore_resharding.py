"""Checkpoints restore resharded: written on 8 devices, read on 4 and 2, and written on 2, read
on 8; training goes on exactly as a run that was never stopped (same losses, same parameters).

The reference is an uninterrupted run, so a restore that loses the input position (and so
trains on other batches: the synthetic input's batches depend on their position) fails.
"""

import shutil

import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from tasks.lm.synthetic import LmSyntheticTiny

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

STEPS, STOP = 4, 2  # Resumed for 2 steps: the restored state and input position both show.


def _job(job_dir, ici, devices):
    cls = base_experiment.with_overrides(
        LmSyntheticTiny,
        {
            "ICI_MESH_SHAPE": ici,
            "NUM_TRAIN_STEPS": STEPS,
            "SUMMARY_INTERVAL_STEPS": 1,
            "CHECKPOINT_EVERY_N_STEPS": 100,
            "PERCORE_BATCH_SIZE": 1,
        },
    )
    exp = cls()
    return build_job(exp, exp.task(), exp.datasets(), job_dir, devices=devices)


def _run(job_dir, ici, devices, stop_at_step=None):
    job = _job(job_dir, ici, devices)
    return train_loop.run(job, stop_at_step=stop_at_step, peak_tflops=1.0)


def _losses_after_stop(result) -> list[float]:
    return [s["loss"] for step, s in result.history if step > STOP]


@pytest.fixture(scope="module")
def uninterrupted_and_stopped_on_8(tmp_path_factory):
    """(losses of steps STOP+1..STEPS and final params of a run never stopped, the job dir of
    a run on 8 devices stopped at STOP with its checkpoint)."""
    straight = _run(tmp_path_factory.mktemp("straight") / "job", (1, 8, 1), jax.devices())
    stopped = tmp_path_factory.mktemp("eight") / "job"
    _run(stopped, (1, 8, 1), jax.devices(), stop_at_step=STOP)
    assert sorted(p.name for p in (stopped / "checkpoints").iterdir()) == [str(STOP)]
    params = jax.device_get(straight.state.params)
    return _losses_after_stop(straight), params, stopped


def _assert_continues_as_uninterrupted(result, reference_losses, reference_params, count):
    leaf = jax.tree_util.tree_leaves(result.state.params)[0]
    assert len(leaf.sharding.device_set) == count
    np.testing.assert_allclose(_losses_after_stop(result), reference_losses, rtol=2e-5, atol=2e-5)
    params = jax.device_get(result.state.params)
    for got, want in zip(
        jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference_params), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_input_position_decides_the_batches(tmp_path):
    """The precondition of this file: resuming at the wrong input position gives other batches."""
    inp = _job(tmp_path / "job", (1, 8, 1), jax.devices()).train_input
    first = inp.get_next()
    inp.set_state({"index": STOP})
    assert not np.array_equal(inp.get_next().ids, first.ids)


@pytest.mark.slow
@pytest.mark.parametrize("count", [4, 2])
def test_restore_on_fewer_devices_continues_as_uninterrupted(
    tmp_path, uninterrupted_and_stopped_on_8, count
):
    reference_losses, reference_params, job8 = uninterrupted_and_stopped_on_8
    job = tmp_path / "job"
    shutil.copytree(job8, job)
    result = _run(job, (1, count, 1), jax.devices()[:count])
    _assert_continues_as_uninterrupted(result, reference_losses, reference_params, count)


@pytest.mark.slow
def test_restore_on_more_devices_continues_as_uninterrupted(
    tmp_path, uninterrupted_and_stopped_on_8
):
    """Written on 2 devices, restored on 8: as the run that went straight through on 8."""
    reference_losses, reference_params, _ = uninterrupted_and_stopped_on_8
    job = tmp_path / "job"
    _run(job, (1, 2, 1), jax.devices()[:2], stop_at_step=STOP)
    result = _run(job, (1, 8, 1), jax.devices())
    _assert_continues_as_uninterrupted(result, reference_losses, reference_params, 8)
