"""``--mode=eval``: one pass of every eval input with the latest checkpoint's parameters."""

from __future__ import annotations

from paxlite import eval_lib, train_setup
from paxlite.job import Job
from paxlite.periodic_actions import RunResult


def run(job: Job) -> RunResult:
    """Evaluates the latest checkpoint; its metrics by input name are ``result.eval``.

    Raises:
      FileNotFoundError: the job dir has no checkpoint.
    """
    with train_setup.restored(job, purpose="--mode=eval") as run_state:
        eval_step = train_setup.jit_eval_step(job, run_state.shardings.params)
        evaluator = eval_lib.Evaluator(eval_step, job.eval_inputs, job.job_log_dir, job.to_global)
        state = run_state.state
        try:
            return RunResult(eval=evaluator.run(state.params, int(state.step)), state=state)
        finally:
            evaluator.close()
