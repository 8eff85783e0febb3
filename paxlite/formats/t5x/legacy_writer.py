"""A T5X checkpoint step written in T5X's legacy format, one array at a time.

What T5X's ``Checkpointer`` writes (and ``t5x/scripts/convert_tf_checkpoint.py`` leaves):
``checkpoint_<step>/checkpoint``, a flax msgpack of ``{'version': 3, 'optimizer': {'target':
params, 'state': {'step': ..., 'param_states': ...}}}`` in which each array written to
tensorstore is its spec (zarr, gzip, chunks of at most 64 MiB as T5X chooses them: each
dim a divisor of the array's; the kvstore ``path`` is the leaf's tree path joined by ``.``,
relative to the step directory) and a small one (``(1,)``
placeholders, the step) is inline. :mod:`paxlite.formats.t5x.checkpoint` reads it back, and
so does T5X. Each array is written as it is given and not kept.
"""

from __future__ import annotations

import math

import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization, traverse_util

from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.runtime import storage

_VERSION = 3
_CHUNK_BYTES = 16 * 2**20  # T5X writes up to 64 MiB; smaller bounds the memory a write holds.


def chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
    """A chunk of at most :data:`_CHUNK_BYTES` whose dims divide ``shape``'s: the largest
    dim is split by its smallest factor until the chunk fits (a write holds a chunk or a few,
    not the whole array, beyond the array itself)."""
    chunk = list(shape)
    while chunk and math.prod(chunk) * itemsize > _CHUNK_BYTES:
        largest = max(range(len(chunk)), key=lambda i: chunk[i])
        size = chunk[largest]
        chunk[largest] //= next(f for f in range(2, size + 1) if size % f == 0)
    return chunk


class LegacyStepWriter:
    """Writes ``<model_dir>/checkpoint_<step>/`` array by array; :meth:`finish` writes the
    msgpack that makes the step complete (a step without it is not read)."""

    def __init__(self, model_dir: epath.Path, step: int):
        self.step = step
        self.step_dir = model_dir / f"checkpoint_{step}"
        self.step_dir.mkdir(parents=True, exist_ok=True)
        self._leaves: dict[str, object] = {}

    def write(self, name: str, value: np.ndarray) -> None:
        """Writes ``value`` as leaf ``name`` (``target/<param path>`` or
        ``state/param_states/<param path>/<slot>``, '/' between keys) to tensorstore."""
        relative = name.replace("/", ".")
        spec = {
            "driver": "zarr",
            "dtype": np.dtype(value.dtype).name,
            "kvstore": {"driver": "file", "path": relative},
            "metadata": {
                "shape": list(value.shape),
                "chunks": chunk_shape(value.shape, value.dtype.itemsize),
                "compressor": {"id": "gzip"},
            },
        }
        written = dict(spec, kvstore=storage.kvstore(self.step_dir / relative) + "/")
        store = ts.open(written, create=True, open=True).result()
        chunk = spec["metadata"]["chunks"]
        grid = [size // c for size, c in zip(value.shape, chunk, strict=True)]
        for position in np.ndindex(*grid):  # A chunk at a time: one in flight, not the array.
            index = tuple(slice(p * c, (p + 1) * c) for p, c in zip(position, chunk, strict=True))
            store[index].write(value[index]).result()
        self._leaves[name] = spec

    def inline(self, name: str, value: np.ndarray) -> None:
        """Keeps small ``value`` as leaf ``name`` inside the msgpack."""
        self._leaves[name] = np.asarray(value)

    def finish(self) -> None:
        """Writes ``checkpoint`` (the msgpack naming every leaf): the step is complete."""
        tree = traverse_util.unflatten_dict(self._leaves, sep="/")
        state = tree.get("state", {})
        state["step"] = np.int32(self.step)
        contents = {
            "version": _VERSION,
            "optimizer": {"target": tree.get("target", {}), "state": state},
        }
        file = self.step_dir / t5x_checkpoint.CHECKPOINT_FILE
        file.write_bytes(serialization.msgpack_serialize(contents))
