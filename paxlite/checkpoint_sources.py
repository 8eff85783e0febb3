"""One registry of the checkpoints a run can read parameters from, keyed by what a path holds.

``--init_from``, ``--restore_checkpoint_dir`` and ``paxlite.inference.from_pretrained`` all
open a path here. Each kind is recognised by a file only it has (the first kind that
recognises a path wins; :func:`identify` names what it looked for when none does):

==================  ==========================================================================
kind                recognised by
==================  ==========================================================================
paxlite job         ``config.json`` beside ``checkpoints/`` (its newest step, or ``step=``)
paxlite step        ``_CHECKPOINT_METADATA`` (an orbax step: ``<job>/checkpoints/<step>``)
paxlite checkpoints ``<step>/_CHECKPOINT_METADATA`` steps (``<job>/checkpoints``)
paxml step          ``state/mdl_vars.params.*`` (``<job>/checkpoints/checkpoint_00001000``)
paxml checkpoints   ``checkpoint_<8 digits>/`` steps (Pax's ``--restore_checkpoint_dir``)
==================  ==========================================================================

A :class:`Source` names its variables as its framework does (``params/<path>``, ``/``
between keys, Pax's names for a paxml checkpoint) and reads any of them straight onto a
run's shardings: each device's slice is read by itself, never a whole array on one host.
Values are cast to the dtype asked for.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath
from flax import traverse_util

from paxlite import pax_layout, storage

#: Variable names start with their collection, as Pax's do (``params/lm/...``).
PARAMS = "params/"
_PAX_PARAMS = "mdl_vars.params."
_PAX_STEP = re.compile(r"checkpoint_(\d{8})")
_ORBAX_STEP_FILE = "_CHECKPOINT_METADATA"

#: Called with (paxlite leaf path, bytes asked for) for each slice a source reads.
ReadObserver = Callable[[str, int], None]


class CheckpointSourceError(ValueError):
    """A path that holds no checkpoint of a registered kind, or no such step."""


@dataclasses.dataclass(frozen=True)
class Variable:
    """A stored array's shape and dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype


