"""One eval pass over an input, with Pax's semantics (see BaseInput)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from praxis_lite.base_input import BaseInput
from praxis_lite.py_utils import NestedMap


def run_eval_pass(
    eval_step: Callable[[Any, Any], dict[str, jax.Array]],
    params: Any,
    eval_input: BaseInput,
    to_global: Callable[[NestedMap], Any],
) -> dict[str, float]:
    """Averages the eval metrics over one pass.

    With ``reset_for_eval`` the pass reads until the input is exhausted and then
    rewinds it; otherwise it reads ``eval_loop_num_batches`` batches.

    Returns:
      loss and accuracy (weighted by tokens), log_pplx, num_batches, num_tokens.
    """
    totals = {"loss_sum": 0.0, "correct_sum": 0.0, "weight_sum": 0.0}
    num_batches = 0
    while eval_input.reset_for_eval or num_batches < eval_input.eval_loop_num_batches:
        try:
            batch = eval_input.get_next()
        except StopIteration:
            break
        sums = jax.device_get(eval_step(params, to_global(batch)))
        for key in totals:
            totals[key] += float(np.asarray(sums[key]))
        num_batches += 1
    if eval_input.reset_for_eval:
        eval_input.reset()
    if num_batches == 0:
        raise ValueError(f"Eval input '{eval_input.name}' produced no batch.")
    weight = max(totals["weight_sum"], 1e-8)
    loss = totals["loss_sum"] / weight
    return {
        "loss": loss,
        "log_pplx": loss,
        "accuracy": totals["correct_sum"] / weight,
        "num_batches": float(num_batches),
        "num_tokens": totals["weight_sum"],
    }
