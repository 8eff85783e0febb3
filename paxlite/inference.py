"""A trained language model from Python: ``from_pretrained(path)``, ``.logits``, ``.generate``.

``path`` is a paxlite job directory (its newest checkpoint), one of its step directories
(``<job>/checkpoints/<step>``), or a paxml checkpoint step (``<job>/checkpoints/
checkpoint_00001000``) together with the experiment it was trained with::

    from paxlite.inference import from_pretrained

    lm = from_pretrained("/tmp/paxlite_tiny")                      # paxlite job dir
    lm = from_pretrained("gs_copy/checkpoints/checkpoint_00000300",   # Pax checkpoint
                         exp="tasks.lm.params.lm_cloud.LmCloudSpmd2B")
    logits = lm.logits(ids)                      # ids [B, T] int -> [B, T, V] float32
    new = lm.generate(ids, max_new_tokens=16)    # [B, 16]; pad id after a row's EOS

The weights are placed as training places them (the experiment's mesh and logical-axis
rules, on the first devices of this process), each array straight onto its devices. Any
number of prompts ``B`` works on any mesh: the batch is padded with zero rows to what the
mesh's batch axes divide, and the padded rows are dropped from the results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import traverse_util

from paxlite import checkpoint_sources, init_from, partitioning, storage
from paxlite.mesh import create_mesh, mesh_size
from paxlite.overrides import resolve_experiment
from paxlite.tasks_lib import CheckpointLoadingRules
from praxis_lite import config as config_lib
from praxis_lite import decoding
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import filter_rules_for_mesh, logical_shardings, strip_boxes


class PretrainedError(ValueError):
    """The path holds no checkpoint paxlite can load, or needs the experiment named."""


@dataclasses.dataclass
class PretrainedLm:
    """A language model with its weights on devices.

    Attributes:
      model: the built model (``praxis_lite.models.LanguageModel``).
      params: its weights, sharded over ``mesh``.
      decoder: the experiment's decoder settings (greedy unless they say otherwise).
      mesh, rules: where the weights live and the logical-axis rules used.
    """

    model: Any
    params: Any
    decoder: decoding.DecoderParams
    mesh: Any
    rules: Any

    def logits(self, input_ids: Any) -> np.ndarray:
        """``input_ids [B, T]`` int -> next-token logits ``[B, T, V]`` float32 (any ``B``)."""
        ids = _token_ids(input_ids)
        padded = self._padded(ids)
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            out = _jit_logits(self.model)(self.params, jnp.asarray(padded))
        return np.asarray(out, np.float32)[: len(ids)]

    def generate(self, input_ids: Any, max_new_tokens: int, **decoder_fields: Any) -> np.ndarray:
        """``max_new_tokens`` new tokens after each row of ``input_ids [B, T]`` -> ``[B, N]``.

        Decoding follows the experiment's decoder settings (``temperature``, ``top_k``,
        ``top_p``, ``eos_id``, ``pad_id``, ``seed``), overridable here as keywords. After a
        row emits ``eos_id`` the rest of it holds ``pad_id``.
        """
        params = dataclasses.replace(self.decoder, **decoder_fields)
        ids = _token_ids(input_ids)
        lengths = np.full((len(ids),), ids.shape[1], np.int32)
        padded_ids, padded_lengths = self._padded((ids, lengths))
        key = jax.random.key(params.seed)
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            out = _jit_decode(self.model, params, max_new_tokens)(
                self.params, jnp.asarray(padded_ids), jnp.asarray(padded_lengths), key
            )
        return np.asarray(out["tokens"])[: len(ids)]

    def _padded(self, rows: Any) -> Any:
        """``rows`` (arrays ``[B, ...]``) with zero rows appended so that the batch splits
        over the mesh's batch axes (``partitioning.pad_rows``); callers keep the first B."""
        return partitioning.pad_rows(rows, partitioning.batch_sharding(self.mesh, self.rules))


