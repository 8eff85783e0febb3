"""A paxml checkpoint's model parameters, read into paxlite's parameter tree.

paxml 1.4 saves a step as ``<job>/checkpoints/checkpoint_<8-digit step>/state/`` with one
tensorstore (zarr) array per variable: ``mdl_vars.params.<dotted Pax path>`` for the model's
weights, ``opt_states_*`` for the optimizer's (not read here). :func:`read_pax_params` reads the
former; :func:`pax_params_for` puts them into the layout of a paxlite model (names, transposes,
stacking and value conventions: ``paxlite.pax_layout``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorstore as ts
from etils import epath
from flax import traverse_util

from paxlite import pax_layout, storage

_PARAMS_PREFIX = "mdl_vars.params."


class PaxCheckpointError(ValueError):
    """Not a paxml checkpoint step, or one of another model."""


def read_pax_params(step_dir: epath.PathLike) -> dict[str, np.ndarray]:
    """``{'lm/softmax/logits_ffn/linear/w': array, ...}``: the model weights of a paxml step.

    Raises:
      PaxCheckpointError: ``step_dir`` has no ``state/mdl_vars.params.*`` arrays.
    """
    state = storage.job_path(step_dir) / "state"  # A local path or gs://...
    arrays = sorted(state.glob(_PARAMS_PREFIX + "*")) if state.is_dir() else []
    if not arrays:
        raise PaxCheckpointError(
            f"{step_dir} is not a paxml checkpoint step (no state/{_PARAMS_PREFIX}* arrays); "
            "pass a directory like <job>/checkpoints/checkpoint_00001000."
        )
    out = {}
    for array_dir in arrays:
        spec = {"driver": "zarr", "kvstore": storage.kvstore(array_dir)}
        name = array_dir.name[len(_PARAMS_PREFIX) :].replace(".", "/")
        out[name] = np.asarray(ts.open(spec).result().read().result())
    return out


def pax_params_for(
    step_dir: epath.PathLike,
    abstract_params: Any,
    num_stages: int = 1,
    circular_repeat: int = 1,
) -> Any:
    """The weights of a paxml step as the nested params tree ``abstract_params`` describes
    (a paxlite model's params, arrays or ``jax.ShapeDtypeStruct``; float32 values).

    Raises:
      PaxCheckpointError: not a paxml step, or its weights are another model's (each
        missing, extra or differently shaped parameter is named).
    """
    flat = traverse_util.flatten_dict(abstract_params, sep="/")
    try:
        ours = pax_layout.from_pax(read_pax_params(step_dir), flat, num_stages, circular_repeat)
    except pax_layout.PaxLayoutError as e:
        raise PaxCheckpointError(f"{step_dir} holds another model's weights: {e}") from None
    return traverse_util.unflatten_dict(ours, sep="/")
