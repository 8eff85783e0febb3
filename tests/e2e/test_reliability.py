"""Preemption (SIGTERM) and divergence handling, end to end through main.py."""

import re
import shutil
import signal

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.paxlite.test_main import (
    EXP,
    restore_params,
    run_main,
    run_until_preempted,
    scalar_series,
)
from tests.processes import cpu_env, run_python

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

LOOP = [
    "--set=SUMMARY_INTERVAL_STEPS=5",
    "--set=CHECKPOINT_EVERY_N_STEPS=10",
    "--set=EVAL_INTERVAL_STEPS=0",
    "--peak_tflops=1",  # No MFU calibration: not what these tests check.
]


def _checkpoint_steps(job) -> list[int]:
    return sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())


#: The run that test_sigterm_saves_and_the_same_command_resumes_exactly preempts: SIGTERM goes
#: at the first summary (step 5) and is noticed within a step or two, well before step 40 (35
#: steps of margin, about 3 s, for a test process slow to read the summary line).
DROPOUT = [*LOOP, "--set=DROPOUT_PROB=0.1"]
RUN = [*DROPOUT, "--set=NUM_TRAIN_STEPS=40"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """RUN's job dir, not interrupted (checkpoints every 10 steps). Tests only read it."""
    job = tmp_path_factory.mktemp("straight") / "job"
    full = run_main(f"--job_log_dir={job}", *RUN)
    assert full.returncode == 0, full.stderr[-2000:]
    return job


@pytest.mark.slow
def test_divergence_stops_and_keeps_the_last_good_checkpoint(straight, tmp_path):
    job = tmp_path / "job"
    shutil.copytree(straight, job)  # copy2: mtimes kept
    good = _checkpoint_steps(job)
    assert good[-1] == 40, good
    before = {p: p.stat().st_mtime_ns for p in (job / "checkpoints").rglob("*") if p.is_file()}

    bad = run_main(
        f"--job_log_dir={job}",
        *DROPOUT,
        "--set=NUM_TRAIN_STEPS=60",
        "--set=LEARNING_RATE=1e30",
    )
    assert bad.returncode == 3, bad.stderr[-2000:]
    assert re.search(r"Non-finite loss or gradient at step 4[1-9]\b", bad.stderr)
    assert "last good checkpoint (step 40)" in bad.stderr and "Traceback" not in bad.stderr
    assert _checkpoint_steps(job) == good
    after = {p: p.stat().st_mtime_ns for p in (job / "checkpoints").rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_skipping_nonfinite_updates_counts_them_and_goes_on(tmp_path):
    job = tmp_path / "job"
    proc = run_main(
        f"--job_log_dir={job}",
        *LOOP,
        "--set=NUM_TRAIN_STEPS=10",
        "--set=LEARNING_RATE=1e30",
        "--fdl_set=task.skip_nonfinite_updates=True",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = scalar_series(job / "summaries" / "train", "train/nonfinite_steps")
    assert skipped[-1][1] > 0
    params = restore_params(job, 10)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(params))


@pytest.mark.slow
def test_a_skipped_nonfinite_step_leaves_params_and_optimizer_state_bit_equal():
    """The experiment's own train step, after a good step (so the optimizer moments are set):
    a batch whose loss is NaN (an infinite token weight) changes neither the params nor the
    optimizer state by a bit; the step still counts (TrainState.step), as a non-finite one."""
    from paxlite.experiments import base_experiment
    from paxlite.train import pure_steps
    from praxis_lite import config as config_lib
    from tasks.lm.synthetic import LmSyntheticTiny

    exp = base_experiment.with_overrides(LmSyntheticTiny, {"PERCORE_BATCH_SIZE": 2})()
    task_cfg = exp.task()
    task_cfg.skip_nonfinite_updates = True
    task = config_lib.instantiate(task_cfg)
    inp = config_lib.instantiate([c for c in exp.datasets() if c.is_training][0])
    good, bad = inp.get_next(), inp.get_next()
    bad.weights[0, 3] = np.inf
    init = jax.jit(lambda k, b: nn.unbox(pure_steps.make_init_fn(task)(k, b)))
    step_fn = jax.jit(pure_steps.make_train_step(task))
    key = jax.random.key(0)
    state, metrics = step_fn(init(key, good), good, key)
    assert np.isfinite(float(metrics["loss"])) and int(state.nonfinite_steps) == 0
    before = jax.device_get(state)

    after, metrics = step_fn(state, bad, key)
    assert not np.isfinite(float(metrics["loss"]))
    after = jax.device_get(after)
    assert int(after.step) == int(before.step) + 1
    assert int(after.nonfinite_steps) == 1 and int(after.first_nonfinite_step) == before.step
    for name in ("params", "opt_state"):
        old, new = getattr(before, name), getattr(after, name)
        assert jax.tree_util.tree_structure(old) == jax.tree_util.tree_structure(new)
        for x, y in zip(
            jax.tree_util.tree_leaves(old), jax.tree_util.tree_leaves(new), strict=True
        ):
            x, y = np.atleast_1d(x), np.atleast_1d(y)
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=name)


@pytest.mark.slow
def test_sigterm_saves_and_the_same_command_resumes_exactly(straight, tmp_path):
    preempted = tmp_path / "preempted"
    stopped = run_until_preempted(f"--job_log_dir={preempted}", *RUN, at="/40")
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "Preempted (SIGTERM) at step" in stopped.stdout
    saved = _checkpoint_steps(preempted)
    assert saved and saved[-1] < 40

    again = run_main(f"--job_log_dir={preempted}", *RUN)  # The same command again.
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"Restored checkpoint at step {saved[-1]}" in again.stdout
    a, b = restore_params(straight, 40), restore_params(preempted, 40)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


_KILL_DURING_SAVE = """
import os, signal, sys
from paxlite import main
from paxlite.checkpoints import train_checkpoints

real_save = train_checkpoints.Checkpointer.save

def save_then_die(self, step, *args):
    real_save(self, step, *args)  # The asynchronous write starts ...
    if step == int(os.environ["KILL_AT_SAVE"]):
        os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before it finishes.

train_checkpoints.Checkpointer.save = save_then_die
sys.argv = ["paxlite"] + sys.argv[1:]
main.run()
"""


@pytest.mark.slow
def test_a_save_killed_mid_write_is_skipped_and_older_checkpoints_survive(tmp_path):
    job = tmp_path / "job"
    args = [
        f"--exp={EXP}",
        f"--job_log_dir={job}",
        "--set=SUMMARY_INTERVAL_STEPS=4",
        "--set=CHECKPOINT_EVERY_N_STEPS=4",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--set=DROPOUT_PROB=0.1",  # As RUN: the same train step, compiled once.
        "--peak_tflops=1",
        "--set=NUM_TRAIN_STEPS=12",
        "--set=CHECKPOINT_MAX_TO_KEEP=1",
    ]
    killed = run_python(["-c", _KILL_DURING_SAVE, *args], cpu_env(1, KILL_AT_SAVE="8"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    names = sorted(p.name for p in (job / "checkpoints").iterdir())
    # The unfinished step 8 did not replace step 4, although only one is kept.
    assert names[0] == "4" and names[1].startswith("8.orbax-checkpoint-tmp"), names

    again = run_main(f"--job_log_dir={job}", *args[2:])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Skipped the checkpoint at step 8" in again.stdout
    assert "was interrupted before it completed" in again.stdout
    assert "Restored checkpoint at step 4" in again.stdout
    assert [p.name for p in (job / "checkpoints").iterdir()] == ["12"]
    losses = dict(scalar_series(job / "summaries" / "train", "train/loss"))
    assert max(losses) == 12 and np.isfinite(losses[12])
