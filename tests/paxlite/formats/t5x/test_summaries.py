"""T5X's TensorBoard names from paxlite's metrics, over a summary period of several steps.

Oracle: T5X's definitions (``t5x/models.py``, clu's ``AveragePerStep`` and ``Average``)
written in numpy on the same per-step numbers.
"""

import numpy as np
import pytest

from paxlite.formats.t5x.summaries import T5xSummaries

LAYOUT = T5xSummaries(
    task_name="my_task", batch_size=8, eval_batch_size=4, target_length=16, num_devices=2
)


def _steps():
    rng = np.random.default_rng(0)
    return [
        {
            "loss": float(rng.uniform(5, 7)),
            "log_pplx": 0.0,
            "accuracy": float(rng.uniform(0, 0.1)),
            "num_tokens": float(rng.integers(60, 128)),
            "learning_rate": 1e-3 * (i + 1),
        }
        for i in range(3)
    ]


def test_a_period_s_train_scalars_are_t5x_s_averages_per_step():
    steps = _steps()
    for step in steps:
        step["log_pplx"] = step["loss"] - 0.004  # The z-loss term per token.
    weights = np.array([s["num_tokens"] for s in steps])
    sums = np.array([s["loss"] for s in steps]) * weights  # T5X's summed loss per step.
    xent = np.array([s["log_pplx"] for s in steps]) * weights
    got = LAYOUT.train_scalars(steps, {"steps_per_sec": 6.0})
    assert got["loss"] == pytest.approx(sums.mean())
    assert got["cross_ent_loss"] == pytest.approx(xent.mean())
    assert got["z_loss"] == pytest.approx((sums - xent).mean())
    assert got["loss_per_nonpadding_target_token"] == pytest.approx(sums.sum() / weights.sum())
    assert got["loss_per_all_target_tokens"] == pytest.approx(sums.sum() / (3 * 8 * 16))
    correct = np.array([s["accuracy"] for s in steps]) * weights
    assert got["accuracy"] == pytest.approx(correct.sum() / weights.sum())
    assert got["learning_rate"] == pytest.approx(2e-3) and got["learning_rate/current"] == 3e-3
    assert got["timing/seconds"] == pytest.approx(0.5) and got["timing/seqs"] == 24
    assert got["timing/steps_per_second"] == pytest.approx(6.0)
    assert got["timing/target_tokens_per_second_per_core"] == pytest.approx(6 * 128 / 2)


def test_a_training_eval_s_loss_is_its_per_batch_sum_averaged():
    metrics = {
        "loss": 6.0,
        "log_pplx": 5.99,
        "accuracy": 0.25,
        "num_tokens": 100.0,
        "num_batches": 2.0,
    }
    got = LAYOUT.eval_scalars("validation", metrics)
    assert LAYOUT.eval_run("validation") == "training_eval/my_task"
    assert got["loss"] == pytest.approx(300.0) and got["cross_ent_loss"] == pytest.approx(299.5)
    assert got["z_loss"] == pytest.approx(0.5)
    assert got["loss_per_nonpadding_target_token"] == pytest.approx(6.0)
    assert got["loss_per_all_target_tokens"] == pytest.approx(600.0 / (2 * 4 * 16))
    assert got["accuracy"] == pytest.approx(0.25)


def test_an_inference_eval_s_scalars_are_the_task_s_metrics_as_seqio_names_them():
    metrics = {
        "num_examples": 40.0,
        "num_batches": 5.0,
        "mean_score": -50.0,
        "mean_decode_length": 13.0,
        "seconds": 2.0,
        "sequence_accuracy": 0.25,
        "bleu": 12.5,
    }
    assert LAYOUT.decode_run("validation_decode") == "inference_eval/my_task"
    got = LAYOUT.decode_scalars("validation_decode", metrics)
    assert got == {"eval/sequence_accuracy": 0.25, "eval/bleu": 12.5}
