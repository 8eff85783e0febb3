"""``--mode=eval``: one pass of every eval input with the latest checkpoint's parameters."""

from __future__ import annotations

from paxlite.evaluation import eval_lib
from paxlite.runtime.job import Job
from paxlite.train import summaries, train_setup
from paxlite.train.periodic_actions import RunResult


def run(job: Job, checkpoint: str | None = None, step: int | None = None) -> RunResult:
    """Evaluates the latest checkpoint; its metrics by input name are ``result.eval``.

    ``checkpoint``: another checkpoint to read the parameters of (Pax's
    ``--restore_checkpoint_dir``; any kind ``paxlite.checkpoints.checkpoint_sources`` reads), at
    ``step`` (None: its newest); outputs still go to the job dir.

    Raises:
      FileNotFoundError: no ``checkpoint`` and the job dir has none.
    """
    with train_setup.restored(job, "--mode=eval", checkpoint, step) as run_state:
        eval_step = train_setup.jit_eval_step(job, run_state.shardings.params)
        evaluator = eval_lib.Evaluator(
            eval_step,
            job.eval_inputs,
            job.job_log_dir,
            job.to_global,
            summaries.layout_of(job.task),
        )
        state = run_state.state
        try:
            return RunResult(eval=evaluator.run(state.params, int(state.step)), state=state)
        finally:
            evaluator.close()
