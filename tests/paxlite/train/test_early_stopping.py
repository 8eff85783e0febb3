"""Pax's early stopping (TARGET_LOG_PPLX / SingleTask.target_log_pplx), run for real: the tiny
experiment trains until an eval reaches the target, saves that step and stops."""

import pytest

from paxlite.checkpoints import train_checkpoints
from tests.paxlite.test_main import run_main_in_process, scalar_series


def _train(job, target: float, mode: str) -> tuple[int, str]:
    code, out, err = run_main_in_process(
        f"--job_log_dir={job}",
        f"--mode={mode}",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=NUM_TRAIN_STEPS=30",
        "--set=EVAL_INTERVAL_STEPS=10",
        "--set=CHECKPOINT_EVERY_N_STEPS=25",
        "--set=SUMMARY_INTERVAL_STEPS=5",
        f"--set=TARGET_LOG_PPLX={target}",
    )
    return code, out + err


@pytest.mark.slow
def test_training_stops_with_a_checkpoint_at_the_eval_that_reaches_the_target(tmp_path):
    job = tmp_path / "job"
    # Any eval reaches a log-perplexity of 100. Pax's --mode=train evaluates (and stops) too.
    code, err = _train(job, target=100.0, mode="train")
    assert code == 0, err
    assert "training stops at step 10" in err
    # Step 10 is not a save step (every 25): the stop saved it, and nothing ran after it.
    assert train_checkpoints.Checkpointer(job, max_to_keep=10).all_steps() == [10]
    train_steps = [step for step, _ in scalar_series(job / "summaries" / "train", "train/loss")]
    assert max(train_steps) == 10


@pytest.mark.slow
def test_an_unreached_target_trains_to_the_end(tmp_path):
    job = tmp_path / "job"
    code, err = _train(job, target=1e-6, mode="train_and_eval")
    assert code == 0, err
    assert "training stops" not in err
    assert train_checkpoints.Checkpointer(job, max_to_keep=10).all_steps()[-1] == 30
