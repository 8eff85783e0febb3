"""``--mode=decode``: decode every decoder input with the latest checkpoint's parameters."""

from __future__ import annotations

from paxlite.evaluation import decode_lib
from paxlite.runtime.job import Job
from paxlite.train import train_setup
from paxlite.train.periodic_actions import RunResult


def run(job: Job, checkpoint: str | None = None, step: int | None = None) -> RunResult:
    """Decodes with the latest checkpoint; metrics by input name are ``result.decode``.

    Outputs go to ``<job_log_dir>/decoder_out`` (see ``paxlite.evaluation.decode_lib``).

    ``checkpoint``: another checkpoint to read the parameters of (Pax's
    ``--restore_checkpoint_dir``; any kind ``paxlite.checkpoints.checkpoint_sources`` reads), at
    ``step`` (None: its newest); outputs still go to the job dir.

    Raises:
      FileNotFoundError: no ``checkpoint`` and the job dir has none.
    """
    with train_setup.restored(job, "--mode=decode", checkpoint, step) as run_state:
        program = decode_lib.DecodeProgram.for_job(job, run_state.shardings.params)
        state = run_state.state
        try:
            return RunResult(decode=program.run(state.params, int(state.step)), state=state)
        finally:
            program.close()
