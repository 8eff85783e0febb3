"""Input prefetch: a background thread makes the next global batches while a step runs.

The thread reads host batches from the input, records the input's position after
each, and puts the batch on the devices (``to_global``), so the training loop
only takes a ready ``jax.Array`` batch from a queue. The position that belongs
to the batches the loop has taken (not to those still queued) is
:meth:`Prefetcher.input_state`: checkpoints save that one, so a resumed run reads
exactly the batches an uninterrupted run would. :meth:`Prefetcher.save_position`
pauses the reader to save its own position together with the host batches read
ahead (the pending ones), which a resumed run's Prefetcher replays first.
"""

from __future__ import annotations

import collections
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap

#: A host batch read ahead of the loop, with the input's ``get_state()`` after it.
Pending = tuple[NestedMap, dict[str, Any]]


class _Reader:
    """The input, the batches to replay before it, and the record of what is read ahead."""

    def __init__(self, inp: BaseInput, replay: Sequence[Pending]) -> None:
        self.inp = inp
        self.lock = threading.Lock()  # Held while the input reads; a save takes it too.
        # Appended by the reading thread, popped by the loop's; deque ops are atomic.
        self.pending: collections.deque[Pending] = collections.deque()
        self._replay = collections.deque(replay)

    def read(self) -> Pending:
        """The next host batch and the state after it, recorded as pending."""
        with self.lock:
            if self._replay:
                item = self._replay.popleft()
            else:
                item = (self.inp.get_next(), self.inp.get_state())
            self.pending.append(item)
            return item

    def taken(self) -> None:
        """The loop took the oldest pending batch (from the loop's thread, the one that
        saves: no lock, so taking a batch never waits for a read)."""
        self.pending.popleft()


def _produce(
    reader: _Reader, to_global: Callable[[Any], Any], out: queue.Queue, stop: threading.Event
) -> None:
    """Puts ``(global batch, input state after it, None)`` or ``(None, None, error)``."""
    while not stop.is_set():
        try:
            local, state = reader.read()
            item = (to_global(local), state, None)
        except BaseException as e:  # noqa: BLE001  (handed to the consumer)
            item = (None, None, e)
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                continue
        if item[2] is not None:
            return


class Prefetcher:
    """Iterates ``to_global(inp.get_next())`` from a daemon thread, ``depth`` batches ahead.

    ``replay``: host batches (with their states) to yield before reading the input, as
    :meth:`save_position` gave them to an earlier run.

    Use as a context manager (or call :meth:`close`): the thread stops and the
    input is left where the loop stopped taking batches only if nothing was
    queued, so after closing, use :meth:`input_state` (not ``inp.get_state()``).
    An exception of the input (StopIteration included) is raised by the
    :meth:`next` call that would have returned that batch.
    """

    def __init__(
        self,
        inp: BaseInput,
        to_global: Callable[[Any], Any],
        depth: int = 2,
        replay: Sequence[Pending] = (),
    ) -> None:
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be >= 1, got {depth}.")
        self._reader = _Reader(inp, replay)
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._state = inp.get_state()
        # The thread holds no reference to self: if the loop is left by an exception,
        # collecting this object stops the thread.
        self._thread = threading.Thread(
            target=_produce,
            args=(self._reader, to_global, self._queue, self._stop),
            name="paxlite-prefetch",
            daemon=True,
        )
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    def next(self) -> Any:
        """The next global batch (blocks until the thread has made it)."""
        batch, state, error = self._queue.get()
        if error is not None:
            self._queue.put((None, None, error))  # Every later call raises it too.
            raise error
        self._reader.taken()
        self._state = state
        return batch

    def input_state(self) -> dict[str, Any]:
        """The input's position after the last batch :meth:`next` returned."""
        return self._state

    def save_position(self, save: Callable[[BaseInput, list[Pending]], None]) -> None:
        """Calls ``save(input, pending)`` with the reader paused: the input's own position
        is then just after ``pending``, the host batches read but not yet returned by
        :meth:`next` (oldest first)."""
        with self._reader.lock:
            save(self._reader.inp, list(self._reader.pending))

    def close(self) -> None:
        """Stops the thread (queued batches are dropped)."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
