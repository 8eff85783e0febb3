"""Eval pass semantics: eval_loop_num_batches vs. run-to-exhaustion with reset."""

import numpy as np

from paxlite.eval_lib import run_eval_pass
from tasks.lm.synthetic import SyntheticLmInput


def _sum_step(params, batch):
    ids = np.asarray(batch["ids"])
    return {"loss_sum": float(ids.sum()), "correct_sum": 0.0, "weight_sum": float(ids.size)}


def test_fixed_number_of_batches():
    inp = SyntheticLmInput(batch_size=2, seq_len=4, eval_loop_num_batches=3, is_training=False)
    metrics = run_eval_pass(_sum_step, None, inp, lambda b: b)
    assert metrics["num_batches"] == 3 and metrics["num_tokens"] == 24
    assert inp.get_state() == {"index": 3}  # not reset: the next pass continues


def test_reset_for_eval_runs_to_exhaustion_then_rewinds():
    inp = SyntheticLmInput(
        batch_size=2, seq_len=4, num_batches=5, reset_for_eval=True, is_training=False
    )
    first = run_eval_pass(_sum_step, None, inp, lambda b: b)
    second = run_eval_pass(_sum_step, None, inp, lambda b: b)
    assert first["num_batches"] == 5
    assert first == second
