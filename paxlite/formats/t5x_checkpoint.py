"""T5X's legacy checkpoints (flan-t5's, T5 1.1's public ones) read onto a run's shardings.

A step, ``<model_dir>/checkpoint_<step>/``, holds ``checkpoint``: a flax msgpack of
``{'version': 3, 'optimizer': {'target': params, 'state': {'step': ..., 'param_states':
...}}}`` (T5X's ``t5x/checkpoints.py``). A leaf with logical axes (every parameter; Adafactor's
whole ``v`` and momentum ``m``) is a tensorstore spec dict there (``zarr``, gzip, a kvstore
whose ``path`` is the leaf's tree path joined by ``.``, relative to the step directory; written
from a ``gs://`` model dir, the kvstore is ``gcs`` on the placeholder bucket
``t5x-dummy-bucket``); any other leaf (``step``, the factored ``v_row``/``v_col``) is the array
itself, inline. Version 2 differs only in storing bfloat16 arrays in tensorstore as ``uint16``
(read back here as bfloat16; T5X itself now refuses them); earlier versions held no optimizer.

Variables are ``params/`` + T5X's parameter path (``params/encoder/layers_0/attention/query/
kernel``), named for a run by ``paxlite.formats.t5x_layout``; each device's slice is read by
itself (an inline leaf: sliced from the msgpack's array). :meth:`T5xSource.state_variables`
lists the optimizer's leaves (``state/step``, ``state/param_states/...``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization

from paxlite import checkpoint_sources, storage
from paxlite.checkpoint_sources import PARAMS, CheckpointSourceError, Variable
from paxlite.formats import hf_layout, t5x_layout

CHECKPOINT_FILE = "checkpoint"
STATE = "state/"
_STEP_DIR = re.compile(r"checkpoint_(\d+)")
_VERSIONS = (2, 3)


class T5xSource(checkpoint_sources.PartsSource):
    """A T5X legacy checkpoint step opened for reading.

    Attributes:
      version: the msgpack's ``version``; gated: whether its MLPs are gated (``wi_0``).
    """

    kind = "t5x checkpoint"

    def __init__(self, step_dir: epath.Path, observer: checkpoint_sources.ReadObserver | None):
        self.path, self._observer = step_dir, observer
        self.step = int(_STEP_DIR.fullmatch(step_dir.name).group(1))
        contents = _read_msgpack(step_dir / CHECKPOINT_FILE)
        self.version = contents["version"]
        optimizer = contents["optimizer"]
        self._leaves = {
            PARAMS + name: leaf for name, leaf in _flat(optimizer.get("target", {}), "")
        }
        self._leaves.update(
            {STATE + name: leaf for name, leaf in _flat(optimizer.get("state", {}), "")}
        )
        self.gated = any(n.endswith("/mlp/wi_0/kernel") for n in self._leaves)
        self._stores: dict[str, Any] = {}

    def variables(self) -> dict[str, Variable]:
        return {n: self._variable(n) for n in self._leaves if n.startswith(PARAMS)}

    def state_variables(self) -> dict[str, Variable]:
        """The optimizer's leaves: ``state/step`` and ``state/param_states/<param>/<slot>``
        (Adafactor's ``v_row``, ``v_col``, ``v``, ``m``; ``(1,)`` where unused)."""
        return {n: self._variable(n) for n in self._leaves if n.startswith(STATE)}

    def in_tensorstore(self, name: str) -> bool:
        """Whether variable ``name`` is a tensorstore array (else inline in the msgpack)."""
        return isinstance(self._leaves[name], dict)

    def read_whole(self, name: str) -> np.ndarray:
        """Variable ``name`` (a parameter or optimizer leaf) as one host array."""
        shape = self._variable(name).shape
        return self._reader(name, name)(tuple(slice(0, n) for n in shape))

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        out = {}
        for path, where, names in self._leaf_parts(run_params):
            shape = tuple(run_params[path].shape)[1 if where.stacked else 0 :]
            variable = Variable(
                hf_layout.their_shape(where, shape), np.dtype(run_params[path].dtype)
            )
            out.update(dict.fromkeys(names, variable))
        return out

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        loaded = self.loaded_leaves(assigned, run_params)
        for path, where, names in sorted(self._leaf_parts(run_params), key=lambda x: x[0]):
            if path in loaded:
                readers = [self._reader(assigned[n], path) for n in names]
                target = run_params[path]

                def read_ours(index, where=where, readers=readers, target=target):
                    values = hf_layout.read_stacked(
                        where, tuple(target.shape), index, lambda layer: readers[layer]
                    )
                    return values.astype(target.dtype)

                out[path] = checkpoint_sources.sharded_array(target, read_ours)
        return out

    def _leaf_parts(self, run_params: Mapping[str, Any]) -> list[tuple[str, Any, list[str]]]:
        named = hf_layout.their_names(t5x_layout.t5x_table(self.gated), list(run_params))
        return [
            (path, where, [PARAMS + n for n in where.layer_names(run_params[path].shape[0])])
            for path, where in named.items()
        ]

    def close(self) -> None:
        self._stores.clear()

    def _variable(self, name: str) -> Variable:
        leaf = self._leaves[name]
        if not isinstance(leaf, dict):
            return Variable(tuple(leaf.shape), leaf.dtype)
        return Variable(tuple(leaf["metadata"]["shape"]), self._dtype(leaf))

    def _dtype(self, spec: dict[str, Any]) -> np.dtype:
        name = spec.get("dtype") or spec["metadata"].get("dtype")
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if dtype == np.uint16 and self.version < 3:
            return np.dtype(ml_dtypes.bfloat16)  # Version 2: bfloat16's bits as uint16.
        return dtype

    def _reader(self, name: str, observed: str) -> hf_layout.SliceReader:
        """Slices of variable ``name`` (reported to the observer as ``observed``)."""
        leaf = self._leaves[name]
        dtype = self._variable(name).dtype
        store = self._store(name) if isinstance(leaf, dict) else None

        def read(index: tuple[slice, ...]) -> np.ndarray:
            if store is None:
                values = np.asarray(leaf)[index]
            else:
                try:
                    values = store[index].read().result()
                except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
                    raise CheckpointSourceError(
                        f"{self._array_dir(leaf)}: T5X array {name} cannot be read "
                        f"({storage.one_line(e)})."
                    ) from None
                values = values.view(dtype) if values.dtype != dtype else values
            if self._observer is not None:
                self._observer(observed, values.size * dtype.itemsize)
            return values

        return read

    def _array_dir(self, spec: dict[str, Any]) -> epath.Path:
        relative = spec["kvstore"].get("path", spec.get("path", ""))
        return self.path / relative.rstrip("/")

    def _store(self, name: str) -> Any:
        """The opened tensorstore array of variable ``name`` (opened once)."""
        if name not in self._stores:
            spec = dict(self._leaves[name])
            spec["metadata"] = {
                k: v for k, v in spec["metadata"].items() if k not in ("chunks", "compressor")
            }  # As T5X: read whatever chunks and compressor were written.
            spec.pop("path", None)  # tensorstore < 0.1.14 kept the path here.
            spec["kvstore"] = storage.kvstore(self._array_dir(self._leaves[name])) + "/"
            try:
                self._stores[name] = ts.open(spec, open=True, read=True).result()
            except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
                raise CheckpointSourceError(
                    f"{self._array_dir(self._leaves[name])}: T5X array {name} cannot be opened "
                    f"({storage.one_line(e)})."
                ) from None
        return self._stores[name]


def _flat(tree: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """``(path with '/', leaf)``: a tensorstore spec dict is a leaf, as T5X reads it."""
    if isinstance(tree, dict) and not {"driver", "kvstore"} <= tree.keys():
        for key, value in tree.items():
            yield from _flat(value, f"{prefix}{key}/")
    elif tree is not None and not (isinstance(tree, dict) and not tree):  # None: no slot.
        yield prefix.rstrip("/"), tree if isinstance(tree, dict) else np.asarray(tree)


def _read_msgpack(file: epath.Path) -> dict[str, Any]:
    """The checkpoint file's contents, checked to be T5X's."""
    try:
        contents = serialization.msgpack_restore(file.read_bytes())
    except Exception as e:  # noqa: BLE001 (msgpack raises many kinds)
        raise CheckpointSourceError(
            f"{file} is not a T5X checkpoint (not a flax msgpack: {storage.one_line(e)})."
        ) from None
    version = contents.get("version") if isinstance(contents, dict) else None
    if version not in _VERSIONS or not isinstance(contents.get("optimizer"), dict):
        raise CheckpointSourceError(
            f"{file} is not a T5X checkpoint paxlite reads: version {version!r} (read: "
            f"{', '.join(map(str, _VERSIONS))}, with an 'optimizer' entry)."
        )
    return contents


def _steps(model_dir: epath.Path) -> list[int]:
    return sorted(
        int(match.group(1))
        for p in model_dir.iterdir()
        if (match := _STEP_DIR.fullmatch(p.name)) and (p / CHECKPOINT_FILE).is_file()
    )


def _is_step(path: epath.Path) -> bool:
    return bool(_STEP_DIR.fullmatch(path.name)) and (path / CHECKPOINT_FILE).is_file()


def _open(path: epath.Path, step: int | None, layout: Any, observer: Any) -> T5xSource:
    if _is_step(path):
        if step is not None and step != int(_STEP_DIR.fullmatch(path.name).group(1)):
            raise CheckpointSourceError(f"{path} is a T5X step other than {step}.")
        return T5xSource(path, observer)
    chosen = checkpoint_sources.pick_step(path, _steps(path), step)
    return T5xSource(path / f"checkpoint_{chosen}", observer)


checkpoint_sources.register(
    checkpoint_sources.Kind(
        T5xSource.kind,
        f"checkpoint_<step>/{CHECKPOINT_FILE} (a T5X model dir or one of its steps)",
        lambda p: _is_step(p) or (p.is_dir() and bool(_steps(p))),
        _open,
    )
)
