"""``--mode=decode``: decode every decoder input with the latest checkpoint's parameters."""

from __future__ import annotations

from paxlite import decode_lib, train_setup
from paxlite.job import Job
from paxlite.periodic_actions import RunResult


def run(job: Job) -> RunResult:
    """Decodes with the latest checkpoint; metrics by input name are ``result.decode``.

    Outputs go to ``<job_log_dir>/decoder_out`` (see ``paxlite.decode_lib``).

    Raises:
      FileNotFoundError: the job dir has no checkpoint.
    """
    with train_setup.restored(job, purpose="--mode=decode") as run_state:
        program = decode_lib.DecodeProgram.for_job(job, run_state.shardings.params)
        state = run_state.state
        try:
            return RunResult(decode=program.run(state.params, int(state.step)), state=state)
        finally:
            program.close()
