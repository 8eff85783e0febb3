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

    If the input has ``score_metric_fns`` (and ``eval_step`` returns per-example
    scores), each fn is called with the detokenized targets and the summed
    log-likelihood of every real example (weight > 0), once per pass.

    Returns:
      loss and accuracy (weighted by tokens), log_pplx, num_batches, num_tokens,
      and the score metrics by name.
    """
    totals = {"loss_sum": 0.0, "correct_sum": 0.0, "weight_sum": 0.0}
    targets: list[str] = []
    scores: list[float] = []
    num_batches = 0
    while eval_input.reset_for_eval or num_batches < eval_input.eval_loop_num_batches:
        try:
            batch = eval_input.get_next()
        except StopIteration:
            break
        sums = jax.device_get(eval_step(params, to_global(batch)))
        for key in totals:
            totals[key] += float(np.asarray(sums[key]))
        if "example_score" in sums:
            real = np.asarray(sums["example_weight"]) > 0
            labels = np.asarray(sums["labels"])[real]
            lengths = [int(np.count_nonzero(row)) for row in labels]
            targets += eval_input.ids_to_strings(labels, lengths)
            scores += [float(x) for x in np.asarray(sums["example_score"])[real]]
        num_batches += 1
    if eval_input.reset_for_eval:
        eval_input.reset()
    if num_batches == 0:
        raise ValueError(f"Eval input '{eval_input.name}' produced no batch.")
    weight = max(totals["weight_sum"], 1e-8)
    loss = totals["loss_sum"] / weight
    metrics = {
        "loss": loss,
        "log_pplx": loss,
        "accuracy": totals["correct_sum"] / weight,
        "num_batches": float(num_batches),
        "num_tokens": totals["weight_sum"],
    }
    for metric_fn in eval_input.score_metric_fns if scores else ():
        for name, value in metric_fn(targets, scores).items():
            metrics[name] = float(getattr(value, "value", value))
    return metrics
