"""``python -m paxlite.t5x.eval``: T5X's ``t5x/eval.py`` command, run by paxlite.

A T5X user replaces ``python3 ${T5X_DIR}/t5x/eval.py`` by ``python -m paxlite.t5x.eval``
and keeps the rest::

    python -m paxlite.t5x.eval --gin_file=USER_DIR/my_eval.gin --gin_search_paths=USER_DIR \\
      --gin.CHECKPOINT_PATH=\\"/tmp/model_dir/checkpoint_1000\\" \\
      --gin.EVAL_OUTPUT_DIR=\\"/tmp/eval\\"

The gin files are T5X's (a model gin file and ``t5x/configs/runs/eval.gin``, which paxlite
has). CHECKPOINT_PATH: a T5X checkpoint step (``checkpoint_<step>``), a paxlite job
directory or step, or a Hugging Face model directory; with ``RestoreCheckpointConfig.mode``
'latest' a T5X model directory's (or paxlite job's) newest step, with 'all' each of its
steps not evaluated yet. The dataset's task is decoded as the gin files say (beam search or
``temperature_sample``) and scored, by seqio's own ``Evaluator`` with T5X's loggers. Into
EVAL_OUTPUT_DIR goes what T5X writes: ``config.gin``, ``model-info.txt``,
``inference_eval/<task>-<step>.jsonl``, ``inference_eval/<task>-metrics.jsonl``,
TensorBoard's ``inference_eval/<task>/eval/<metric>``, and ``eval.<task>.ckpt`` (the
checkpoints evaluated). docs/t5x.md shows T5X's README commands beside these.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Before TensorFlow (SeqIO's) loads.

import jax  # noqa: E402
from etils import epath  # noqa: E402

from paxlite.cli.exits import fail  # noqa: E402
from paxlite.formats.t5x import gin_run, inference_eval  # noqa: E402
from paxlite.t5x import command, inference_run  # noqa: E402


def main(argv: Sequence[str]) -> None:
    """Evaluates each checkpoint CHECKPOINT_PATH names, as T5X's ``evaluate`` does."""
    run, inference = inference_run.read_inference(gin_run.EVAL, "EVAL_OUTPUT_DIR")
    call = run.call
    paths = inference_run.checkpoint_paths(inference.restore)
    output_dir = epath.Path(call.output_dir)
    record = output_dir / f"eval.{inference.knobs['MIXTURE_OR_TASK_NAME']}.ckpt"
    if inference.restore.mode == "all":  # T5X skips what an earlier run evaluated.
        paths = [p for p in paths if p not in _evaluated(record)]
    job = inference_run.prepared_job(inference.knobs, str(output_dir), "EVAL_OUTPUT_DIR")
    dataset = inference.dataset
    config = inference_eval.T5xInferenceEval(
        mixture_or_task_name=inference.knobs["MIXTURE_OR_TASK_NAME"],
        split=dataset.split,
        batch_size=int(dataset.batch_size),
        seed=dataset.seed,
        use_cached=bool(dataset.use_cached),
        task_feature_lengths=dataset.task_feature_lengths,
        use_memory_cache=bool(dataset.use_memory_cache),
    )
    program = None
    for path in paths:
        restored = inference_run.restored_params(job, path, inference.restore.dtype)
        if program is None:  # Once the first checkpoint is read: nothing written before.
            try:
                evaluator = config.evaluator(output_dir, call.inference_evaluator_cls)
            except inference_eval.InferenceEvalError as e:
                fail(e)
            inference_run.write_first_files(job, output_dir, run.config_text, restored.state.params)
            shardings = restored.shardings.params
            program = inference_eval.InferenceEvalProgram(evaluator, job, shardings, config)
        program.run(restored.state.params, int(restored.state.step))
        if jax.process_index() == 0:
            done = _evaluated(record) | {path}
            record.write_text("\n".join(sorted(done, key=_step_order)))
    if not paths:
        print(
            f"paxlite: every checkpoint of {', '.join(inference.restore.paths)} is evaluated "
            f"already ({record})."
        )


def _evaluated(record: epath.Path) -> set[str]:
    """The checkpoints ``eval.<task>.ckpt`` lists (T5X's record of what eval evaluated)."""
    return set(record.read_text().split()) if record.exists() else set()


def _step_order(path: str) -> tuple[int, str]:
    """T5X's order of evaluated checkpoints: by step, then path."""
    tail = path.rstrip("/").rsplit("_", 1)[-1].rsplit("/", 1)[-1]
    return (int(tail) if tail.isdigit() else -1, path)


parse = command.parser(__doc__)


def run() -> None:
    """Console-script entry point (``paxlite-t5x-eval``) and ``python -m``."""
    command.run(main, parse)


if __name__ == "__main__":
    sys.exit(run())
