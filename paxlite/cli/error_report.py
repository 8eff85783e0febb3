"""The whole story of an error that the console tells in one line.

While a run lasts, what the storage libraries log (orbax, gcsfs, fsspec, google-auth,
aiohttp) is held here instead of printed: their failures reach the user as paxlite's own
``paxlite: error:`` line. When the run fails, :func:`write` puts the traceback and those
records into a local file, copies it into ``<job_log_dir>/logs/`` when the job directory
accepts writes, and returns where both are, for the line to name.
"""

from __future__ import annotations

import collections
import logging
import os
import pathlib
import tempfile
import threading
import time
import traceback

from absl import logging as absl_logging
from etils import epath

_LIBRARIES = ("orbax", "gcsfs", "fsspec", "google", "aiohttp")
_KEPT_RECORDS = 1000
_COPY_TIMEOUT_S = 30  # A bucket that answers 503 keeps gcsfs retrying far longer.


class _LibraryRecords(logging.Filter):
    """A filter on absl's handler: records of the storage libraries are kept, not printed."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEPT_RECORDS)
        self._format = logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(pathname)s:%(lineno)d] %(message)s"
        )

    def filter(self, record: logging.LogRecord) -> bool:
        library = record.name.split(".")[0] in _LIBRARIES or "/orbax/" in record.pathname
        if library:
            self.lines.append(self._format.format(record))
        return not library


_held: _LibraryRecords | None = None


def hold_library_logs() -> None:
    """From now on, the storage libraries' log records go to the error report, not the
    console (idempotent)."""
    global _held
    if _held is None:
        _held = _LibraryRecords()
        absl_logging.get_absl_handler().addFilter(_held)


def write(error: BaseException, job_log_dir: epath.Path | None) -> str:
    """Writes ``error``'s traceback and the held library records to a local file, copies it
    to ``<job_log_dir>/logs/`` if that accepts writes; returns where they are."""
    text = "".join(traceback.format_exception(error))
    if _held is not None and _held.lines:
        text += "\nWhat the storage libraries logged (newest last):\n" + "\n".join(_held.lines)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    local = pathlib.Path(tempfile.gettempdir()) / f"paxlite-error-{stamp}-{os.getpid()}.txt"
    local.write_text(text + "\n")
    if job_log_dir is None:
        return str(local)
    copy = epath.Path(job_log_dir) / "logs" / local.name
    return f"{local}, copied to {copy}" if _copy(text, copy) else str(local)


def _copy(text: str, target: epath.Path) -> bool:
    """Writes ``text`` to ``target`` within a time limit; whether it was written."""
    done = threading.Event()

    def copy() -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text + "\n")
            done.set()
        except Exception:  # noqa: BLE001 (the storage that failed may refuse this too)
            pass

    thread = threading.Thread(target=copy, name="paxlite-error-copy", daemon=True)
    thread.start()
    thread.join(timeout=_COPY_TIMEOUT_S)
    return done.is_set()