def _token_ids(input_ids: Any) -> np.ndarray:
    """``input_ids`` as ``[B, T]`` int32, or a ValueError naming the shape it needs."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or 0 in ids.shape or ids.dtype.kind not in "iu":
        raise ValueError(
            f"input_ids must be token ids [B, T] with B, T >= 1, got shape {ids.shape} of "
            f"{ids.dtype}; pass one row per prompt, e.g. [[3, 5, 7]]."
        )
    return ids.astype(np.int32)


def _jit_logits(model: Any) -> Any:
    return jax.jit(
        lambda params, ids: model.apply({"params": params}, _batch(ids), method="logits")
    )


def _jit_decode(model: Any, params: decoding.DecoderParams, steps: int) -> Any:
    def decode(weights, ids, lengths, key):
        return decoding.decode_lm(model, {"params": weights}, ids, lengths, key, params, steps)

    return jax.jit(decode)


def _batch(ids: jax.Array) -> NestedMap:
    ones = jnp.ones(ids.shape, jnp.float32)
    return NestedMap(ids=ids, labels=ids, weights=ones, paddings=jnp.zeros_like(ones))


def from_pretrained(
    path: epath.PathLike, exp: str | None = None, overrides: Sequence[str] = ()
) -> PretrainedLm:
    """Loads any checkpoint ``paxlite.checkpoint_sources`` reads (a paxlite job, checkpoints
    or step dir; a paxml checkpoint step with ``exp``).

    Args:
      path: see the module docstring.
      exp: the experiment name (as ``--exp``); required for a paxml checkpoint, else read
        from the job's config.txt.
      overrides: ``KNOB=VALUE`` strings, as for ``--set``; for a paxlite job they win over
        the placement knobs read from its config.txt (e.g. ``ICI_MESH_SHAPE=1,1,1``: one
        device).

    Raises:
      PretrainedError: a paxml checkpoint without ``exp``, or a paxlite one whose job has
        no config files.
      checkpoint_sources.CheckpointSourceError: nothing loadable at ``path``.
      init_from.InitFromError: the weights are another model's (each difference named).
    """
    storage.configure()
    path = storage.job_path(path)  # A local path or gs://...
    kind = checkpoint_sources.identify(path)
    task_cfg = None
    if exp is None:
        if kind.name not in _JOB_DIR_OF:
            raise PretrainedError(
                f"{path} is a {kind.name}; name the experiment it was trained with: "
                "from_pretrained(path, exp='tasks.lm.params.lm_cloud.LmCloudSpmd2B')."
            )
        job_dir = _JOB_DIR_OF[kind.name](path)
        exp, mesh_knobs = _job_experiment(job_dir)
        given = {o.partition("=")[0].strip() for o in overrides}
        overrides = [*(k for k in mesh_knobs if k.partition("=")[0] not in given), *overrides]
        task_cfg = config_lib.from_json((job_dir / "config.json").read_text())["task"]
    experiment = resolve_experiment(exp, list(overrides), ("tasks",))
    task = config_lib.instantiate(task_cfg if task_cfg is not None else experiment.task())
    mesh, rules = _mesh_and_rules(experiment)
    params = _load_params(task.model, path, experiment, mesh, rules)
    return PretrainedLm(task.model, params, task.decoder_params(), mesh, rules)


#: A paxlite kind's path -> its job dir (where config.txt and config.json are).
_JOB_DIR_OF = {
    "paxlite job": lambda p: p,
    "paxlite checkpoints dir": lambda p: p.parent,
    "paxlite step": lambda p: p.parent.parent,
}


def _load_params(model: Any, path: epath.Path, experiment: Any, mesh: Any, rules: Any) -> Any:
    """The model's parameters from ``path``, each read onto its sharding; all must be there."""
    abstract, shardings = _abstract_params(model, mesh, rules)
    run_params = traverse_util.flatten_dict(
        jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
        ),
        sep="/",
    )
    layout = (getattr(experiment, "NUM_STAGES", 1), getattr(experiment, "CIRCULAR_REPEAT", 1))
    load = {str(path): CheckpointLoadingRules()}
    with jax.set_mesh(mesh), init_from.opened(load, {str(path): layout}) as entries:
        params = init_from.read_params(entries, run_params)
        missing = init_from.fresh_params(entries, run_params)
    if missing:
        raise init_from.InitFromError(
            f"{path} holds another model's weights: it lacks {len(missing)} of this model's "
            f"parameters ({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''})."
        )
    return traverse_util.unflatten_dict(params, sep="/")


#: Knobs that place the weights; read back from a job's config.txt (the model itself comes
#: from its config.json, exactly as trained).
_PLACEMENT_KNOBS = ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE", "MESH_AXIS_NAMES", "LOGICAL_AXIS_RULES")


def _job_experiment(job_dir: epath.Path) -> tuple[str, list[str]]:
    """The experiment a paxlite job ran and its placement knobs as ``KNOB=VALUE`` strings,
    from the job's config.txt (``# Experiment <name>``, then ``KNOB: type = value`` lines)."""
    config = job_dir / "config.txt"
    lines = config.read_text().splitlines() if config.is_file() else []
    if (
        not lines
        or not lines[0].startswith("# Experiment ")
        or not (job_dir / "config.json").is_file()
    ):
        raise PretrainedError(
            f"{job_dir} has no config.txt and config.json of a paxlite run; pass exp=."
        )
    knobs = []
    for line in lines:
        name, _, value = line.partition(": ")
        if name in _PLACEMENT_KNOBS:
            knobs.append(f"{name}={value.partition(' = ')[2]}")
    return lines[0][len("# Experiment ") :].strip(), knobs


def _mesh_and_rules(experiment: Any) -> tuple[Any, Any]:
    """The experiment's mesh on the first devices of this process, and its rules."""
    size = mesh_size(experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE)
    devices = jax.devices()
    if size > len(devices):
        raise PretrainedError(
            f"{type(experiment).__qualname__}'s mesh needs {size} devices, this process has "
            f"{len(devices)}; pass overrides=['ICI_MESH_SHAPE=...'] that fit."
        )
    mesh = create_mesh(
        experiment.ICI_MESH_SHAPE,
        experiment.DCN_MESH_SHAPE,
        experiment.MESH_AXIS_NAMES,
        devices[:size],
    )
    return mesh, filter_rules_for_mesh(experiment.logical_axis_rules(), mesh)


def _abstract_params(model: Any, mesh: Any, rules: Any) -> tuple[Any, Any]:
    """``(params as ShapeDtypeStructs, their NamedShardings)``, allocating nothing."""
    ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    boxed = jax.eval_shape(lambda b: model.init(jax.random.key(0), b), _batch(ids))["params"]
    shardings = strip_boxes(logical_shardings(boxed, mesh, rules))
    return nn.unbox(boxed), shardings
