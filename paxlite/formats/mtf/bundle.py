"""A TensorFlow checkpoint (a "tensor bundle"): found, opened with TensorFlow's own reader,
and read one whole tensor at a time.

A checkpoint is a prefix, ``<dir>/model.ckpt-<step>``: ``<prefix>.index`` (every tensor's
name, dtype, shape and where its bytes are) beside ``<prefix>.data-<i>-of-<n>`` shards; the
directory's ``checkpoint`` state file names the newest (``model_checkpoint_path``). A path
given is the prefix itself (as T5X's ``INITIAL_CHECKPOINT_PATH`` takes it: its ``.index``
beside it) or the directory (its newest step, or the one asked for).

TensorFlow is imported only here, when such a checkpoint is opened (seqio installs it). Its
reader cannot read part of a tensor: :meth:`Bundle.tensor` gives the whole tensor, which the
caller slices and lets go. TensorFlow's filesystems know nothing of paxlite's storage layer
(an emulator, its credentials), so a ``gs://`` checkpoint's index and shards are first copied
through that layer into a local temporary directory (``$TMPDIR``; removed on
:meth:`Bundle.close`): that needs the checkpoint's size on local disk (on disk, not a tmpfs in
memory), and every host of a multi-host job copies and reads every tensor.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import numpy as np
from etils import epath

from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError, Variable
from paxlite.runtime import storage

INDEX = ".index"
STATE_FILE = "checkpoint"
_DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})")
_STEP = re.compile(r"-(\d+)$")
_COPY_BYTES = 64 << 20  # A gs:// shard is copied in pieces of this size.


def is_prefix(path: epath.Path) -> bool:
    """Whether ``path`` is a checkpoint prefix (``<path>.index`` exists)."""
    return epath.Path(f"{path}{INDEX}").is_file()


def prefixes(directory: epath.Path) -> dict[int, epath.Path]:
    """``{step: prefix}`` of the checkpoints in ``directory`` (``<name>-<step>.index``)."""
    if not directory.is_dir():
        return {}
    found = {}
    for file in directory.iterdir():
        if file.name.endswith(INDEX):
            stem = file.name[: -len(INDEX)]
            step = _STEP.search(stem)
            if step:
                found[int(step.group(1))] = directory / stem
    return found


def newest(directory: epath.Path, steps: dict[int, epath.Path]) -> int:
    """The step the ``checkpoint`` state file names (``model_checkpoint_path``), else the
    largest of ``steps``."""
    state = directory / STATE_FILE
    if state.is_file():
        found = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', state.read_text(), re.M)
        step = _STEP.search(found.group(1)) if found else None
        if step and int(step.group(1)) in steps:
            return int(step.group(1))
    return max(steps)


def step_of(prefix: epath.Path) -> int:
    """The step in a prefix's name (``model.ckpt-1000`` -> 1000; 0 without one)."""
    found = _STEP.search(prefix.name)
    return int(found.group(1)) if found else 0


def data_shards(prefix: epath.Path) -> list[epath.Path]:
    """The prefix's ``.data-<i>-of-<n>`` shards, all ``n`` of them.

    Raises:
      CheckpointSourceError: no shard beside the index, or some of the ``n`` missing.
    """
    found = {}
    for file in prefix.parent.iterdir():
        rest = file.name[len(prefix.name) :] if file.name.startswith(prefix.name) else ""
        match = _DATA.fullmatch(rest)
        if match:
            found[int(match.group(1))] = (int(match.group(2)), file)
    if not found:
        raise CheckpointSourceError(
            f"{prefix}{INDEX} has no data beside it ({prefix.name}.data-00000-of-<n>): copy "
            "the checkpoint's .data-* shards with its index."
        )
    count = next(iter(found.values()))[0]
    missing = [f"{prefix.name}.data-{i:05d}-of-{count:05d}" for i in range(count) if i not in found]
    if missing:
        raise CheckpointSourceError(
            f"{prefix} is missing {len(missing)} of its {count} data shards "
            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}): copy them with "
            "its index."
        )
    return [found[i][1] for i in range(count)]


class Bundle:
    """A TensorFlow checkpoint opened for reading.

    Attributes:
      prefix: the checkpoint as given (local or ``gs://``); step: its step.
    """

    def __init__(self, prefix: epath.Path):
        self.prefix, self.step = prefix, step_of(prefix)
        self._shards = data_shards(prefix)
        self._staged: str | None = None
        local = prefix
        if storage.is_remote(prefix):  # The index now, the shards at the first tensor read.
            self._staged = tempfile.mkdtemp(prefix="paxlite-mtf-")
            local = epath.Path(self._staged) / prefix.name
            index = epath.Path(f"{prefix}{INDEX}")
            try:
                _copy(index, epath.Path(self._staged) / index.name)
            except CheckpointSourceError:
                self.close()
                raise
        from tensorflow.python.training import py_checkpoint_reader  # TensorFlow: only here.

        try:
            self._reader = py_checkpoint_reader.NewCheckpointReader(os.fspath(local))
        except Exception as e:  # noqa: BLE001 (TensorFlow's errors have many classes)
            self.close()
            raise CheckpointSourceError(
                f"{prefix}{INDEX} is not a TensorFlow checkpoint index ({_reason(e)})."
            ) from None
        shapes = self._reader.get_variable_to_shape_map()
        dtypes = self._reader.get_variable_to_dtype_map()
        self.variables = {
            name: Variable(tuple(shape), np.dtype(dtypes[name].as_numpy_dtype))
            for name, shape in shapes.items()
        }

    def tensor(self, name: str) -> np.ndarray:
        """The whole of tensor ``name``.

        Raises:
          CheckpointSourceError: its bytes cannot be read (a truncated or damaged shard).
        """
        if self._staged is not None and self._shards:
            for file in self._shards:  # A failed copy is removed with the rest on close().
                _copy(file, epath.Path(self._staged) / file.name)
            self._shards = []
        try:
            return np.asarray(self._reader.get_tensor(name))
        except Exception as e:  # noqa: BLE001 (TensorFlow's errors, IndexError when short)
            raise CheckpointSourceError(
                f"{self.prefix}: tensor {name} cannot be read from its data shards "
                f"({_reason(e)}); the checkpoint is truncated or damaged: copy it again."
            ) from None

    def close(self) -> None:
        """Removes the local copy of a ``gs://`` checkpoint."""
        if self._staged is not None:
            shutil.rmtree(self._staged, ignore_errors=True)
            self._staged = None


def _copy(source: epath.Path, target: epath.Path) -> None:
    """``source`` (through paxlite's storage layer) to local ``target``, piece by piece."""
    try:
        with source.open("rb") as reader, open(target, "wb") as writer:
            while piece := reader.read(_COPY_BYTES):
                writer.write(piece)
    except Exception as e:  # noqa: BLE001 (gcsfs and the OS raise many kinds)
        raise CheckpointSourceError(
            f"{source} cannot be copied to local disk for TensorFlow's reader "
            f"({storage.one_line(e)})."
        ) from None


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
