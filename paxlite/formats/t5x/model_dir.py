"""T5X's MODEL_DIR for a run of ``paxlite.t5x.train``: ``checkpoint_<step>/`` in the orbax
layout T5X writes at HEAD, and ``model-info.txt``.

A step is T5X's (``OrbaxCheckpointManagerInterface``: an orbax ``CheckpointManager`` with
step prefix ``checkpoint``): item ``state/`` holds the train state's ``state_dict()``,
``{'target': params, 'state': {'step': step, 'param_states': {<param>: {'m', 'v', 'v_col',
'v_row'}}}}``, under T5X's parameter names and layouts (:mod:`t5x_layout`: our ``[D, N, H]``
attention kernels as T5X's ``[E, N*H]``), Adafactor's second moment as T5X keeps it (``v``
whole, or ``v_row`` over the 'embed' dim and ``v_col`` over the other, flattened as T5X's
2-D kernel has it; ``(1,)`` zeros in the unused slots, and in ``m``: no momentum). Item
``input/`` is paxlite's input state (T5X's restore reads the ``state`` item only). Reading a
step back is T5X's reader's (``paxlite.formats.t5x.checkpoint``): each device's slice read by
itself, the step and Adafactor's moments into the run's optimizer state.

``model-info.txt`` is T5X's ``utils.log_model_info``: a ``Variable`` line per parameter
(T5X's name, size, shape by logical axis, partition spec from the logical axis rules), the
total, a blank line, then the optimizer state's lines and ``step``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import traverse_util

from paxlite.checkpoints import init_from, train_checkpoints
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.formats.t5x import layout as t5x_layout
from paxlite.train.train_state import TrainState
from praxis_lite.optim.factored_adafactor import FactoredMoment, FactorLayout, FullMoment

MODEL_INFO = "model-info.txt"
#: T5X's parameters' logical axes, by the end of their name.
_AXES = (
    (r"token_embedder/embedding", ("vocab", "embed")),
    (r"/(query|key|value)/kernel", ("embed", "joined_kv")),
    (r"/out/kernel", ("joined_kv", "embed")),
    (r"/mlp/wi(_\d+)?/kernel", ("embed", "mlp")),
    (r"/mlp/wo/kernel", ("mlp", "embed")),
    (r"logits_dense/kernel", ("embed", "vocab")),
    (r"relpos_bias/rel_embedding", ("heads", "relpos_buckets")),
    (r"/scale", ("embed",)),
)
_SLOTS = ("m", "v", "v_col", "v_row")
_UNUSED = (1,)  # T5X's shape for a slot a parameter does not use.


@dataclasses.dataclass(frozen=True)
class T5xCheckpoints(train_checkpoints.CheckpointFormat):
    """T5X's ``checkpoint_<step>/`` in MODEL_DIR (a task's ``checkpoint_format``).

    Attributes:
      gated: the MLPs are gated (T5 1.1: ``wi_0``/``wi_1``; T5 1.0: ``wi``).
      logical_axis_rules: T5X's ``(logical axis, 'data' | 'model' | None)`` rules, for
        model-info's partition specs.
      factored, min_dim_size_to_factor: T5X's Adafactor's: which second moments T5X keeps
        factored (a 2-D parameter whose two dims are both at least that size; ``v_row`` over
        the smaller dim, :func:`t5x_checkpoint.t5x_row_axis`); a moment this run keeps the
        other way is converted (whole from factors: T5X's estimate ``v_row * v_col /
        mean(v_row)``; factors from whole: its means, which T5X's factors are).
    """

    gated: bool = True
    logical_axis_rules: tuple[tuple[str, str | None], ...] = ()
    factored: bool = True
    min_dim_size_to_factor: int = 128

    step_prefix: ClassVar[str] = "checkpoint"
    shares_job_directory: ClassVar[bool] = True

    def directory(self, job_log_dir: epath.Path) -> epath.Path:
        return job_log_dir

    def to_saved(self, state: TrainState) -> dict[str, Any]:
        """T5X's ``state_dict()`` of ``state``.

        Raises:
          CheckpointMismatchError: a parameter T5X's T5 lacks, or optimizer state T5X's
            Adafactor has no slot for (momentum, an optax chain's).
        """
        params = traverse_util.flatten_dict(state.params, sep="/")
        named = self._t5x_names(params)
        moments = _moments_by_param(state.opt_state, list(params))
        # On the step's devices, replicated (traceable, and a global array in a multi-process job).
        unused = jnp.broadcast_to(jnp.zeros_like(state.step, dtype=jnp.float32), _UNUSED)
        target, slots = {}, {}
        for path, where in named.items():
            layers = _layers(params[path], where.stacked)
            names = where.layer_names(len(layers))
            for i, (name, layer) in enumerate(zip(names, layers, strict=True)):
                target[name] = hf_layout.to_theirs(where.layout, layer)
                moment = _layer_moment(moments[path], i if where.stacked else None)
                row_axis = self._row_axis(target[name].shape)
                slots[name] = _t5x_slots(moment, where.layout, _embed_axis(name), row_axis, unused)
        param_states = {f"{name}/{slot}": v for name, s in slots.items() for slot, v in s.items()}
        return {
            "target": traverse_util.unflatten_dict(target, sep="/"),
            "state": {
                "step": state.step,
                "param_states": traverse_util.unflatten_dict(param_states, sep="/"),
            },
        }

    def _t5x_names(self, params: dict[str, Any]) -> dict[str, Any]:
        """Where each of paxlite's (flat) parameters goes in T5X's tree.

        Raises:
          CheckpointMismatchError: a parameter T5X's T5 lacks.
        """
        named = hf_layout.their_names(t5x_layout.t5x_table(self.gated), list(params))
        missing = sorted(set(params) - set(named))
        if missing:
            raise train_checkpoints.CheckpointMismatchError(
                f"T5X's T5 has no parameter for {', '.join(missing)}: T5X's checkpoint "
                "format cannot hold this model."
            )
        return named

    def params_info(self, params: Any) -> str:
        """T5X's model-info.txt of a state without optimizer (T5X's eval and infer write
        it): the parameters (arrays or ShapeDtypeStructs, paxlite's tree) and the step."""
        flat = traverse_util.flatten_dict(params, sep="/")
        target = {}
        for path, where in self._t5x_names(flat).items():
            layers = jax.eval_shape(lambda a, s=where.stacked: _layers(a, s), flat[path])
            for name, layer in zip(where.layer_names(len(layers)), layers, strict=True):
                target[name] = jax.eval_shape(
                    lambda a, w=where: hf_layout.to_theirs(w.layout, a), layer
                )
        step = jax.ShapeDtypeStruct((), jnp.int32)
        saved = {"target": traverse_util.unflatten_dict(target, sep="/"), "state": {"step": step}}
        return model_info(saved, self.logical_axis_rules)

    def _row_axis(self, shape: tuple[int, ...]) -> int | None:
        """The axis T5X's ``v_row`` keeps of a parameter of ``shape``; None: T5X keeps its
        second moment whole."""
        if not self.factored or len(shape) != 2 or min(shape) < self.min_dim_size_to_factor:
            return None
        return t5x_checkpoint.t5x_row_axis(tuple(shape))

    def restored(self, manager: Any, step: int, abstract_state: TrainState) -> TrainState:
        """Step ``step`` read by T5X's reader onto ``abstract_state``'s shardings: the
        parameters, the step and Adafactor's moments (a fresh count of non-finite steps)."""
        step_dir = str(epath.Path(manager.directory) / self.step_name(step))
        rules = {step_dir: CheckpointLoadingRules(load_step=True, load_opt_states=True)}

        def around(loaded: dict[str, Any]) -> TrainState:
            return abstract_state.replace(
                params=traverse_util.unflatten_dict(loaded, sep="/"),
                nonfinite_steps=_put(0, abstract_state.nonfinite_steps),
                first_nonfinite_step=_put(-1, abstract_state.first_nonfinite_step),
            )

        return init_from.initialise_around(around, abstract_state, rules, {step_dir: (1, 1)})

    def describe(self, job_log_dir: epath.Path, abstract_state: TrainState) -> None:
        """Writes ``model-info.txt`` as T5X's ``utils.log_model_info`` does."""
        saved = jax.eval_shape(self.to_saved, abstract_state)
        (job_log_dir / MODEL_INFO).write_text(model_info(saved, self.logical_axis_rules))


def model_info(saved: dict[str, Any], rules: Sequence[tuple[str, str | None]]) -> str:
    """T5X's model-info.txt of a ``state_dict()`` (arrays or ShapeDtypeStructs)."""
    target = traverse_util.flatten_dict(saved["target"], sep="/")
    state = traverse_util.flatten_dict(saved["state"], sep="/")
    lines = [_line(name, target[name].shape, _param_axes(name), rules) for name in sorted(target)]
    total = sum(int(np.prod(target[name].shape)) for name in target)
    lines += [f"Total number of parameters: {total}", ""]
    for name in sorted(state):
        lines.append(_line(name, state[name].shape, _state_axes(name, state[name].shape), rules))
    return "\n".join(lines) + "\n"


def _line(
    name: str,
    shape: tuple[int, ...],
    axes: tuple[str, ...] | None,
    rules: Sequence[tuple[str, str | None]],
) -> str:
    if axes is None or len(axes) != len(shape):
        shape_text, spec = str(tuple(shape)), None
    else:
        shape_text = "({})".format(", ".join(f"{a}={n}" for a, n in zip(axes, shape, strict=True)))
        mesh = dict(reversed(tuple(rules)))  # The first rule for an axis wins.
        spec = tuple(mesh.get(a) for a in axes)
    size = int(np.prod(shape))
    return f"Variable {name:<80} size {size:<12} shape {shape_text:<40} partition spec {spec}"


def _param_axes(name: str) -> tuple[str, ...] | None:
    return next((axes for end, axes in _AXES if re.search(end + "$", name)), None)


def _state_axes(name: str, shape: tuple[int, ...]) -> tuple[str, ...] | None:
    """A slot's axes: ``v`` (and ``m``) the parameter's; ``v_row``, ``v_col``, the ``(1,)``
    placeholders and ``step`` none (T5X's ``derive_logical_axes``)."""
    if tuple(shape) == _UNUSED or "/" not in name:
        return None
    param, slot = name.removeprefix("param_states/").rsplit("/", 1)
    return _param_axes(param) if slot in ("m", "v") else None  # T5X names no factor's axes.


def _moments_by_param(opt_state: Any, params: list[str]) -> dict[str, Any]:
    """Each parameter's second moment in the optimizer state (found by its path's end)."""
    moments: dict[str, Any] = {}
    kinds = (FactoredMoment, FullMoment)
    for path, leaf in jax.tree_util.tree_flatten_with_path(
        opt_state, is_leaf=lambda x: isinstance(x, kinds)
    )[0]:
        name = train_checkpoints.path_name(path)
        if isinstance(leaf, kinds):
            param = next((p for p in params if name.endswith("/" + p)), None)
            if param is not None:
                moments[param] = leaf
                continue
        elif leaf.shape == () and np.dtype(leaf.dtype).kind in "iu":
            continue  # A count: T5X's is the step.
        raise train_checkpoints.CheckpointMismatchError(
            f"T5X's Adafactor state has no slot for the optimizer state's {name} "
            f"{tuple(leaf.shape) if hasattr(leaf, 'shape') else ''}: T5X's checkpoint format "
            "is written for Adafactor without momentum."
        )
    lacking = sorted(set(params) - set(moments))
    if lacking:
        raise train_checkpoints.CheckpointMismatchError(
            f"no Adafactor moment for {', '.join(lacking)} in the optimizer state: T5X's "
            "checkpoint format holds Adafactor's."
        )
    return moments


def _layers(array: Any, stacked: bool) -> list[Any]:
    return [array[i] for i in range(array.shape[0])] if stacked else [array]


def _layer_moment(moment: Any, layer: int | None) -> Any:
    """The moment of one layer of a scanned stack (``layer``), or ``moment`` itself."""
    if layer is None:
        return moment
    if isinstance(moment, FullMoment):
        return moment.v[layer]
    shift = moment.layout  # The layer dim (0) gone: every other dim one lower.
    layout = FactorLayout(
        tuple(d - 1 for d in shift.row_dims), tuple(d - 1 for d in shift.col_dims)
    )
    return FactoredMoment(moment.v_row[layer], moment.v_col[layer], layout)


def _t5x_slots(
    moment: Any,
    layout: hf_layout.Layout,
    embed_axis: int | None,
    row_axis: int | None,
    unused: Any,
) -> dict[str, Any]:
    """T5X's ``m``, ``v``, ``v_col``, ``v_row`` of one T5X parameter (``row_axis``: the
    axis T5X's ``v_row`` keeps, None when T5X keeps the moment whole; ``embed_axis``: the
    parameter's 'embed' axis, the one our ``v_row`` keeps)."""
    slots = dict.fromkeys(_SLOTS, unused)
    if row_axis is None:
        slots["v"] = hf_layout.to_theirs(layout, _whole(moment))
    elif isinstance(moment, FactoredMoment) and embed_axis is not None:
        over_embed = moment.v_row.reshape(-1)
        over_other = moment.v_col.reshape(-1)  # T5X's joined heads, in order.
        same = row_axis == embed_axis
        slots["v_row"], slots["v_col"] = (
            (over_embed, over_other) if same else (over_other, over_embed)
        )
    else:  # T5X's factors of a moment kept whole here: its means.
        v = hf_layout.to_theirs(layout, _whole(moment))
        slots["v_row"] = v.mean(axis=1 - row_axis)
        slots["v_col"] = v.mean(axis=row_axis)
    return slots


def _embed_axis(name: str) -> int | None:
    axes = _param_axes(name)
    return axes.index("embed") if axes is not None and "embed" in axes else None


def _whole(moment: Any) -> Any:
    """A second moment in full (a factored one: T5X's estimate from its factors)."""
    if isinstance(moment, FullMoment):
        return moment.v
    if not isinstance(moment, FactoredMoment):
        return moment  # A layer's v of a scanned stack.
    rows, cols = moment.layout.row_dims, moment.layout.col_dims
    full = jnp.expand_dims(moment.v_row, cols) * jnp.expand_dims(moment.v_col, rows)
    return full / moment.v_row.mean()


def _put(value: int, like: Any) -> jax.Array:
    return jax.device_put(jnp.asarray(value, like.dtype), like.sharding)
