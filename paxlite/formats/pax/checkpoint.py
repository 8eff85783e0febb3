"""paxml 1.4 checkpoints as a ``checkpoint_sources`` kind: their model parameters,
read into a paxlite model's parameters.

paxml 1.4 saves a step as ``<job>/checkpoints/checkpoint_<8-digit step>/state/`` with one
tensorstore (zarr) array per variable: ``mdl_vars.params.<dotted Pax path>`` for the model's
weights, ``opt_states_*`` for the optimizer's (not read here). A :class:`PaxSource` names them
``params/<Pax path>`` and reads each paxlite leaf through its ``paxlite.formats.pax.layout.Recipe``
(names, transposes, stacking and value conventions), one device slice at a time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tensorstore as ts
from etils import epath

from paxlite.checkpoints import checkpoint_sources
from paxlite.formats.pax import layout as pax_layout
from paxlite.runtime import storage

_PAX_PARAMS = "mdl_vars.params."
_PAX_STEP = re.compile(r"checkpoint_(\d{8})")
_RUN_PREFIX = checkpoint_sources.PARAMS


class PaxSource(checkpoint_sources.PartsSource):
    """A paxml 1.4 step: one zarr array per variable, ``state/mdl_vars.params.<dotted path>``.

    Run names are Pax's (``pax_layout.to_pax`` under the source's pipeline ``layout``);
    each paxlite leaf is read through its ``pax_layout.Recipe``, a device slice at a time.
    """

    kind = "paxml step"

    def __init__(self, step_dir: epath.Path, layout: tuple[int, int], observer: Any):
        self.path, self.layout, self._observer = step_dir, layout, observer
        numbered = _PAX_STEP.fullmatch(step_dir.name)
        self.step = int(numbered.group(1)) if numbered else 0
        self._dirs = {
            _RUN_PREFIX + d.name[len(_PAX_PARAMS) :].replace(".", "/"): d
            for d in sorted((step_dir / "state").glob(_PAX_PARAMS + "*"))
        }
        self._stores: dict[str, ts.TensorStore] = {}

    def variables(self) -> dict[str, checkpoint_sources.Variable]:
        return {
            name: checkpoint_sources.Variable(tuple(store.shape), np.dtype(store.dtype.numpy_dtype))
            for name, store in ((n, self._store(n)) for n in self._dirs)
        }

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, checkpoint_sources.Variable]:
        abstract = {k: jax.ShapeDtypeStruct(v.shape, np.float32) for k, v in run_params.items()}
        pax = jax.eval_shape(lambda tree: pax_layout.to_pax(tree, *self.layout), abstract)
        dtypes = {}
        for path, recipe in self._recipes(run_params).items():
            dtypes.update({name: run_params[path].dtype for name in recipe.pax_names})
        return {
            _RUN_PREFIX + k: checkpoint_sources.Variable(
                tuple(v.shape), np.dtype(dtypes.get(k, np.float32))
            )
            for k, v in pax.items()
        }

    def _leaf_parts(self, run_params: Mapping[str, Any]) -> list[tuple[str, Any, list[str]]]:
        return [
            (path, recipe, [_RUN_PREFIX + n for n in recipe.pax_names])
            for path, recipe in self._recipes(run_params).items()
        ]

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        recipes = self._recipes(run_params)
        for path in sorted(self.loaded_leaves(assigned, run_params)):
            recipe = recipes[path]
            names = [_RUN_PREFIX + n for n in recipe.pax_names]
            stores = {n[len(_RUN_PREFIX) :]: self._store(assigned[n]) for n in names}
            dirs = [self._dirs[assigned[n]] for n in names]
            view = recipe.view(stores)
            out[path] = self._read_leaf(path, recipe, (view, dirs), run_params[path])
        return out

    def _recipes(self, run_params: Mapping[str, Any]) -> dict[str, pax_layout.Recipe]:
        return pax_layout.recipes(run_params, *self.layout)

    def _store(self, name: str) -> ts.TensorStore:
        """The opened zarr array ``name`` (opened once).

        Raises:
          CheckpointSourceError: its metadata cannot be read (one line naming its directory).
        """
        if name not in self._stores:
            spec = {"driver": "zarr", "kvstore": storage.kvstore(self._dirs[name])}
            try:
                self._stores[name] = ts.open(spec, read=True).result()
            except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
                raise _damaged([self._dirs[name]], "opened", e) from None
        return self._stores[name]

    def _read_leaf(
        self,
        path: str,
        recipe: Any,
        view_and_dirs: tuple[ts.TensorStore, list[epath.Path]],
        target: Any,
    ) -> Any:
        """The leaf on ``target``'s sharding: each distinct device slice read once.

        ``view_and_dirs``: the leaf's elements in the Pax arrays, and the arrays'
        directories (for the one line when one cannot be read).
        """
        view, dirs = view_and_dirs

        def read(index: tuple[slice, ...]) -> np.ndarray:
            try:
                values = np.asarray(view[index].read().result(), np.float32)
            except Exception as e:  # noqa: BLE001 (tensorstore raises ValueError and more)
                raise _damaged(dirs, "read", e) from None
            if recipe.scale_offset:  # praxis stores a LayerNorm scale minus 1.
                values = values + 1.0
            if self._observer is not None:
                self._observer(path, values.size * np.dtype(view.dtype.numpy_dtype).itemsize)
            return values.astype(target.dtype)

        return checkpoint_sources.sharded_array(target, read)


def _damaged(
    dirs: list[epath.Path], what: str, error: Exception
) -> checkpoint_sources.CheckpointSourceError:
    """One line naming the Pax arrays (their directories) that cannot be opened or read."""
    names = ", ".join(d.name for d in dirs)
    where = dirs[0] if len(dirs) == 1 else dirs[0].parent
    return checkpoint_sources.CheckpointSourceError(
        f"{where}: paxml array {names} cannot be {what} ({storage.one_line(error)})."
    )


def _is_pax_step(path: epath.Path) -> bool:
    state = path / "state"
    return state.is_dir() and any(state.glob(_PAX_PARAMS + "*"))


def _pax_steps(path: epath.Path) -> dict[int, epath.Path]:
    found = (_PAX_STEP.fullmatch(p.name) for p in path.iterdir()) if path.is_dir() else ()
    return {
        int(m.group(1)): path / m.group(0) for m in found if m and _is_pax_step(path / m.group(0))
    }


def _open_pax_step(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> checkpoint_sources.Source:
    source = PaxSource(path, layout, observer)
    if step is not None and step != source.step:
        raise checkpoint_sources.CheckpointSourceError(
            f"{path} is step {source.step}, not step {step}."
        )
    return source


def _open_pax_checkpoints(
    path: epath.Path, step: int | None, layout: tuple[int, int], observer: Any
) -> checkpoint_sources.Source:
    steps = _pax_steps(path)
    return PaxSource(
        steps[checkpoint_sources.pick_step(path, sorted(steps), step)], layout, observer
    )


checkpoint_sources.register(
    checkpoint_sources.Kind(
        "paxml step",
        f"state/{_PAX_PARAMS}*, as in <job>/checkpoints/checkpoint_00001000",
        _is_pax_step,
        _open_pax_step,
    )
)
checkpoint_sources.register(
    checkpoint_sources.Kind(
        "paxml checkpoints dir",
        "checkpoint_<8 digits>/ steps, as in <job>/checkpoints",
        lambda p: bool(_pax_steps(p)),
        _open_pax_checkpoints,
    )
)