class Source(abc.ABC):
    """A checkpoint step opened for reading.

    Attributes:
      kind: the registered kind's name; path: what was opened; step: the step read.
    """

    kind: str
    path: epath.Path
    step: int

    def describe(self) -> str:
        return f"{self.path} ({self.kind}, step {self.step})"

    @abc.abstractmethod
    def variables(self) -> dict[str, Variable]:
        """The stored parameters: ``{'params/<path>': Variable}`` in this source's names."""

    @abc.abstractmethod
    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        """A run's parameters (flat paxlite paths -> ShapeDtypeStruct) named as this source
        names its own, with the shapes they have there."""

    @abc.abstractmethod
    def unreadable(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> list[str]:
        """Problems with reading ``assigned`` (run name -> source name): leaves stored as
        several arrays of which only some are assigned."""

    @abc.abstractmethod
    def loaded_leaves(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> set[str]:
        """The run's leaves (paxlite paths) that reading ``assigned`` fills."""

    @abc.abstractmethod
    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        """``{paxlite path: jax.Array}``: each run leaf whose names are all in ``assigned``,
        read from the source names they map to onto the leaf's sharding and dtype
        (``run_params``: flat paths -> ShapeDtypeStruct with sharding)."""

    def close(self) -> None:
        """Lets go of what the source holds open."""

    def read_train_state(self, abstract: Any, *, opt_state: bool) -> dict[str, Any]:
        """``{'step': int, 'opt_state': tree}`` (the latter only if asked) from this step."""
        raise CheckpointSourceError(
            f"{self.describe()} holds no optimizer state paxlite can read; leave "
            "load_opt_states, partial_load_opt_states and load_step False for it."
        )


@dataclasses.dataclass(frozen=True)
class Kind:
    """A registered kind of checkpoint path.

    Attributes:
      name: e.g. 'paxml step'; marker: what recognises it (said when nothing does);
      recognises: path -> whether it is this kind; open: (path, step or None, layout,
        observer) -> Source (layout: the pipeline's ``(S, R)`` a Pax source was saved with).
    """

    name: str
    marker: str
    recognises: Callable[[epath.Path], bool]
    open: Callable[[epath.Path, int | None, tuple[int, int], ReadObserver | None], Source]


KINDS: list[Kind] = []


def register(kind: Kind) -> Kind:
    """Adds ``kind`` to the registry (after the kinds already there)."""
    KINDS.append(kind)
    return kind


def identify(path: epath.PathLike) -> Kind:
    """The first registered kind that recognises ``path``.

    Raises:
      CheckpointSourceError: none does (the message lists what each looks for).
    """
    path = storage.job_path(path)
    for kind in KINDS:
        if kind.recognises(path):
            return kind
    looked = "; ".join(f"a {k.name} ({k.marker})" for k in KINDS)
    raise CheckpointSourceError(
        f"{path} holds no checkpoint paxlite can read: looked for {looked}."
    )


def open_source(
    path: epath.PathLike,
    step: int | None = None,
    layout: tuple[int, int] = (1, 1),
    observer: ReadObserver | None = None,
) -> Source:
    """Opens ``path`` (its newest step, or ``step``) as the kind :func:`identify` finds."""
    path = storage.job_path(path)
    return identify(path).open(path, step, layout, observer)


# --- paxlite (orbax) ------------------------------------------------------------------------


class PaxliteSource(Source):
    """A step of a paxlite job: orbax's ``state`` item (``params``, ``opt_state``, ``step``)."""

    kind = "paxlite step"

    def __init__(self, checkpoints_dir: epath.Path, step: int):
        self.path, self.step = checkpoints_dir / str(step), step
        self._manager = ocp.CheckpointManager(
            checkpoints_dir, item_handlers={"state": ocp.PyTreeCheckpointHandler()}
        )
        metadata = self._manager.item_metadata(step)["state"]
        self._metadata = getattr(metadata, "tree", metadata)

    def variables(self) -> dict[str, Variable]:
        flat = traverse_util.flatten_dict(self._metadata["params"], sep="/")
        return {PARAMS + k: Variable(tuple(v.shape), np.dtype(v.dtype)) for k, v in flat.items()}

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        return {PARAMS + k: Variable(tuple(v.shape), np.dtype(v.dtype)) for k, v in run_params.items()}

    def unreadable(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> list[str]:
        return []

    def loaded_leaves(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> set[str]:
        return {name[len(PARAMS) :] for name in assigned}

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        wanted = {}  # source path -> the first run leaf read from it (its sharding and dtype)
        for run_name, source_name in assigned.items():
            wanted.setdefault(source_name[len(PARAMS) :], run_name[len(PARAMS) :])
        item = {k: run_params[leaf] for k, leaf in wanted.items()}
        restored = self._restore({"params": traverse_util.unflatten_dict(item, sep="/")})
        by_source = traverse_util.flatten_dict(restored["params"], sep="/")
        out = {}
        for run_name, source_name in assigned.items():
            leaf, value = run_name[len(PARAMS) :], by_source[source_name[len(PARAMS) :]]
            target = run_params[leaf]
            if value.sharding != target.sharding or value.dtype != target.dtype:
                value = jax.device_put(value.astype(target.dtype), target.sharding)
            out[leaf] = value
        return out

    def close(self) -> None:
        self._manager.close()

    def read_train_state(self, abstract: Any, *, opt_state: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"step": jax.ShapeDtypeStruct((), np.int32)}
        if opt_state:
            item["opt_state"] = abstract.opt_state
        restored = self._restore(item)
        restored["step"] = int(restored["step"])
        return restored

    def _restore(self, item: Any) -> Any:
        """The arrays ``item`` names (ShapeDtypeStructs), each device reading its own slice."""

        def restore_args(x: Any) -> Any:
            if getattr(x, "sharding", None) is None:
                return ocp.RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
            return ocp.ArrayRestoreArgs(sharding=x.sharding, global_shape=x.shape, dtype=x.dtype)

        args = ocp.args.PyTreeRestore(
            item=item,
            restore_args=jax.tree_util.tree_map(restore_args, item),
            partial_restore=True,
        )
        return self._manager.restore(self.step, args=ocp.args.Composite(state=args))["state"]


def _paxlite_steps(checkpoints_dir: epath.Path) -> list[int]:
    return sorted(
        int(p.name)
        for p in checkpoints_dir.iterdir()
        if p.name.isdigit() and (p / _ORBAX_STEP_FILE).exists()
    )


def _open_paxlite_job(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> Source:
    steps = _paxlite_steps(path / "checkpoints") if (path / "checkpoints").is_dir() else []
    if not steps:
        raise CheckpointSourceError(f"{path} is a paxlite job dir with no checkpoint; train first.")
    return PaxliteSource(path / "checkpoints", _pick_step(path, steps, step))


def _open_paxlite_step(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> Source:
    if step is not None and step != int(path.name):
        raise CheckpointSourceError(f"{path} is step {path.name}, not step {step}.")
    return PaxliteSource(path.parent, int(path.name))


def _pick_step(path: epath.Path, steps: list[int], step: int | None) -> int:
    if step is None:
        return max(steps)
    if step not in steps:
        raise CheckpointSourceError(
            f"{path} has no checkpoint at step {step}; its steps: {', '.join(map(str, steps))}."
        )
    return step


# --- paxml (tensorstore zarr arrays) ---------------------------------------------------------


class PaxSource(Source):
    """A paxml 1.4 step: one zarr array per variable, ``state/mdl_vars.params.<dotted path>``.

    Run names are Pax's (``pax_layout.to_pax`` under the source's pipeline ``layout``);
    each paxlite leaf is read through its ``pax_layout.Recipe``, a device slice at a time.
    """

    kind = "paxml step"

    def __init__(self, step_dir: epath.Path, layout: tuple[int, int], observer: Any):
        self.path, self.layout, self._observer = step_dir, layout, observer
        self.step = int(_PAX_STEP.fullmatch(step_dir.name).group(1)) if _PAX_STEP.fullmatch(
            step_dir.name
        ) else 0
        self._dirs = {
            PARAMS + d.name[len(_PAX_PARAMS) :].replace(".", "/"): d
            for d in sorted((step_dir / "state").glob(_PAX_PARAMS + "*"))
        }
        self._stores: dict[str, ts.TensorStore] = {}

    def variables(self) -> dict[str, Variable]:
        return {
            name: Variable(tuple(store.shape), np.dtype(store.dtype.numpy_dtype))
            for name, store in ((n, self._store(n)) for n in self._dirs)
        }

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        abstract = {k: jax.ShapeDtypeStruct(v.shape, np.float32) for k, v in run_params.items()}
        pax = jax.eval_shape(lambda tree: pax_layout.to_pax(tree, *self.layout), abstract)
        dtypes = {}
        for path, recipe in self._recipes(run_params).items():
            dtypes.update({name: run_params[path].dtype for name in recipe.pax_names})
        return {
            PARAMS + k: Variable(tuple(v.shape), np.dtype(dtypes.get(k, np.float32)))
            for k, v in pax.items()
        }

    def unreadable(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> list[str]:
        problems = []
        for path, recipe in self._recipes(run_params).items():
            names = [PARAMS + n for n in recipe.pax_names]
            have = [n for n in names if n in assigned]
            if have and len(have) < len(names):
                problems.append(
                    f"{PARAMS}{path} is stored in Pax's {', '.join(names)}: load all or none "
                    f"of them (the rules load {', '.join(have)})"
                )
        return problems

    def loaded_leaves(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> set[str]:
        return {
            path
            for path, recipe in self._recipes(run_params).items()
            if all(PARAMS + n in assigned for n in recipe.pax_names)
        }

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        recipes = self._recipes(run_params)
        for path in sorted(self.loaded_leaves(assigned, run_params)):
            recipe = recipes[path]
            names = [PARAMS + n for n in recipe.pax_names]
            stores = {n[len(PARAMS) :]: self._store(assigned[n]) for n in names}
            out[path] = self._read_leaf(path, recipe, recipe.view(stores), run_params[path])
        return out

    def _recipes(self, run_params: Mapping[str, Any]) -> dict[str, pax_layout.Recipe]:
        return pax_layout.recipes(run_params, *self.layout)

    def _store(self, name: str) -> ts.TensorStore:
        if name not in self._stores:
            spec = {"driver": "zarr", "kvstore": storage.kvstore(self._dirs[name])}
            self._stores[name] = ts.open(spec, read=True).result()
        return self._stores[name]

    def _read_leaf(self, path: str, recipe: Any, view: ts.TensorStore, target: Any) -> Any:
        """The leaf on ``target``'s sharding: each distinct device slice read once."""
        read: dict[Any, np.ndarray] = {}

        def slice_of(index: tuple[slice, ...]) -> np.ndarray:
            key = tuple((s.start, s.stop) for s in index)
            if key not in read:
                values = np.asarray(view[index].read().result(), np.float32)
                if recipe.scale_offset:  # praxis stores a LayerNorm scale minus 1.
                    values = values + 1.0
                if self._observer is not None:
                    self._observer(path, values.size * np.dtype(view.dtype.numpy_dtype).itemsize)
                read[key] = values.astype(target.dtype)
            return read[key]

        return jax.make_array_from_callback(target.shape, target.sharding, slice_of)


def _is_pax_step(path: epath.Path) -> bool:
    state = path / "state"
    return state.is_dir() and any(state.glob(_PAX_PARAMS + "*"))


def _pax_steps(path: epath.Path) -> dict[int, epath.Path]:
    found = (_PAX_STEP.fullmatch(p.name) for p in path.iterdir()) if path.is_dir() else ()
    return {int(m.group(1)): path / m.group(0) for m in found if m and _is_pax_step(path / m.group(0))}


def _open_pax_step(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> Source:
    source = PaxSource(path, layout, observer)
    if step is not None and step != source.step:
        raise CheckpointSourceError(f"{path} is step {source.step}, not step {step}.")
    return source


def _open_pax_checkpoints(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> Source:
    steps = _pax_steps(path)
    return PaxSource(steps[_pick_step(path, sorted(steps), step)], layout, observer)


register(
    Kind(
        "paxlite job",
        "config.json beside checkpoints/",
        lambda p: (p / "config.json").is_file() and (p / "checkpoints").is_dir(),
        _open_paxlite_job,
    )
)
register(
    Kind(
        "paxlite step",
        f"{_ORBAX_STEP_FILE}, as in <job>/checkpoints/<step>",
        lambda p: p.name.isdigit() and (p / _ORBAX_STEP_FILE).exists(),
        _open_paxlite_step,
    )
)
register(
    Kind(
        "paxlite checkpoints dir",
        f"<step>/{_ORBAX_STEP_FILE} steps, as in <job>/checkpoints",
        lambda p: p.is_dir() and bool(_paxlite_steps(p)),
        lambda p, step, layout, observer: PaxliteSource(p, _pick_step(p, _paxlite_steps(p), step)),
    )
)
register(
    Kind(
        "paxml step",
        f"state/{_PAX_PARAMS}*, as in <job>/checkpoints/checkpoint_00001000",
        _is_pax_step,
        _open_pax_step,
    )
)
register(
    Kind(
        "paxml checkpoints dir",
        "checkpoint_<8 digits>/ steps, as in <job>/checkpoints",
        lambda p: bool(_pax_steps(p)),
        _open_pax_checkpoints,
    )
)
