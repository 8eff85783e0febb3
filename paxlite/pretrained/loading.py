"""Loading a trained model in Python: ``from_pretrained(path)`` returns a
``paxlite.pretrained.pretrained_models`` model (``.logits``, ``.generate``, ``.save_pretrained``): a
:class:`PretrainedLm` for a decoder-only model, a :class:`PretrainedSeq2Seq` (also
``.encode``) for an encoder-decoder, as the model's ``is_encoder_decoder`` says.

``path`` is a Hugging Face model directory (config.json, safetensors, a tokenizer), a
paxlite job directory (its newest checkpoint), one of its step directories
(``<job>/checkpoints/<step>``), or a paxml checkpoint step (``<job>/checkpoints/
checkpoint_00001000``) together with the experiment it was trained with::

    from paxlite.pretrained.loading import from_pretrained

    lm = from_pretrained("/models/my-hf-model")                    # Hugging Face directory
    lm.generate(["The capital of France is"], max_new_tokens=8)    # -> [' Paris, ...']
    lm.save_pretrained("/tmp/my-hf-copy")                          # transformers loads it
    lm = from_pretrained("/tmp/paxlite_tiny")                      # paxlite job dir
    lm = from_pretrained("/tmp/hf_ft")             # an HfCausalLm job, with its tokenizer
    lm.generate(["The river"], max_new_tokens=8)                   # -> a list of new texts
    lm = from_pretrained("gs_copy/checkpoints/checkpoint_00000300",   # Pax checkpoint
                         exp="LmCloudSpmd2B")
    logits = lm.logits(ids)                      # ids [B, T] int -> [B, T, V] float32
    new = lm.generate(ids, max_new_tokens=16)    # [B, 16]; pad after a row's EOS

    s2s = from_pretrained("/tmp/encoder_decoder_job")            # an encoder-decoder's job
    logits = s2s.logits(ids, decoder_input_ids=dec)  # [B, S], [B, T] (0 first) -> [B, T, V]
    new = s2s.generate(ids, max_new_tokens=16)       # [B, 16] targets; pad after EOS

A paxlite job fine-tuned from a Hugging Face model (``tasks.lm.hf.HfCausalLm``, an
encoder-decoder from a Hugging Face directory) keeps that model's config and tokenizer
(``<job>/hf_model/``): loaded from the job (or a step of it), the model generates from texts
and ``save_pretrained`` writes it as Hugging Face's (a LoRA run's with ``merge=True``). A job
in a bucket gives no tokenizer (it reads local files): pass token ids.

A Hugging Face model needs no experiment: its family (``paxlite.formats.hf.models``) builds
it from config.json on all of this process's devices, its weights split over them (FSDP),
each device reading its own slice of the safetensors, in their dtype unless ``dtype`` says
otherwise. A paxlite or paxml checkpoint is placed as training placed it (the experiment's
mesh and logical-axis rules, on the first devices of this process). Any number of prompts
``B`` works on any mesh: the batch is padded with zero rows to what the mesh's batch axes
divide, and the padded rows are dropped from the results.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from etils import epath
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from paxlite.checkpoints import checkpoint_sources, init_from
from paxlite.checkpoints.checkpoint_sources import Kind
from paxlite.cli.overrides import resolve_experiment, resolve_experiment_class
from paxlite.experiments.base_experiment import PipelineLayout
from paxlite.experiments.registry import DEFAULT_SEARCH_PACKAGES
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.pretrained import adapters
from paxlite.pretrained.pretrained_models import (  # Re-exported: callers import them here.
    HfOrigin,
    Pretrained,
    PretrainedError,
    PretrainedLm,
    PretrainedSeq2Seq,
    pretrained_class,
)
from paxlite.runtime import attention_choice, job_record, platform_kernels, platforms, storage
from paxlite.runtime.mesh import create_mesh, mesh_size
from paxlite.train import trainable
from praxis_lite import config as config_lib
from praxis_lite.decoding import sampling
from praxis_lite.sharding import (
    FSDP_RULES,
    filter_rules_for_mesh,
    logical_shardings,
    strip_boxes,
)
from praxis_lite.tokenizers import hf_chat

__all__ = [
    "HfOrigin",
    "Pretrained",
    "PretrainedError",
    "PretrainedLm",
    "PretrainedSeq2Seq",
    "from_pretrained",
]


def from_pretrained(
    path: epath.PathLike,
    exp: str | None = None,
    overrides: Sequence[str] = (),
    dtype: Any = None,
    adapter: epath.PathLike | None = None,
    merge: bool = False,
) -> Pretrained:
    """Loads any checkpoint ``paxlite.checkpoints.checkpoint_sources`` reads (a Hugging Face model
    directory; a paxlite job, checkpoints or step dir; a paxml checkpoint step with ``exp``).

    Args:
      path: see the module docstring (a local path or gs://...; never a hub id: nothing
        is downloaded).
      exp: the experiment name (as ``--exp``); required for a paxml checkpoint, else read
        from the job's config.txt; not for a Hugging Face model.
      overrides: ``KNOB=VALUE`` strings, as for ``--set``; for a paxlite job they win over
        the placement knobs read from its config.txt (e.g. ``ICI_MESH_SHAPE=1,1,1``: one
        device), and only those and FPROP_DTYPE apply (any other is a PretrainedError).
      dtype: the model's weights and compute dtype (e.g. ``jnp.float32``), whatever the
        checkpoint; None: the checkpoint's (a paxlite job: as it trained; an override
        ``FPROP_DTYPE=...`` says the same and must agree).
      adapter: a PEFT LoRA adapter directory put on a Hugging Face model ``path`` (``path``
        may be the adapter itself when its ``base_model_name_or_path`` is a local model).
      merge: fold LoRA adapters (a PEFT adapter's, or a job's trained with LORA_RANK) into
        the base weights; by default they stay beside them, applied in each projection.

    Raises:
      PretrainedError: a hub id, a paxml checkpoint without ``exp``, a paxlite one whose
        job has no config files, ``exp``/``overrides`` with a Hugging Face model, an
        override a job's model cannot take.
      checkpoint_sources.CheckpointSourceError: nothing loadable at ``path``.
      hf_models.HfConfigError: a config.json paxlite cannot build.
      init_from.InitFromError: the weights are another model's (each difference named).
    """
    storage.configure()
    platforms.choose()  # When it is the first to touch JAX: no TPU probing on a host without.
    _refuse_hub_id(path)
    path = storage.job_path(path)  # A local path or gs://...
    kind = checkpoint_sources.identify(path)
    identified = {str(path): kind}  # Each path is identified once (the adapter's too).
    if kind.name == peft_adapter.PeftSource.kind:
        path, adapter = adapters.base_of(path), path
        kind = checkpoint_sources.identify(path)
        identified[str(path)] = kind
    if kind.name == hf_checkpoint.HfSource.kind:
        if exp is not None or overrides:
            raise PretrainedError(
                f"{path} is a Hugging Face model: its config.json says what to build; "
                "call from_pretrained(path) without exp= or overrides=."
            )
        adapter_dir = None if adapter is None else storage.job_path(adapter)
        return _from_hf(path, identified, dtype, adapter_dir, merge)
    if adapter is not None:
        raise PretrainedError(
            f"adapter= goes with a Hugging Face model directory; {path} is a {kind.name}."
        )
    described = kind.describes(path) if exp is None else None
    if described is not None:  # The checkpoint says what it holds (a T5X model dir's gin).
        if overrides:
            raise PretrainedError(
                f"{path} is a {kind.name} whose config says what to build; call "
                "from_pretrained(path) without overrides= (dtype= sets its dtype)."
            )
        return _from_described(path, kind, *described, dtype)
    return _from_checkpoint(path, kind, exp, overrides, merge, dtype)


def _from_described(
    path: epath.Path,
    kind: Kind,
    model_cfg: Any,
    generation: sampling.DecoderParams,
    dtype: Any,
) -> Pretrained:
    """A checkpoint that describes its own model, on all devices (its weights split over
    them, FSDP); in ``dtype`` when given."""
    _set_dtype(model_cfg, dtype)
    model = config_lib.instantiate(model_cfg)
    mesh, rules = _all_devices_fsdp()
    sources, kinds = {str(path): CheckpointLoadingRules()}, {str(path): kind}
    params = _load_params(model, sources, PipelineLayout(), mesh, rules, kinds=kinds)
    return pretrained_class(model)(model, params, generation, mesh, rules)


def _from_checkpoint(
    path: epath.Path,
    kind: Kind,
    exp: str | None,
    overrides: Sequence[str],
    merge: bool,
    dtype: Any,
) -> Pretrained:
    """A paxlite job's (its config.json's model; frozen weights from where the job started)
    or a paxml checkpoint's (``exp``'s model) weights, on the experiment's mesh; in ``dtype``
    (or an FPROP_DTYPE override) when given."""
    task_cfg, sources = None, {str(path): CheckpointLoadingRules()}
    kept: tuple[Any, HfOrigin | None, Any] = (None, None, None)
    given = {o.partition("=")[0].strip() for o in overrides}
    if exp is None:
        job_dir = checkpoint_sources.job_dir_of(path, kind)
        if job_dir is None:
            raise PretrainedError(
                f"{path} is a {kind.name}; name the experiment it was trained with: "
                "from_pretrained(path, exp='LmCloudSpmd2B')."
            )
        exp, mesh_knobs = _job_experiment(job_dir)
        _check_job_overrides(job_dir, given)
        overrides = [*(k for k in mesh_knobs if k.partition("=")[0] not in given), *overrides]
        task_cfg = config_lib.from_json((job_dir / "config.json").read_text())["task"]
        kept = _kept_hf(job_dir)
        start = job_record.frozen_start(job_dir)  # Frozen weights: where the job began.
        sources.update(
            {p: r for p, r in (start.rules if start else {}).items() if p not in sources}
        )
    if task_cfg is None:
        experiment = resolve_experiment(exp, list(overrides), DEFAULT_SEARCH_PACKAGES)
        task_cfg = experiment.task()
    else:  # The job's config.json is the model; the knobs only place it (data knobs unread).
        experiment = _placement_only(
            resolve_experiment_class(exp, list(overrides), DEFAULT_SEARCH_PACKAGES)
        )
        if "FPROP_DTYPE" in given:  # Not in config.json's model until set here.
            dtype = _one_dtype(dtype, experiment.FPROP_DTYPE)
    _set_dtype(task_cfg.model, dtype)
    mesh, rules = _mesh_and_rules(experiment)
    attention_choice.apply(task_cfg, experiment, list(mesh.devices.flat))  # This platform's.
    platform_kernels.apply(task_cfg, list(mesh.devices.flat))
    task = config_lib.instantiate(task_cfg)
    layout, kinds = experiment.pipeline_layout(), {str(path): kind}
    params = _load_params(task.model, sources, layout, mesh, rules, task.learner, kinds)
    model, settings = task.model, adapters.settings_in(task_cfg.model)
    if merge and settings is not None:
        model_cfg, params = adapters.merged(task_cfg.model, params, settings)
        model = config_lib.instantiate(model_cfg)
    return pretrained_class(model)(model, params, task.decoder_params(), mesh, rules, *kept)


def _kept_hf(job_dir: epath.Path) -> tuple[Any, HfOrigin | None, Any]:
    """``(tokenizer, origin, chat_template)`` of the Hugging Face model a job was fine-tuned
    from, as the job keeps its files (``job_record.HF_MODEL_DIR``); None for each it lacks
    (no tokenizer for a model from a config alone or a T5X checkpoint; nothing for a job of
    paxlite's own model). A job in a bucket gives no tokenizer or chat template: the
    tokenizer reads local files."""
    kept = job_dir / job_record.HF_MODEL_DIR
    origin = None
    if (kept / hf_models.CONFIG_FILE).is_file():
        config = hf_models.HfConfig.load(kept)
        generation_config = _json_fields(kept / hf_checkpoint.GENERATION_CONFIG_FILE)
        origin = HfOrigin(hf_models.family_of(config), config.fields, generation_config)
    tokenizer = None if storage.is_remote(kept) else _tokenizer_of(kept)
    chat_template = hf_chat.ChatTemplate.from_dir(kept) if tokenizer is not None else None
    return tokenizer, origin, chat_template


def _check_job_overrides(job_dir: epath.Path, given: set[str]) -> None:
    """PretrainedError naming each override a trained job's model cannot take: its
    config.json is the model, so only placement knobs and FPROP_DTYPE apply."""
    unused = sorted(given - {*_PLACEMENT_KNOBS, "FPROP_DTYPE"})
    if unused:
        raise PretrainedError(
            f"overrides {', '.join(unused)} cannot apply to {job_dir}'s trained model (its "
            f"config.json is the model); a job takes {', '.join(_PLACEMENT_KNOBS)} and "
            "FPROP_DTYPE (or dtype=)."
        )


def _one_dtype(dtype: Any, fprop_dtype: Any) -> Any:
    """The dtype asked for by ``dtype=`` and an FPROP_DTYPE override, which must agree."""
    if dtype is not None and jnp.dtype(dtype) != jnp.dtype(fprop_dtype):
        raise PretrainedError(
            f"dtype={jnp.dtype(dtype).name} and FPROP_DTYPE={jnp.dtype(fprop_dtype).name} "
            "disagree; give one."
        )
    return fprop_dtype


def _set_dtype(model_cfg: Any, dtype: Any) -> None:
    """``dtype`` (when given) as the model's weights' and computations' dtype, as for a
    Hugging Face directory; None leaves the checkpoint's run as it was trained."""
    if dtype is not None:
        config_lib.set_dtypes(model_cfg, dtype=jnp.dtype(dtype), fprop_dtype=jnp.dtype(dtype))


def _placement_only(cls: type) -> Any:
    """An instance of experiment ``cls`` for its mesh and rules alone: not validated, so
    knobs the job needed for its data (now absent) are not asked for."""
    return object.__new__(cls)


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _refuse_hub_id(path: epath.PathLike) -> None:
    """A PretrainedError for ``org/name`` that is no local path (paxlite downloads nothing)."""
    text = str(path)
    if _HUB_ID.fullmatch(text) and not epath.Path(text).exists():
        raise PretrainedError(
            f"{text!r} looks like a Hugging Face hub id and is no local directory; paxlite "
            f"downloads nothing: fetch it first (huggingface-cli download {text} --local-dir "
            "DIR) and pass DIR."
        )


def _from_hf(
    path: epath.Path,
    identified: dict[str, Kind],
    dtype: Any,
    adapter: epath.Path | None,
    merge: bool,
) -> Pretrained:
    """A Hugging Face model directory (with a PEFT adapter) on all devices, its weights
    split over them (FSDP)."""
    config = hf_models.HfConfig.load(path)
    family, model_cfg = hf_models.build_model(config)
    if dtype is None:
        source = hf_checkpoint.HfSource(path, None)
        dtype = max((v.dtype for v in source.variables().values()), key=lambda d: d.itemsize)
    config_lib.set_dtypes(model_cfg, dtype=jnp.dtype(dtype), fprop_dtype=jnp.dtype(dtype))
    settings = None
    if adapter is not None:
        adapters.check_base(adapter, path)
        settings = adapters.put_on(model_cfg, family, adapter)
    model = config_lib.instantiate(model_cfg)
    mesh, rules = _all_devices_fsdp()
    sources = {str(p): CheckpointLoadingRules() for p in (adapter, path) if p is not None}
    params = _load_params(model, sources, PipelineLayout(), mesh, rules, kinds=identified)
    _check_all_used(path, params)
    if adapter is not None:
        adapters.check_all_used(adapter, family.table, params)
        if merge:
            model_cfg, params = adapters.merged(model_cfg, params, settings)
            model = config_lib.instantiate(model_cfg)
    generation_config = _json_fields(path / hf_checkpoint.GENERATION_CONFIG_FILE)
    tokenizer = _tokenizer_of(path)
    generation = _hf_generation(generation_config, config.fields, tokenizer)
    origin = HfOrigin(family, config.fields, generation_config)
    chat_template = hf_chat.ChatTemplate.from_dir(path) if tokenizer is not None else None
    cls = pretrained_class(model)
    return cls(model, params, generation, mesh, rules, tokenizer, origin, chat_template)


def _all_devices_fsdp() -> tuple[Any, Any]:
    """A data-only mesh of all devices and the FSDP rules (weights split over them)."""
    devices = jax.devices()
    mesh = create_mesh((1, len(devices), 1), None, ("replica", "data", "mdl"), devices)
    return mesh, filter_rules_for_mesh(FSDP_RULES, mesh)


def _check_all_used(path: epath.Path, params: Any) -> None:
    """An InitFromError when the directory holds tensors the built model has no place for
    (a config field the family misread would leave some unread)."""
    source = hf_checkpoint.HfSource(path, None)
    flat = traverse_util.flatten_dict(params, sep="/")
    used = source.run_names({k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat.items()})
    unused = sorted(set(source.variables()) - set(used))
    if unused:
        raise init_from.InitFromError(
            f"{path} holds {len(unused)} tensors this model has no place for "
            f"({', '.join(unused[:8])}{' ...' if len(unused) > 8 else ''}); its config.json "
            "describes another model."
        )


def _json_fields(path: epath.Path) -> dict[str, Any]:
    """A JSON object file's fields; {} when there is no such file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def _tokenizer_of(path: epath.Path) -> Any:
    """The directory's tokenizer, or None when it has none."""
    from praxis_lite.tokenizers import hf_tokenizer

    names = (hf_tokenizer.TOKENIZER_JSON, *hf_tokenizer.SENTENCEPIECE_MODELS)
    if not any((path / name).is_file() for name in names):
        return None
    return hf_tokenizer.HfTokenizer.from_dir(path)


def _hf_generation(
    fields: dict[str, Any], config: dict[str, Any], tokenizer: Any
) -> sampling.DecoderParams:
    """generate's defaults as transformers takes them: generation_config.json, then
    config.json and the tokenizer for the special ids; ``top_k`` 50 when unset (it applies
    when sampling), the pad id falling back to the first EOS id."""

    def first(name: str) -> Any:
        for value in (fields.get(name), config.get(name), getattr(tokenizer, name, None)):
            if value is not None:
                return value
        return None

    eos = first("eos_token_id")
    eos = tuple(eos) if isinstance(eos, list) else eos
    pad = first("pad_token_id")
    if pad is None:
        pad = eos[0] if isinstance(eos, tuple) else (eos if eos is not None else 0)
    return sampling.DecoderParams(
        max_new_tokens=fields.get("max_new_tokens"),
        do_sample=bool(fields.get("do_sample", False)),
        temperature=float(fields.get("temperature", 1.0)),
        top_k=int(fields.get("top_k", 50)),
        top_p=float(fields.get("top_p", 1.0)),
        eos_token_id=eos,
        pad_token_id=int(pad),
        **hf_generation_settings(fields),
    )


#: generation_config.json's beam and control fields that generate takes, and their types.
_HF_GENERATION_FIELDS = {
    "num_beams": int,
    "length_penalty": float,
    "early_stopping": lambda v: v if v == "never" else bool(v),
    "num_return_sequences": int,
    "min_new_tokens": int,
    "repetition_penalty": float,
    "no_repeat_ngram_size": int,
    "stop_strings": lambda v: (v,) if isinstance(v, str) else tuple(v),
}


def hf_generation_settings(fields: dict[str, Any]) -> dict[str, Any]:
    """The beam search and logits-control defaults a generation_config.json sets
    (transformers' names; a missing or null field keeps transformers' default)."""
    return {
        name: convert(fields[name])
        for name, convert in _HF_GENERATION_FIELDS.items()
        if fields.get(name) is not None
    }


def _load_params(
    model: Any,
    sources: dict[str, CheckpointLoadingRules],
    layout: tuple[int, int],
    mesh: Any,
    rules: Any,
    learner: Any = None,
    kinds: dict[str, Kind] | None = None,
) -> Any:
    """The model's parameters from ``sources`` (path -> loading rules; the first that
    loads one wins), each read onto its sharding; all must be there. With ``learner``, the
    first is a job's checkpoint: the parameters it froze come from the others.

    ``layout``: the pipeline of a paxml checkpoint; ``kinds``: the sources already identified."""
    abstract, shardings = _abstract_params(model, mesh, rules)
    run_params = traverse_util.flatten_dict(
        jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
        ),
        sep="/",
    )
    load = dict(sources)
    if learner is not None:
        frozen = trainable.frozen_rules([f"params/{p}" for p in run_params], learner)
        load[next(iter(load))] = CheckpointLoadingRules(ignore_rules=frozen or None)
    layouts = dict.fromkeys(load, tuple(layout))
    with jax.set_mesh(mesh), init_from.opened(load, layouts, kinds=kinds) as entries:
        params = init_from.read_params(entries, run_params)
        missing = init_from.fresh_params(entries, run_params)
    if missing:
        raise init_from.InitFromError(
            f"{list(sources)[-1]} holds another model's weights: it lacks {len(missing)} of this "
            f"model's parameters ({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''})."
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
    boxed = jax.eval_shape(lambda b: model.init(jax.random.key(0), b), model.example_batch())
    boxed = boxed["params"]
    abstract = nn.unbox(boxed)
    shardings = jax.tree_util.tree_map(
        _fitting, abstract, strip_boxes(logical_shardings(boxed, mesh, rules))
    )
    return abstract, shardings


def _fitting(leaf: Any, sharding: NamedSharding) -> NamedSharding:
    """``sharding``, or replicated when a split dim does not divide by its devices (a
    Hugging Face model's sizes are its own: 2 KV heads do not split over 8 devices)."""
    for size, axes in zip(leaf.shape, sharding.spec, strict=False):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        if size % math.prod(sharding.mesh.shape[n] for n in names):
            return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding
