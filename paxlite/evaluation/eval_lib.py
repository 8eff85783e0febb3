"""One eval pass over an input, with Pax's semantics (see BaseInput)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from paxlite.train import summaries
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap


def run_eval_pass(
    eval_step: Callable[[Any, Any], dict[str, jax.Array]],
    params: Any,
    eval_input: BaseInput,
    to_global: Callable[[NestedMap], Any],
) -> dict[str, float]:
    """Averages the eval metrics over one pass.

    With ``reset_for_eval`` the pass reads until the input is exhausted (a repeating
    input: ``eval_loop_num_batches`` batches) and then rewinds it; otherwise it reads
    ``eval_loop_num_batches`` batches.

    If the input has ``score_metric_fns`` (and ``eval_step`` returns per-example
    scores), each fn is called with the detokenized targets and the summed
    log-likelihood of every real example (weight > 0), once per pass.

    Returns:
      the model's metrics averaged by their weights (``loss`` and, for LMs,
      accuracy and log_pplx over tokens), num_batches, num_tokens (the loss's
      summed weight), and the score metrics by name.
    """
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    targets: list[str] = []
    scores: list[float] = []
    num_batches = 0
    one_epoch = eval_input.reset_for_eval and not eval_input.repeats
    while one_epoch or num_batches < eval_input.eval_loop_num_batches:
        try:
            batch = eval_input.get_next()
        except StopIteration:
            break
        out = jax.device_get(eval_step(params, to_global(batch)))
        for name in out["sums"]:
            sums[name] = sums.get(name, 0.0) + float(np.asarray(out["sums"][name]))
            weights[name] = weights.get(name, 0.0) + float(np.asarray(out["weights"][name]))
        if "per_example" in out:
            new_targets, new_scores = _scored_examples(out["per_example"], eval_input)
            targets += new_targets
            scores += new_scores
        num_batches += 1
    if eval_input.reset_for_eval:
        eval_input.reset()
    if num_batches == 0:
        raise ValueError(f"Eval input '{eval_input.name}' produced no batch.")
    metrics = {name: total / max(weights[name], 1e-8) for name, total in sums.items()}
    metrics["num_batches"] = float(num_batches)
    metrics["num_tokens"] = weights["loss"]
    for metric_fn in eval_input.score_metric_fns if scores else ():
        for name, value in metric_fn(targets, scores).items():
            metrics[name] = float(getattr(value, "value", value))
    return metrics


def _scored_examples(per_example: dict[str, Any], eval_input: BaseInput):
    """``(target texts, scores)`` of the real examples (weight > 0) of one batch."""
    real = np.asarray(per_example["weight"]) > 0
    target_ids = np.asarray(per_example["target_ids"])[real]
    if "target_lengths" in per_example:  # Id 0 may be a real token (Hugging Face vocabularies).
        lengths = [int(n) for n in np.asarray(per_example["target_lengths"])[real]]
    else:
        lengths = [int(np.count_nonzero(row)) for row in target_ids]
    texts = eval_input.ids_to_strings(target_ids, lengths)
    return texts, [float(x) for x in np.asarray(per_example["score"])[real]]


class Evaluator:
    """The eval inputs of a run with their jitted step and summary writers (built once).

    Args:
      eval_step: the jitted ``eval_step(params, global_batch)`` (see ``pure_steps``).
      inputs: the eval inputs.
      job_log_dir: summaries go to the layout's eval run of each input under it.
      to_global: host-local numpy batch -> global arrays.
      layout: the task's summary layout (paxlite's: ``summaries/eval_<name>``).
    """

    def __init__(
        self,
        eval_step: Callable[[Any, Any], dict[str, Any]],
        inputs: list[BaseInput],
        job_log_dir: Any,
        to_global: Callable[[NestedMap], Any],
        layout: summaries.SummaryLayout | None = None,
    ):
        self._eval_step, self._inputs, self._to_global = eval_step, inputs, to_global
        self._layout = layout or summaries.PaxliteSummaries()
        self._writers = {
            i.name: summaries.writer_of(job_log_dir, self._layout.eval_run(i.name)) for i in inputs
        }

    def run(self, params: Any, step: int) -> dict[str, dict[str, float]]:
        """One pass of every eval input; writes summaries and a console line; metrics by name."""
        results = {}
        for inp in self._inputs:
            metrics = run_eval_pass(self._eval_step, params, inp, self._to_global)
            self._writers[inp.name].write_scalars(
                step, self._layout.eval_scalars(inp.name, metrics)
            )
            names = ["loss", *sorted(set(metrics) - {"loss", "num_batches", "num_tokens"})]
            shown = ", ".join(f"{k} {metrics[k]:.4f}" for k in names)
            summaries.log(
                f"eval '{inp.name}' at step {step}: {shown} over "
                f"{int(metrics['num_batches'])} batches"
            )
            results[inp.name] = metrics
        return results

    def close(self) -> None:
        """Closes the summary writers."""
        for writer in self._writers.values():
            writer.close()
