"""Outputs a run goes on without: summaries, profiles and decoder outputs.

A write of one of these that fails (a bucket refusing uploads, a full disk) does not stop
training: the first failure of each kind prints one warning line with the path and the
cause, and :func:`report` (the run's last line) lists what is still unwritten at the end.
A later write of the same file that succeeds (a summary file is uploaded whole at every
flush) takes it off the list. Checkpoints and benchmark reports are not best-effort: their
failures stop the run (``paxlite.runtime.storage.StorageWriteError``).
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable

from paxlite.runtime import storage


class Output(enum.Enum):
    """The kinds of output a run can do without."""

    SUMMARIES = "summaries"
    PROFILE = "profile"
    DECODER_OUTPUTS = "decoder outputs"


_unwritten: dict[str, Output] = {}  # Path -> kind, for files whose last write failed.
_warned: set[Output] = set()


def write(kind: Output, path: os.PathLike | str, write_fn: Callable[[], object]) -> bool:
    """Calls ``write_fn`` (which writes ``path``); on failure warns (once per kind) and
    records ``path`` as unwritten instead of raising. Returns whether it succeeded."""
    key = os.fspath(path)
    try:
        write_fn()
    except Exception as e:  # noqa: BLE001 (file systems and gcsfs raise many kinds)
        _unwritten[key] = kind
        if kind not in _warned:
            _warned.add(kind)
            _warn(
                f"cannot write {kind.value} to {key}: {storage.one_line(e)}; the run goes on "
                f"without them (later failures of {kind.value} are counted, not printed)"
            )
        return False
    _unwritten.pop(key, None)
    return True


def report() -> str | None:
    """One line naming what is still unwritten, by kind (None: everything was written)."""
    if not _unwritten:
        return None
    parts = []
    for kind in Output:
        paths = sorted(p for p, k in _unwritten.items() if k is kind)
        if paths:
            more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
            parts.append(f"{kind.value}: {paths[0]}{more}")
    return "paxlite: warning: not written (storage errors above): " + "; ".join(parts)


def reset() -> None:
    """Forgets recorded failures (a new run in the same process)."""
    _unwritten.clear()
    _warned.clear()


def _warn(message: str) -> None:
    print(f"paxlite: warning: {message}", file=sys.stderr, flush=True)
