"""Each host's exact training-input position, saved beside each checkpoint.

A checkpoint's JSON input state (``BaseInput.get_state``) is a count of batches; a file
reader resumed from it re-reads the whole stream up to there. Here each host also saves
its reader's own position (``BaseInput.save_position``: a tf.data iterator's state), so
resuming costs the same at step 100 and at step 100,000::

    <job_log_dir>/checkpoints/input_positions/<step>/host_<i>_of_<n>/
        iterator.index, iterator.data-*   the reader's state (TensorFlow checkpoint files)
        position.json                     the input's get_state() at that moment
        pending.npz, pending.json         host batches the prefetcher had read ahead of the
                                          step, with their states: replayed first

Files are written locally, then copied with epath (a ``gs://`` job dir works alike).
A step's positions are written before its orbax save starts and pruned with it. A
checkpoint without this host's position (older paxlite, another host count, an input
that needs none) resumes through ``set_state``.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import Any

import jax
import numpy as np
from etils import epath

from paxlite.train.prefetch import Pending
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap

DIRNAME = "input_positions"
_POSITION = "position.json"
_PENDING_ARRAYS = "pending.npz"
_PENDING_STATES = "pending.json"


def host_dir(checkpoint_dir: epath.Path, step: int) -> epath.Path:
    """Where this process saves its input position for ``step``."""
    return checkpoint_dir / DIRNAME / str(step) / _host_name()


def _host_name() -> str:
    return f"host_{jax.process_index()}_of_{jax.process_count()}"


def save(checkpoint_dir: epath.Path, step: int, inp: BaseInput, pending: list[Pending]) -> bool:
    """Saves ``inp``'s position (just after ``pending``) for ``step``; False when the input
    needs none (its ``get_state`` alone resumes in constant time)."""
    with tempfile.TemporaryDirectory(prefix="paxlite-input-") as local:
        if not inp.save_position(local):
            return False
        pathlib.Path(local, _POSITION).write_text(json.dumps(inp.get_state()))
        _write_pending(pathlib.Path(local), pending)
        target = host_dir(checkpoint_dir, step)
        if target.exists():
            target.rmtree()
        target.mkdir(parents=True, exist_ok=True)
        for file in sorted(pathlib.Path(local).iterdir()):
            (target / file.name).write_bytes(file.read_bytes())
    return True


def restore(checkpoint_dir: epath.Path, step: int, inp: BaseInput) -> list[Pending] | None:
    """Puts ``inp`` back where it was saved at ``step``; returns the batches to replay
    before reading it. None: nothing was saved for this host at ``step``."""
    source = host_dir(checkpoint_dir, step)
    if not (source / _POSITION).exists():
        return None
    with tempfile.TemporaryDirectory(prefix="paxlite-input-") as local:
        for file in source.iterdir():
            pathlib.Path(local, file.name).write_bytes(file.read_bytes())
        state = json.loads(pathlib.Path(local, _POSITION).read_text())
        inp.restore_position(local, state)
        return _read_pending(pathlib.Path(local))


def prune(checkpoint_dir: epath.Path, keep_steps: set[int]) -> None:
    """Removes this host's positions of steps older than every kept one (their
    checkpoints are gone); newer ones may belong to saves still being written."""
    root = checkpoint_dir / DIRNAME
    if not keep_steps or not root.exists():
        return
    oldest_kept = min(keep_steps)
    for step_dir in root.iterdir():
        if step_dir.name.isdigit() and int(step_dir.name) < oldest_kept:
            mine = step_dir / _host_name()
            if mine.exists():
                mine.rmtree()
            if jax.process_index() == 0:
                _remove_if_empty(step_dir)


def _remove_if_empty(directory: epath.Path) -> None:
    try:
        if not any(directory.iterdir()):
            directory.rmdir()
    except OSError:  # Another host still removing its own; the next prune gets it.
        pass


def _write_pending(local: pathlib.Path, pending: list[Pending]) -> None:
    arrays: dict[str, np.ndarray] = {}
    for index, (batch, _) in enumerate(pending):
        for key, value in batch.flatten_items():
            arrays[f"{index}/{key}"] = np.asarray(value)
    np.savez(local / _PENDING_ARRAYS, **arrays)
    (local / _PENDING_STATES).write_text(json.dumps([state for _, state in pending]))


def _read_pending(local: pathlib.Path) -> list[Pending]:
    states: list[dict[str, Any]] = json.loads((local / _PENDING_STATES).read_text())
    batches = [NestedMap() for _ in states]
    with np.load(local / _PENDING_ARRAYS) as arrays:
        for name in arrays.files:
            index, key = name.split("/", 1)
            _set_path(batches[int(index)], key, arrays[name])
    return list(zip(batches, states, strict=True))


def _set_path(batch: NestedMap, dotted: str, value: np.ndarray) -> None:
    """``batch['a']['b'] = value`` for ``dotted`` 'a.b' (NestedMap.flatten_items' keys)."""
    *parents, leaf = dotted.split(".")
    for name in parents:
        batch = batch.setdefault(name, NestedMap())
    batch[leaf] = value
