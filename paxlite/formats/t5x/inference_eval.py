"""T5X's inference evaluation: seqio's own ``Evaluator`` with T5X's loggers, fed by
paxlite's model (``inference.T5xModelFunctions``).

What it writes under ``<output dir>/inference_eval/`` is what T5X's writes there, by the
same code: ``<task>-<step:06>.jsonl`` (each example's ``input`` features, ``target``,
``output``, ``prediction``; scores where the task has score metrics),
``<task>-metrics.jsonl`` (a line per evaluated step) and TensorBoard's
``<task>/eval/<metric>``. T5X's ``eval`` command uses it on a checkpoint, its ``train``
command every ``eval_period`` (a task's ``inference_evaluator``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
from etils import epath

from paxlite.formats.t5x.inference import T5xModelFunctions
from paxlite.train import summaries

#: Where the evaluator writes, under the output (or model) directory, as T5X names it.
LOG_DIR = "inference_eval"


class InferenceEvalError(ValueError):
    """The task cannot be evaluated as asked (no metrics, or no such split)."""


@dataclasses.dataclass(frozen=True)
class T5xInferenceEval:
    """T5X's ``DatasetConfig`` of an inference eval (its field names) and how to build
    seqio's evaluator of it.

    ``task_feature_lengths`` None: the longest example's (seqio's); ``num_examples`` None:
    all of the split.
    """

    mixture_or_task_name: str
    split: str
    batch_size: int
    seed: int | None = None
    use_cached: bool = False
    task_feature_lengths: Mapping[str, int] | None = None
    use_memory_cache: bool = True

    def evaluator(self, output_dir: epath.PathLike, evaluator_cls: Any = None) -> Any:
        """seqio's evaluator writing under ``output_dir/inference_eval`` (``evaluator_cls``:
        gin's ``seqio.Evaluator`` with its bindings; None: T5X's default loggers)."""
        import seqio

        if evaluator_cls is None:
            evaluator_cls = functools.partial(
                seqio.Evaluator,
                logger_cls=[seqio.PyLoggingLogger, seqio.TensorBoardLogger, seqio.JSONLogger],
            )
        evaluator = evaluator_cls(
            mixture_or_task_name=self.mixture_or_task_name,
            feature_converter=seqio.EncDecFeatureConverter(pack=False),
            eval_split=self.split,
            use_cached=self.use_cached,
            seed=self.seed,
            sequence_length=dict(self.task_feature_lengths) if self.task_feature_lengths else None,
            use_memory_cache=self.use_memory_cache,
            log_dir=str(epath.Path(output_dir) / LOG_DIR),
        )
        if not evaluator.eval_tasks:
            raise InferenceEvalError(
                f"'{self.mixture_or_task_name}' has no metrics for evaluation, or no "
                f"'{self.split}' split (T5X's refusal too): give the task metric_fns, or "
                "another DatasetConfig.split."
            )
        return evaluator

    def for_job(self, job: Any, params_shardings: Any) -> InferenceEvalProgram | SkippedEval:
        """The program a training run calls every eval period (into the job directory); a
        task without metrics or without the split is skipped with a note, as T5X's
        training skips it."""
        try:
            evaluator = self.evaluator(job.job_log_dir)
        except InferenceEvalError as e:
            summaries.log(f"paxlite: note: no inference eval during training: {e}")
            return SkippedEval()
        return InferenceEvalProgram(evaluator, job, params_shardings, self)


class SkippedEval:
    """No inference eval (T5X's training skips a task it cannot evaluate)."""

    def run(self, params: Any, step: int) -> dict[str, dict[str, float]]:
        return {}

    def close(self) -> None:
        """Nothing to close."""


class InferenceEvalProgram:
    """seqio's evaluator run on a job's parameters: ``run(params, step)`` -> metrics."""

    def __init__(self, evaluator: Any, job: Any, params_shardings: Any, config: T5xInferenceEval):
        self._evaluator = evaluator
        # Compiled once, for every eval period (or checkpoint) of the program.
        self._functions = T5xModelFunctions(job, params_shardings, config.batch_size)

    def run(self, params: Any, step: int) -> dict[str, dict[str, float]]:
        """Evaluates every task of the mixture; their metrics by task name (process 0's)."""
        functions = self._functions
        functions.params = params
        all_metrics, _ = self._evaluator.evaluate(
            compute_metrics=jax.process_index() == 0,
            step=step,
            predict_fn=functions.predict,
            score_fn=functions.score,
            predict_with_aux_fn=functions.predict_with_aux,
        )
        results = all_metrics.result() or {}
        metrics = {
            task: {name: float(getattr(v, "value", v)) for name, v in values.items()}
            for task, values in results.items()
        }
        for task, values in metrics.items():
            shown = ", ".join(f"{k} {v:.4f}" for k, v in values.items())
            summaries.log(f"inference eval of '{task}' at step {step}: {shown}")
        return metrics

    def close(self) -> None:
        """Nothing to close: seqio's loggers flush as they write."""
