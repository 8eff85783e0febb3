"""T5X's checkpoints, legacy (flan-t5's, T5 1.1's public ones) and orbax (what T5X writes
by default now), read onto a run's shardings.

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
kernel``), named for a run by ``paxlite.formats.t5x.layout``; each device's slice is read by
itself (an inline leaf: sliced from the msgpack's array). :meth:`T5xSource.state_variables`
lists the optimizer's leaves (``state/step``, ``state/param_states/...``);
:meth:`T5xSource.read_train_state` reads the step and Adafactor's second moments into the
run's optimizer state (the loading rules' ``load_step``, ``load_opt_states``,
``partial_load_opt_states``).

T5X's orbax manager (``OrbaxCheckpointManagerInterface``: an ``ocp.CheckpointManager`` with
step prefix ``checkpoint``) saves a step as ``checkpoint_<step>/`` holding orbax's
``_CHECKPOINT_METADATA`` and the item ``state/``: a ``PyTreeCheckpointHandler(use_ocdbt=True)``
save of the train state's ``state_dict()`` itself (``{'target': params, 'state': {'step',
'param_states'}}``, no ``version``/``optimizer`` wrapper), with ``_METADATA`` (the tree's keys;
``use_ocdbt``, ``use_zarr3``) and an OCDBT database (``manifest.ocdbt``, ``d/``,
``ocdbt.process_<i>/``) holding one zarr array per leaf under the key ``target.<path joined by
'.'>``. T5X tells the two apart by ``_METADATA`` (``checkpoint_utils.detect_checkpoint_type``),
and so does :func:`_layout`; :class:`T5xOrbaxSource` reads those arrays through tensorstore's
``ocdbt`` kvstore, each device's slice by itself, under the same names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import jax
import ml_dtypes
import numpy as np
import tensorstore as ts
from etils import epath
from flax import serialization, traverse_util

from paxlite.checkpoints import checkpoint_sources, train_checkpoints
from paxlite.checkpoints.checkpoint_sources import PARAMS, CheckpointSourceError, Variable
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.layout_source import LayoutSource
from paxlite.formats.t5x import gin as t5x_gin
from paxlite.formats.t5x import layout as t5x_layout
from paxlite.runtime import storage
from praxis_lite.optim.factored_adafactor import FactoredMoment, FullMoment

CHECKPOINT_FILE = "checkpoint"
STATE = "state/"
_STEP_DIR = re.compile(r"checkpoint_(\d+)")
_VERSIONS = (2, 3)
ORBAX_ITEM = "state"
ORBAX_METADATA = "_METADATA"
_EMPTY_VALUES = ("None", "Dict", "List", "Tuple", "NamedTuple")  # Orbax's empty nodes.
SLOTS = STATE + "param_states/"
# T5X's 2-D parameters whose 'embed' dim (the one our v_row keeps) is the last.
_EMBED_LAST = ("/out/kernel", "/wo/kernel", "token_embedder/embedding")


class T5xSource(LayoutSource):
    """A T5X legacy checkpoint step opened for reading.

    Attributes:
      version: the msgpack's ``version``; gated: whether its MLPs are gated (``wi_0``).
    """

    kind = "t5x checkpoint"
    #: The 2-D parameters whose 'embed' dim (the one our v_row keeps) is the last.
    embed_last: ClassVar[tuple[str, ...]] = _EMBED_LAST

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
        named = hf_layout.their_names(self._table(), list(run_params))
        return [
            (path, where, [PARAMS + n for n in where.layer_names(run_params[path].shape[0])])
            for path, where in named.items()
        ]

    def _table(self) -> hf_layout.Table:
        """The names and layouts of this checkpoint's parameters."""
        return t5x_layout.t5x_table(self.gated)

    def close(self) -> None:
        self._stores.clear()

    def read_train_state(self, abstract: Any, *, opt_state: bool) -> dict[str, Any]:
        """T5X's step (``state/step``, which T5X restores) and, with ``opt_state``, its
        Adafactor's second moments in the run's optimizer state (``abstract.opt_state``,
        ``praxis_lite.optim.factored_adafactor``'s): each moment of a parameter T5X names
        (:mod:`t5x_layout`) from that parameter's ``v_row``/``v_col`` (factored: reshaped,
        e.g. ``v_col [N*H]`` -> ``[N, H]``; a scanned stack's layers stacked on ``[L]``) or
        ``v``; factored on one side only, the moment is converted (ours whole from T5X's
        factors: ``v_row * v_col / mean(v_row)``, T5X's estimate; ours factored from T5X's
        whole ``v``: its means). Every integer count of the run's state is the step.

        Raises:
          CheckpointSourceError: a slot of the run's state T5X has nothing for (named).
        """
        step = int(self.read_whole(STATE + "step"))
        out: dict[str, Any] = {"step": step}
        if opt_state:
            out["opt_state"] = self._opt_state(abstract, step)
        return out

    def opt_state_names(
        self, assigned: Mapping[str, str], run_params: Mapping[str, Any]
    ) -> dict[str, str]:
        """:meth:`read_train_state` puts T5X's slots under the run's own paths."""
        return {path: path for path in self.loaded_leaves(assigned, run_params)}

    def _opt_state(self, abstract: Any, step: int) -> Any:
        run_params = traverse_util.flatten_dict(abstract.params, sep="/")
        parts = {
            path: (where, [n[len(PARAMS) :] for n in names])
            for path, where, names in self._leaf_parts(run_params)
        }

        def one(path: Any, leaf: Any) -> Any:
            name = train_checkpoints.path_name(path)
            if isinstance(leaf, FactoredMoment | FullMoment):
                param = next((p for p in parts if name == p or name.endswith("/" + p)), None)
                if param is None:
                    raise CheckpointSourceError(
                        f"{self.path}: T5X has no parameter for the run's optimizer slot {name}."
                    )
                where, names = parts[param]
                return self._moment(leaf, where, names, tuple(run_params[param].shape))
            if leaf.shape == () and np.dtype(leaf.dtype).kind in "iu":
                return checkpoint_sources.sharded_array(
                    leaf, lambda index: np.asarray(step, leaf.dtype)
                )
            raise CheckpointSourceError(
                f"{self.path}: T5X's Adafactor state has nothing for the run's optimizer slot "
                f"{name} {tuple(leaf.shape)}."
            )

        moments = (FactoredMoment, FullMoment)
        return jax.tree_util.tree_map_with_path(
            one, abstract.opt_state, is_leaf=lambda x: isinstance(x, moments)
        )

    def _moment(
        self, leaf: Any, where: Any, names: list[str], shape: tuple[int, ...]
    ) -> FactoredMoment | FullMoment:
        """Our moment ``leaf`` (ShapeDtypeStructs) of a parameter of ``shape`` from the T5X
        slots of its parameter (``names``: one per layer of a scanned stack)."""
        layer_shape = shape[1:] if where.stacked else shape
        skip = 1 if where.stacked else 0
        layers = [self._slots(n) for n in names]
        if isinstance(leaf, FullMoment):
            v = [
                self._whole_v(n, slots, where, layer_shape)
                for n, slots in zip(names, layers, strict=True)
            ]
            return leaf.replace(v=_on(leaf.v, v, where.stacked))
        rows = tuple(d - skip for d in leaf.layout.row_dims)
        cols = tuple(d - skip for d in leaf.layout.col_dims)
        v_rows, v_cols = [], []
        for name, slots in zip(names, layers, strict=True):
            if "v_row" in slots and "v_col" in slots:
                v_row, v_col = self._factors(name, slots)
                row_shape = tuple(s for d, s in enumerate(layer_shape) if d not in cols)
                col_shape = tuple(s for d, s in enumerate(layer_shape) if d not in rows)
                if v_row.size != np.prod(row_shape) or v_col.size != np.prod(col_shape):
                    raise CheckpointSourceError(
                        f"{self.path}: T5X's {SLOTS}{name}/v_row {v_row.shape} and v_col "
                        f"{v_col.shape} do not factor the run's {row_shape} x {col_shape}."
                    )
                v_rows.append(v_row.reshape(row_shape))
                v_cols.append(v_col.reshape(col_shape))
            else:
                v = self._whole_v(name, slots, where, layer_shape)
                v_rows.append(v.mean(axis=cols))
                v_cols.append(v.mean(axis=rows))
        return leaf.replace(
            v_row=_on(leaf.v_row, v_rows, where.stacked),
            v_col=_on(leaf.v_col, v_cols, where.stacked),
        )

    def _slots(self, name: str) -> dict[str, np.ndarray]:
        """The used slots (not T5X's ``(1,)`` placeholders) of T5X parameter ``name``."""
        out = {}
        for slot in ("v_row", "v_col", "v"):
            key = f"{SLOTS}{name}/{slot}"
            if key in self._leaves and self._variable(key).shape != (1,):
                out[slot] = np.asarray(self.read_whole(key), np.float32)
        return out

    def _factors(self, name: str, slots: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The factors of 2-D T5X parameter ``name`` over its 'embed' dim and over its other
        dim (ours: ``v_row`` and ``v_col``), whichever of T5X's slots holds each: T5X's
        Adafactor factors a 2-D parameter by its sizes alone (:func:`t5x_row_axis`)."""
        shape = self._variable(PARAMS + name).shape
        embed = 1 if name.endswith(self.embed_last) else 0
        if len(shape) != 2:
            raise CheckpointSourceError(
                f"{self.path}: T5X's {SLOTS}{name} is factored but its parameter {shape} is "
                "not 2-D."
            )
        row = self.row_axis(shape)
        v_row, v_col = slots["v_row"], slots["v_col"]
        if v_row.shape != (shape[row],) or v_col.shape != (shape[1 - row],):
            raise CheckpointSourceError(
                f"{self.path}: T5X's {SLOTS}{name}/v_row {v_row.shape} and v_col {v_col.shape} "
                f"are not the factors of its parameter {shape} T5X's Adafactor keeps."
            )
        return (v_row, v_col) if row == embed else (v_col, v_row)

    @staticmethod
    def row_axis(shape: tuple[int, ...]) -> int:
        """The axis this checkpoint's ``v_row`` keeps of a 2-D parameter of ``shape``."""
        return t5x_row_axis(shape)

    def _whole_v(
        self, name: str, slots: dict[str, np.ndarray], where: Any, shape: tuple[int, ...]
    ) -> np.ndarray:
        """T5X parameter ``name``'s whole second moment, in our layout of ``shape`` (from
        factors: T5X's estimate ``v_row * v_col / mean(v_row)``)."""
        if "v" in slots:
            v = slots["v"]
        elif "v_row" in slots and "v_col" in slots:
            over_embed, over_other = self._factors(name, slots)
            embed = 1 if name.endswith(self.embed_last) else 0
            v = np.expand_dims(over_embed, 1 - embed) * np.expand_dims(over_other, embed)
            v = v / slots["v_row"].mean()
        else:
            raise CheckpointSourceError(
                f"{self.path}: T5X's {SLOTS}{name} holds no second moment (v or v_row and v_col)."
            )
        full = tuple(slice(0, n) for n in shape)
        return hf_layout.read_slice(where, shape, full, lambda index: v[index])

    def _variable(self, name: str) -> Variable:
        leaf = self._leaves[name]
        if not isinstance(leaf, dict):
            return Variable(tuple(leaf.shape), leaf.dtype)
        return Variable(tuple(leaf["metadata"]["shape"]), self._dtype(leaf))

    def _dtype(self, spec: dict[str, Any]) -> np.dtype:
        name = spec.get("dtype") or spec["metadata"].get("dtype")
        dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
        if dtype == np.uint16 and self.version is not None and self.version < 3:
            return np.dtype(ml_dtypes.bfloat16)  # Version 2: bfloat16's bits as uint16.
        return dtype

    def _reader(self, name: str, observed: str) -> hf_layout.SliceReader:
        """Slices of variable ``name`` (reported to the observer as ``observed``)."""
        leaf = self._leaves[name]
        dtype = self._variable(name).dtype
        store = self._store(name) if self.in_tensorstore(name) else None

        def read(index: tuple[slice, ...]) -> np.ndarray:
            if store is None:
                values = np.asarray(leaf)[index]
            else:
                try:
                    values = store[index].read().result()
                except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
                    raise CheckpointSourceError(
                        f"{self._where(name)}: T5X array {name} cannot be read "
                        f"({storage.one_line(e)})."
                    ) from None
                values = values.view(dtype) if values.dtype != dtype else values
            if self._observer is not None:
                self._observer(observed, values.size * dtype.itemsize)
            return values

        return read

    def _where(self, name: str) -> str:
        """Where variable ``name``'s array is stored, for messages."""
        return str(self._array_dir(self._leaves[name]))

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
            self._stores[name] = self._open(name, spec)
        return self._stores[name]

    def _open(self, name: str, spec: dict[str, Any], **options: Any) -> Any:
        """The tensorstore array of variable ``name`` at ``spec``; CheckpointSourceError
        naming where it is stored when it cannot be opened."""
        try:
            return ts.open(spec, open=True, read=True, **options).result()
        except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
            raise CheckpointSourceError(
                f"{self._where(name)}: T5X array {name} cannot be opened ({storage.one_line(e)})."
            ) from None


class T5xOrbaxSource(T5xSource):
    """A step T5X's orbax manager saved (T5X's default now): ``checkpoint_<step>/state/``, a
    ``PyTreeCheckpointHandler`` item of the train state's ``state_dict()`` (``target``: the
    parameters; ``state``: ``step`` and, from training, ``param_states``). Each leaf is a zarr
    array under the key ``<tree path joined by '.'>``, in the item's OCDBT database when
    ``_METADATA`` says ``use_ocdbt`` (T5X always), else in its own directory."""

    def __init__(self, step_dir: epath.Path, observer: checkpoint_sources.ReadObserver | None):
        self.path, self._observer = step_dir, observer
        self.step = int(_STEP_DIR.fullmatch(step_dir.name).group(1))
        self.version = None  # Orbax's: no msgpack version.
        self._item = step_dir / ORBAX_ITEM
        metadata = _read_orbax_metadata(self._item / ORBAX_METADATA)
        self._ocdbt, self._zarr3 = metadata.get("use_ocdbt", False), metadata.get("use_zarr3")
        self._leaves = {}
        for entry in metadata["tree_metadata"].values():
            keys = [str(k["key"]) for k in entry["key_metadata"]]
            value = entry.get("value_metadata") or {}
            prefix = {"target": PARAMS, "state": STATE}.get(keys[0])
            if prefix is None or value.get("value_type") in _EMPTY_VALUES or len(keys) < 2:
                continue  # flax_mutables; an empty node.
            self._leaves[prefix + "/".join(keys[1:])] = ".".join(keys)
        self.gated = any(n.endswith("/mlp/wi_0/kernel") for n in self._leaves)
        self._stores = {}
        self._context = ts.Context()  # The OCDBT database opened once for every array.

    def in_tensorstore(self, name: str) -> bool:
        return True  # Orbax writes every array leaf to tensorstore.

    def _variable(self, name: str) -> Variable:
        store = self._store(name)
        return Variable(tuple(store.shape), np.dtype(store.dtype.numpy_dtype))

    def _where(self, name: str) -> str:
        key = self._leaves[name]
        return f"{self._item} (OCDBT key {key})" if self._ocdbt else str(self._item / key)

    def _store(self, name: str) -> Any:
        if name not in self._stores:
            key = self._leaves[name]
            if self._ocdbt:
                base = storage.kvstore(self._item) + "/"
                kvstore: Any = {"driver": "ocdbt", "base": base, "path": key + "/"}
            else:
                kvstore = storage.kvstore(self._item / key) + "/"
            spec = {"driver": "zarr3" if self._zarr3 else "zarr", "kvstore": kvstore}
            self._stores[name] = self._open(name, spec, context=self._context)
        return self._stores[name]


def _on(target: Any, layers: list[np.ndarray], stacked: bool) -> jax.Array:
    """``layers`` (stacked on ``[L]`` when ``stacked``) on ``target``'s sharding and dtype."""
    value = (np.stack(layers) if stacked else layers[0]).astype(target.dtype)
    return checkpoint_sources.sharded_array(target, lambda index: value[index])


def _read_orbax_metadata(file: epath.Path) -> dict[str, Any]:
    """The orbax item's ``_METADATA`` (its tree's keys and how it is stored), checked."""
    try:
        metadata = json.loads(file.read_text())
        if not isinstance(metadata.get("tree_metadata"), dict):
            raise ValueError("no tree_metadata")  # noqa: TRY301
    except Exception as e:  # noqa: BLE001 (JSON, storage and shape errors alike)
        raise CheckpointSourceError(
            f"{file} is not an orbax checkpoint's metadata ({storage.one_line(e)})."
        ) from None
    return metadata


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


def _layout(path: epath.Path) -> type[T5xSource] | None:
    """Which T5X format step dir ``path`` holds (None: not a T5X step): orbax's when its
    ``state/`` item has orbax's ``_METADATA`` (T5X's own test), else legacy by its msgpack."""
    if not _STEP_DIR.fullmatch(path.name):
        return None
    if (path / ORBAX_ITEM / ORBAX_METADATA).is_file():
        return T5xOrbaxSource
    return T5xSource if (path / CHECKPOINT_FILE).is_file() else None


def t5x_row_axis(shape: tuple[int, ...]) -> int:
    """The axis T5X's ``v_row`` keeps of a 2-D parameter it factors: its Adafactor factors
    2-D parameters by size, whatever the logical factor rules (``_factored_dims``: ``v_row``
    averages the largest dim away, ``v_col`` the second largest; of two equal dims, the
    second is the largest)."""
    return 0 if shape[0] <= shape[1] else 1


def steps(model_dir: epath.Path) -> list[int]:
    """The steps of ``model_dir``'s complete T5X checkpoints (``checkpoint_<step>/``), sorted."""
    found = ((_STEP_DIR.fullmatch(p.name), p) for p in model_dir.iterdir())
    return sorted(int(m.group(1)) for m, p in found if m and _layout(p))


def _is_step(path: epath.Path) -> bool:
    return _layout(path) is not None


def _open(path: epath.Path, step: int | None, layout: Any, observer: Any) -> T5xSource:
    if _is_step(path):
        if step is not None and step != int(_STEP_DIR.fullmatch(path.name).group(1)):
            raise CheckpointSourceError(f"{path} is a T5X step other than {step}.")
        return _layout(path)(path, observer)
    chosen = checkpoint_sources.pick_step(path, steps(path), step)
    step_dir = path / f"checkpoint_{chosen}"
    return _layout(step_dir)(step_dir, observer)


checkpoint_sources.register(
    checkpoint_sources.Kind(
        T5xSource.kind,
        f"checkpoint_<step>/{CHECKPOINT_FILE} or checkpoint_<step>/{ORBAX_ITEM}/{ORBAX_METADATA}"
        " (a T5X model dir or one of its steps, legacy or orbax)",
        lambda p: _is_step(p) or (p.is_dir() and bool(steps(p))),
        _open,
        t5x_gin.described,  # The model dir's config.gin says which T5 it is.
    )
)
