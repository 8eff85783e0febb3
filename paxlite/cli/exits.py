"""How a paxlite process ends: its exit code, its last line, and nothing left running.

Exit codes (docs/troubleshooting.md, "Exit codes"):

====  ==========================================================================
0     done (a line lists summaries, profiles or decoder outputs left unwritten)
2     bad input, found before anything ran: one ``paxlite: error:`` line
3     divergence: a non-finite loss or gradient; the last good checkpoint is kept
4     another process of the job was lost or failed; this one stopped
5     storage: a checkpoint (or benchmark report) could not be written; the complete
      checkpoints are kept, rerun the same command once the storage works
143   preempted (SIGTERM) with its checkpoint complete: rerun to resume
====  ==========================================================================
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

from etils import epath

from paxlite.cli import error_report
from paxlite.runtime import best_effort, distributed, storage
from paxlite.train.periodic_actions import PREEMPTED_EXIT_CODE

BAD_INPUT_EXIT_CODE = 2
DIVERGED_EXIT_CODE = 3
STORAGE_EXIT_CODE = storage.WRITE_FAILED_EXIT_CODE
_ORDERLY = (0, PREEMPTED_EXIT_CODE)  # 4 is distributed.PEER_LOST_EXIT_CODE.


class Failed(SystemExit):
    """How :func:`fail` ends a run: ``code``, and the message of its line (``message``),
    which :func:`end_process` sends to the job's other processes."""

    def __init__(self, code: int, message: str):
        super().__init__(code)
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return type(self), (self.code, self.message)


def fail(message: object, code: int = BAD_INPUT_EXIT_CODE) -> NoReturn:
    """Ends the run with one ``paxlite: error:`` line on stderr."""
    print(f"paxlite: error: {message}", file=sys.stderr)
    raise Failed(code, str(message))


def fail_storage(error: storage.StorageWriteError, job_log_dir: epath.Path | None) -> NoReturn:
    """Ends the run with exit code 5: the error's line, naming the file that holds the
    traceback and what the storage libraries logged (``paxlite.cli.error_report``).

    In a multi-process job where another process failed first, that process's failure is
    reported instead (``distributed.stop_if_a_peer_failed``): this one's is its echo."""
    distributed.stop_if_a_peer_failed()
    fail(f"{error}. Details: {error_report.write(error, job_log_dir)}", STORAGE_EXIT_CODE)


def report_unwritten() -> None:
    """The run's last line, when summaries, profiles or decoder outputs were not written."""
    line = best_effort.report()
    if line is not None:
        print(line, file=sys.stderr, flush=True)


def end_process(error: BaseException) -> None:
    """The console entry point's last act, with how ``main`` ended (``SystemExit`` or an
    error): tells the other processes (the code, and the error line if :func:`fail` printed
    one); then an orderly end closes what still runs
    (and returns, for the interpreter to exit), a failing one leaves at once.

    Leaving at once (``os._exit``, streams flushed) is what a failing process needs:
    JAX's exit-time shutdown would wait at a barrier for peers that stop because of
    this failure, and a storage call that hangs would hold the interpreter's exit.
    """
    code = error.code if isinstance(error, SystemExit) else 1
    number = 0 if code is None else code if isinstance(code, int) else 1
    if not isinstance(error, SystemExit):
        traceback.print_exception(error)
        distributed.stop_if_a_peer_failed()  # This error may be a failed peer's echo.
    elif isinstance(code, str):
        print(code, file=sys.stderr)
    distributed.report_exit(number, error.message if isinstance(error, Failed) else None)
    if number in _ORDERLY:
        distributed.shutdown()
        storage.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(number)
