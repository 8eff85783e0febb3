"""One registry of the checkpoints a run can read parameters from, keyed by what a path holds.

``--init_from``, ``--restore_checkpoint_dir`` and ``paxlite.pretrained.loading.from_pretrained`` all
open a path here. Each kind is recognised by a file only it has (the first kind that
recognises a path wins; :func:`identify` names what it looked for when none does):

==================  ==========================================================================
kind                recognised by
==================  ==========================================================================
paxlite job         ``checkpoints/`` beside ``config.json`` or holding orbax steps (its newest)
paxlite step        ``_CHECKPOINT_METADATA`` (an orbax step: ``<job>/checkpoints/<step>``)
paxlite checkpoints ``<step>/_CHECKPOINT_METADATA`` steps (``<job>/checkpoints``)
paxml step          ``state/mdl_vars.params.*`` (``<job>/checkpoints/checkpoint_00001000``)
paxml checkpoints   ``checkpoint_<8 digits>/`` steps (Pax's ``--restore_checkpoint_dir``)
t5x checkpoint      ``checkpoint_<step>/checkpoint`` or ``checkpoint_<step>/state/_METADATA``
mtf checkpoint      ``<prefix>.index`` beside the prefix given, or ``<name>-<step>.index`` files
==================  ==========================================================================

The paxml kinds live with the rest of Pax's format (``paxlite.formats.pax.checkpoint``, registered
when it is imported; ``init_from``, which every reader goes through, imports it), as the
T5X kind does with T5X's (``paxlite.formats.t5x.checkpoint``) and Mesh TensorFlow's with
its (``paxlite.formats.mtf.checkpoint``).
A :class:`Source` names its variables as its framework does (``params/<path>``, ``/``
between keys, Pax's names for a paxml checkpoint) and reads any of them straight onto a
run's shardings: each device's slice is read by itself, never a whole array on one host.
Values are cast to the dtype asked for.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import traverse_util

from paxlite.runtime import storage

#: Variable names start with their collection, as Pax's do (``params/lm/...``).
PARAMS = "params/"
_ORBAX_STEP_FILE = "_CHECKPOINT_METADATA"

#: Called with (paxlite leaf path, bytes asked for) for each slice a source reads.
ReadObserver = Callable[[str, int], None]


class CheckpointSourceError(FileNotFoundError):
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

    def close(self) -> None:  # noqa: B027 (most sources hold nothing open)
        """Lets go of what the source holds open."""

    def opt_state_names(
        self, assigned: Mapping[str, str], run_params: Mapping[str, Any]
    ) -> dict[str, str]:
        """Run leaf path -> the path its optimizer slots have in :meth:`read_train_state`'s
        ``opt_state``, for the leaves ``assigned`` loads (``partial_load_opt_states``): by
        default the source's own name of the leaf (its state is in its own names)."""
        del run_params
        cut = len(PARAMS)
        return {run[cut:]: source[cut:] for run, source in assigned.items()}

    def read_train_state(self, abstract: Any, *, opt_state: bool) -> dict[str, Any]:
        """``{'step': int, 'opt_state': tree}`` (the latter only if asked) from this step."""
        raise CheckpointSourceError(
            f"{self.describe()} holds no optimizer state paxlite can read; leave "
            "load_opt_states, partial_load_opt_states and load_step False for it."
        )


