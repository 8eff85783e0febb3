"""Opt-in compile accounting for a test run (the suite's time budget, issue 54):

    PAXLITE_TEST_COMPILE_STATS=/some/dir python -m pytest -q -n 2 tests

Each pytest process (the workers, not the main.py runs they start) writes
``compile-<pid>.json`` there when its session ends (pytest-xdist's workers leave without
running ``atexit``): how many XLA compiles it asked for, how many the
persistent cache answered, and the seconds spent in XLA's backend compiles. The distinct
programs of the whole run, subprocesses included, are the entries of
``JAX_COMPILATION_CACHE_DIR`` (set it to keep them: the run removes the cache it makes).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable

#: The jax.monitoring events counted, by the name written.
_EVENTS = {
    "cache_hits": "/jax/compilation_cache/cache_hits",
    "cache_misses": "/jax/compilation_cache/cache_misses",
    "compile_requests_use_cache": "/jax/compilation_cache/compile_requests_use_cache",
}
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def record_into(directory: str) -> Callable[[], None]:
    """Counts this process's compiles from now on; returns what writes them into ``directory``."""
    import jax.monitoring

    counts = dict.fromkeys([*_EVENTS, "backend_compiles"], 0)
    seconds = {"backend_compile_s": 0.0}
    by_event = {event: name for name, event in _EVENTS.items()}

    def on_event(event: str, **_: object) -> None:
        if event in by_event:
            counts[by_event[event]] += 1

    def on_duration(event: str, duration: float, **_: object) -> None:
        if event == _BACKEND_COMPILE:
            counts["backend_compiles"] += 1
            seconds["backend_compile_s"] += duration

    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)

    def write() -> None:
        path = pathlib.Path(directory) / f"compile-{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(counts | seconds) + "\n")

    return write
