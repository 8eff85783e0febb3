"""The first failed background write of an orbax save, seen the moment it fails.

An asynchronous orbax save writes its arrays in background "commit" futures. When one
fails on one process of a multi-process job, orbax learns it only after a barrier that
the other processes never reach (they wait at the barrier of a complete write): the
failing process and its peers wait until the save's timeout (20 minutes by default)
before anyone reports anything. The save handlers here hand orbax the same futures,
watched: a failure is recorded as it is raised, so the trainer can stop at once with the
cause (and the job's other processes stop with it; ``paxlite.runtime.distributed``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class CommitWatch:
    """The first error raised by a watched commit future (None while none failed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    @property
    def error(self) -> BaseException | None:
        with self._lock:
            return self._error

    def record(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error

    def watched(self, futures: Sequence[Any] | None) -> list[Any] | None:
        """``futures`` (orbax's commit futures), each recording its failure here."""
        return None if futures is None else [_WatchedFuture(f, self) for f in futures]


class _WatchedFuture:
    """An orbax commit future whose ``result`` records a failure in a CommitWatch."""

    def __init__(self, future: Any, watch: CommitWatch):
        self._future, self._watch = future, watch

    def result(self, timeout: float | None = None) -> Any:
        try:
            return self._future.result(timeout=timeout)
        except BaseException as e:
            self._watch.record(e)
            raise

    def __getattr__(self, name: str) -> Any:  # Anything else orbax asks of its future.
        return getattr(self._future, name)


def watch_commits(handler: Any, watch: CommitWatch) -> Any:
    """``handler`` (an orbax checkpoint handler), its saves' commit futures watched by
    ``watch``; returns the same handler.

    The instance's ``async_save`` is wrapped rather than the class subclassed: orbax finds
    the handler of a save's arguments by its exact class, and records that class in each
    checkpoint's metadata.
    """
    save = handler.async_save

    async def async_save(*args: Any, **kwargs: Any) -> list[Any] | None:
        return watch.watched(await save(*args, **kwargs))

    handler.async_save = async_save
    return handler
