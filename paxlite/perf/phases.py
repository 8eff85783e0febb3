"""Progress of long one-off work (a compile for a TPU slice takes minutes): each phase says
when it starts, every ``every_s`` seconds that it is still running, and how long it took."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from paxlite.train import summaries


@contextlib.contextmanager
def phase(what: str, every_s: float = 10.0) -> Iterator[None]:
    """``what ...`` on the console now, ``what: still running (N s)`` every ``every_s``
    seconds it lasts, ``what: X.X s`` when it ends (or ``what: failed after X.X s``)."""
    summaries.log(f"{what} ...")
    start, done = time.perf_counter(), threading.Event()

    def remind() -> None:
        while not done.wait(every_s):
            summaries.log(f"{what}: still running ({time.perf_counter() - start:.0f} s)")

    reminder = threading.Thread(target=remind, name="paxlite-phase", daemon=True)
    reminder.start()
    ended = "failed after "
    try:
        yield
        ended = ""
    finally:
        done.set()
        reminder.join()
        summaries.log(f"{what}: {ended}{time.perf_counter() - start:.1f} s")