class PartsSource(Source):
    """A source that may store one run leaf as several arrays (a scanned stack's layers as
    one tensor each: Hugging Face's, PEFT's; Pax's parts of a leaf): a leaf is read whole
    or not at all."""

    @abc.abstractmethod
    def _leaf_parts(self, run_params: Mapping[str, Any]) -> list[tuple[str, Any, list[str]]]:
        """``(run leaf path, where it is, the variable names it is stored as)`` of each run
        leaf this source names."""

    def unreadable(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> list[str]:
        problems = []
        for path, _, names in self._leaf_parts(run_params):
            have = [n for n in names if n in assigned]
            if have and len(have) < len(names):
                shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
                problems.append(
                    f"{PARAMS}{path} is stored as {len(names)} arrays ({shown}): load all or "
                    f"none of them (the rules load {len(have)})"
                )
        return problems

    def loaded_leaves(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> set[str]:
        return {
            path
            for path, _, names in self._leaf_parts(run_params)
            if all(n in assigned for n in names)
        }


@dataclasses.dataclass(frozen=True)
class Kind:
    """A registered kind of checkpoint path.

    Attributes:
      name: e.g. 'paxml step'; marker: what recognises it (said when nothing does);
      recognises: path -> whether it is this kind; open: (path, step or None, layout,
        observer) -> Source (layout: the pipeline's ``(S, R)`` a Pax source was saved with).
      describes: path -> ``(model config, decoding defaults)`` of a checkpoint that says
        what it holds (a T5X model directory's config.gin), or None when an experiment
        must say it.
    """

    name: str
    marker: str
    recognises: Callable[[epath.Path], bool]
    open: Callable[[epath.Path, int | None, tuple[int, int], ReadObserver | None], Source]
    describes: Callable[[epath.Path], tuple[Any, Any] | None] = lambda path: None


KINDS: list[Kind] = []


def register(kind: Kind) -> Kind:
    """Adds ``kind`` to the registry (after the kinds already there)."""
    KINDS.append(kind)
    return kind


def identify(path: epath.PathLike) -> Kind:
    """The first registered kind that recognises ``path``.

    Raises:
      CheckpointSourceError: ``path`` does not exist, or no kind recognises it (the
        message lists what each looks for).
    """
    path = storage.job_path(path)
    for kind in KINDS:  # Before existence: a TensorFlow checkpoint's prefix is no file.
        if kind.recognises(path):
            return kind
    if not path.exists():
        raise CheckpointSourceError(f"{path} does not exist: no checkpoint to read there.")
    looked = "; ".join(f"a {k.name} ({k.marker})" for k in KINDS)
    raise CheckpointSourceError(
        f"{path} holds no checkpoint paxlite can read: looked for {looked}."
    )


def sharded_array(target: Any, read: Callable[[tuple[slice, ...]], np.ndarray]) -> jax.Array:
    """An array of ``target``'s shape on its sharding, ``read`` (a device's index -> its
    values) called once per distinct slice: devices holding the same slice share one read."""
    cache: dict[tuple[tuple[int | None, int | None], ...], np.ndarray] = {}

    def slice_of(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop) for s in index)
        if key not in cache:
            cache[key] = read(index)
        return cache[key]

    return jax.make_array_from_callback(target.shape, target.sharding, slice_of)


#: A paxlite kind's path -> its job dir (where config.txt and config.json are).
_JOB_DIR_OF = {
    "paxlite job": lambda p: p,
    "paxlite checkpoints dir": lambda p: p.parent,
    "paxlite step": lambda p: p.parent.parent,
}


def job_dir_of(path: epath.PathLike, kind: Kind | None = None) -> epath.Path | None:
    """The paxlite job directory a checkpoint path belongs to; None for other kinds (and
    for a path that holds no checkpoint). ``kind``: what :func:`identify` found, if known."""
    path = storage.job_path(path)
    if kind is None:
        try:
            kind = identify(path)
        except CheckpointSourceError:
            return None
    return _JOB_DIR_OF[kind.name](path) if kind.name in _JOB_DIR_OF else None


def open_source(
    path: epath.PathLike,
    step: int | None = None,
    layout: tuple[int, int] = (1, 1),
    observer: ReadObserver | None = None,
    kind: Kind | None = None,
) -> Source:
    """Opens ``path`` (its newest step, or ``step``) as ``kind``, by default the kind
    :func:`identify` finds."""
    path = storage.job_path(path)
    return (kind or identify(path)).open(path, step, layout, observer)


# --- paxlite (orbax) ------------------------------------------------------------------------


class PaxliteSource(Source):
    """A step of a paxlite job: orbax's ``state`` item (``params``, ``opt_state``, ``step``)."""

    kind = "paxlite step"

    def __init__(self, checkpoints_dir: epath.Path, step: int):
        self.path, self.step = checkpoints_dir / str(step), step
        self._manager = ocp.CheckpointManager(
            checkpoints_dir,
            item_handlers={
                "state": ocp.PyTreeCheckpointHandler(),
                "input": ocp.JsonCheckpointHandler(),  # Never read; named, so orbax is quiet.
            },
        )
        metadata = self._manager.item_metadata(step)["state"]
        self._metadata = getattr(metadata, "tree", metadata)

    def variables(self) -> dict[str, Variable]:
        flat = traverse_util.flatten_dict(self._metadata["params"], sep="/")
        return {PARAMS + k: Variable(tuple(v.shape), np.dtype(v.dtype)) for k, v in flat.items()}

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        return {
            PARAMS + k: Variable(tuple(v.shape), np.dtype(v.dtype)) for k, v in run_params.items()
        }

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
    return PaxliteSource(path / "checkpoints", pick_step(path, steps, step))


def _open_paxlite_step(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> Source:
    if step is not None and step != int(path.name):
        raise CheckpointSourceError(f"{path} is step {path.name}, not step {step}.")
    return PaxliteSource(path.parent, int(path.name))


def pick_step(path: epath.Path, steps: list[int], step: int | None) -> int:
    if step is None:
        return max(steps)
    if step not in steps:
        raise CheckpointSourceError(
            f"{path} has no checkpoint at step {step}; its steps: {', '.join(map(str, steps))}."
        )
    return step


register(
    Kind(
        "paxlite job",
        "checkpoints/ beside config.json, or holding orbax steps",
        lambda p: (
            (p / "checkpoints").is_dir()
            and ((p / "config.json").is_file() or bool(_paxlite_steps(p / "checkpoints")))
        ),
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
        lambda p, step, layout, observer: PaxliteSource(p, pick_step(p, _paxlite_steps(p), step)),
    )
)
