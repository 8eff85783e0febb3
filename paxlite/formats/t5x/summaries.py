"""T5X's TensorBoard runs and scalar names, from paxlite's step and eval metrics.

T5X's ``train.py`` writes ``<MODEL_DIR>/train/`` and ``<MODEL_DIR>/training_eval/<task>/``;
its ``EncoderDecoderModel`` metrics (``t5x/models.py``) are over the weighted target tokens
``W`` with the loss a sum when ``loss_normalizing_factor`` is None: ``loss`` (cross-entropy
plus z-loss, summed), ``cross_ent_loss``, ``z_loss``, ``accuracy`` (over ``W``),
``loss_per_nonpadding_target_token`` (``/ W``), ``*_per_all_target_tokens`` (``/`` every
target position of the batch). The train run holds each summary period's average per step
(``clu``'s ``AveragePerStep``; the ratios are the period's sums divided), ``learning_rate``
(the period's mean) and ``learning_rate/current``, and ``timing/*`` over the period. A
training eval's ``loss`` is its per-batch sum averaged over its batches. An inference
eval (the task decoded) goes to ``inference_eval/<task>/`` as SeqIO's evaluator names its
metrics, ``eval/<metric>``.

From paxlite's metrics (``loss``, ``log_pplx`` per counted token, ``num_tokens = W``):
``loss = loss * W``, ``cross_ent_loss = log_pplx * W``, ``z_loss`` their difference. T5X's
``effective_batch_size/*`` and ``non_padding_fraction/*`` are the batch's, which the train
step does not report: they are not written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from paxlite.train.summaries import DECODE_STATISTICS

TRAIN_RUN = "train"


@dataclasses.dataclass(frozen=True)
class T5xSummaries:
    """T5X's runs and names (a ``paxlite.train.summaries.SummaryLayout``).

    Attributes:
      task_name: the training eval's run, ``training_eval/<task_name>`` (T5X's
        ``MIXTURE_OR_TASK_NAME``).
      batch_size: examples per train step (global); eval_batch_size: per eval batch.
      target_length: target positions per example (``TASK_FEATURE_LENGTHS['targets']``).
      num_devices: T5X's cores, for ``timing/*_per_core``.
    """

    task_name: str
    batch_size: int
    eval_batch_size: int
    target_length: int
    num_devices: int

    uses_every_step = True

    def train_run(self) -> str:
        return TRAIN_RUN

    def eval_run(self, input_name: str) -> str:
        return f"training_eval/{self.task_name}"

    def train_scalars(
        self, steps: Sequence[Mapping[str, float]], rates: Mapping[str, float]
    ) -> dict[str, float]:
        """The period's T5X train scalars (``steps``: each step's paxlite metrics)."""
        n = len(steps)
        sums = _loss_sums(steps)
        positions = n * self.batch_size * self.target_length
        seconds = n / rates["steps_per_sec"] if rates.get("steps_per_sec") else 0.0
        per_second = 1.0 / seconds if seconds > 0 else 0.0
        learning_rates = [s["learning_rate"] for s in steps]
        return {
            **_loss_scalars(sums, per_step=n, positions=positions),
            "learning_rate": sum(learning_rates) / n,
            "learning_rate/current": learning_rates[-1],
            "timing/seconds": seconds,
            "timing/seqs": float(n * self.batch_size),
            "timing/steps_per_second": n * per_second,
            "timing/seqs_per_second": n * self.batch_size * per_second,
            "timing/seqs_per_second_per_core": n * self.batch_size * per_second / self.num_devices,
            "timing/target_tokens_per_second": positions * per_second,
            "timing/target_tokens_per_second_per_core": positions * per_second / self.num_devices,
        }

    def eval_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]:
        """A training eval's T5X scalars (``metrics``: one pass's, per counted token)."""
        batches = int(metrics["num_batches"])
        weight = metrics["num_tokens"]
        sums = {
            "loss": metrics["loss"] * weight,
            "cross_ent_loss": metrics["log_pplx"] * weight,
            "correct": metrics["accuracy"] * weight,
            "weight": weight,
        }
        positions = batches * self.eval_batch_size * self.target_length
        return {
            **_loss_scalars(sums, per_step=batches, positions=positions),
            "timing/seqs": float(batches * self.eval_batch_size),
        }

    def decode_run(self, input_name: str) -> str:
        return f"inference_eval/{self.task_name}"

    def decode_scalars(self, input_name: str, metrics: Mapping[str, float]) -> dict[str, float]:
        """SeqIO's evaluator's names (``eval/<metric>``): the task's metrics only."""
        return {f"eval/{k}": float(v) for k, v in metrics.items() if k not in DECODE_STATISTICS}

    def first_step_scalars(self, first: Mapping[str, float]) -> dict[str, float]:
        return {"timing/compilation_seconds": first["compile_time_s"]}


def _loss_sums(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The period's summed loss, cross-entropy, correct tokens and weight ``W``."""
    out = {"loss": 0.0, "cross_ent_loss": 0.0, "correct": 0.0, "weight": 0.0}
    for step in steps:
        weight = step["num_tokens"]
        out["loss"] += step["loss"] * weight
        out["cross_ent_loss"] += step["log_pplx"] * weight
        out["correct"] += step["accuracy"] * weight
        out["weight"] += weight
    return out


def _loss_scalars(sums: Mapping[str, float], *, per_step: int, positions: int) -> dict[str, float]:
    """T5X's loss names from sums over ``per_step`` steps (or batches) of ``positions``
    target positions in all."""
    weight = max(sums["weight"], 1e-8)
    z_loss = sums["loss"] - sums["cross_ent_loss"]
    return {
        "loss": sums["loss"] / per_step,
        "cross_ent_loss": sums["cross_ent_loss"] / per_step,
        "z_loss": z_loss / per_step,
        "accuracy": sums["correct"] / weight,
        "loss_per_nonpadding_target_token": sums["loss"] / weight,
        "loss_per_all_target_tokens": sums["loss"] / positions,
        "cross_ent_loss_per_all_target_tokens": sums["cross_ent_loss"] / positions,
        "z_loss_per_all_target_tokens": z_loss / positions,
    }
