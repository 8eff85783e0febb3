"""PEFT's LoRA adapter directories: read onto a run's adapters, and written from them.

A directory is recognised by ``adapter_config.json`` beside ``adapter_model.safetensors``.
PEFT names each adapted module by its place in the Hugging Face model
(``base_model.model.model.layers.0.self_attn.q_proj``) and stores ``lora_A.weight
[r, in]`` and ``lora_B.weight [out, r]`` (torch's Linear layout, GPT-2's Conv1D modules
included: its ``fan_in_fan_out`` only says how the base weight is stored). Our adapters
(``praxis_lite.layers.lora``) are ``X_lora_a [in..., r]`` and ``X_lora_b [r, out...]``
beside their base weight ``X``; the family's name-and-layout table
(``paxlite.formats.hf.layout``) names ``X``'s module, and ``in``/``out`` flatten ours in
Hugging Face's order (heads, then dims per head). A fused module (GPT-2's ``c_attn``) has
one A and one B for q, k and v: ours is the shared ``w_qkv_lora_a`` with the parts of B.

Variables are PEFT's tensor names with ``/`` for ``.`` after ``params/``, as the loading
rules read names; a run's adapters are named the same way (:meth:`PeftSource.run_names`),
its other parameters not at all, so ``--init_from`` of an adapter loads the adapters and
another checkpoint (the base model) the rest.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import PARAMS, Variable
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from praxis_lite.layers import lora
from praxis_lite.layers.lora_targets import FEED_FORWARD_TARGETS

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
#: What PEFT puts before a module's name in the model (``PeftModelForCausalLM``).
PEFT_PREFIX = "base_model.model."
ALL_LINEAR = "all-linear"
#: PEFT's default ``target_modules`` of each family (its own table), else q and v.
_DEFAULT_MODULES = {"gpt2": ("c_attn",)}
_QV = ("q_proj", "v_proj")
#: Our weight (a table row's path ends so) -> the layer's LoRA target name.
_TARGET_OF_WEIGHT = {
    "self_attention/w_q": "query",
    "self_attention/w_k": "key",
    "self_attention/w_v": "value",
    "self_attention/w_post": "post",
    "ff_layer/ffn_layer1/w": "ffn_layer1",
    "ff_layer/ffn_layer1_gate/w": "ffn_layer1_gate",
    "ff_layer/ffn_layer2/w": "ffn_layer2",
}
_FUSED_TARGET = "qkv"
#: Conv1D layouts: a family whose adapted weights are stored so has ``fan_in_fan_out``.
_CONV_LAYOUTS = (
    hf_layout.Layout.COPY,
    hf_layout.Layout.CONV_HEADS_IN,
    hf_layout.Layout.CONV_HEADS_OUT,
)


class PeftError(ValueError):
    """An adapter directory or setting paxlite cannot take (the message says why)."""


# --- module names ------------------------------------------------------------------------


def module_targets(table: hf_layout.Table) -> dict[str, tuple[str, ...]]:
    """``{Hugging Face module name: our layers' LoRA targets}`` of a family's table
    (``{'q_proj': ('query',), 'c_attn': ('qkv',), 'c_proj': ('post', 'ffn_layer2')}``)."""
    out: dict[str, tuple[str, ...]] = {}
    for row in table:
        target = next((t for w, t in _TARGET_OF_WEIGHT.items() if row.ours.endswith(w)), None)
        if target is None:
            continue
        module = row.theirs.split(".")[-2]
        target = _FUSED_TARGET if row.parts > 1 else target
        if target not in out.get(module, ()):
            out[module] = (*out.get(module, ()), target)
    return out


def default_modules(family: hf_models.Family) -> tuple[str, ...]:
    """PEFT's ``target_modules`` for the family when none are given."""
    return _DEFAULT_MODULES.get(family.model_type, _QV)


def lora_targets(family: hf_models.Family, modules: Sequence[str]) -> tuple[str, ...]:
    """Our LoRA targets for PEFT's ``target_modules`` (``all-linear``: every projection of
    the blocks, never the output head; empty: the family's default).

    Raises:
      PeftError: a module name the family does not have; a feed-forward module (or
        ``all-linear``) of a mixture-of-experts family.
    """
    names = module_targets(family.table)
    modules = list(modules) or list(default_modules(family))
    if family.mixture_of_experts:
        names = _refuse_moe_feed_forwards(family, modules, names)
    if modules == [ALL_LINEAR]:
        modules = list(names)
    unknown = [m for m in modules if m not in names]
    if unknown:
        raise PeftError(
            f"{family.model_type} has no module {', '.join(map(repr, unknown))} to adapt; its "
            f"projections are {', '.join(names)} (or {ALL_LINEAR})."
        )
    return tuple(dict.fromkeys(t for m in modules for t in names[m]))


def _refuse_moe_feed_forwards(
    family: hf_models.Family, modules: Sequence[str], names: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """The attention modules of a mixture-of-experts family's ``names``; a PeftError for
    LoRA on its feed-forwards (experts, router, shared expert, dense layers), which paxlite
    does not adapt yet (``all-linear`` would include some)."""
    attention = {
        m: targets for m, targets in names.items() if not set(targets) & set(FEED_FORWARD_TARGETS)
    }
    in_table = {row.theirs.rsplit(".", 2)[-2] for row in family.table}
    feed_forward = [m for m in modules if m == ALL_LINEAR or (m in in_table and m not in attention)]
    if feed_forward:
        raise PeftError(
            f"LoRA on {family.model_type}'s feed-forwards (its experts, router, shared expert "
            f"and dense layers; asked: {', '.join(feed_forward)}) is not implemented yet; adapt "
            f"the attention projections: {', '.join(attention)}."
        )
    return attention


def fan_in_fan_out(family: hf_models.Family) -> bool:
    """Whether the family's projections are Conv1D (``[in, out]``: GPT-2's)."""
    return any(
        row.layout in _CONV_LAYOUTS and row.ours.endswith(w)
        for row in family.table
        for w in _TARGET_OF_WEIGHT
    )


# --- adapter_config.json -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """The fields of PEFT's ``LoraConfig`` that paxlite reads and writes."""

    rank: int
    alpha: float
    dropout: float = 0.0
    use_rslora: bool = False
    target_modules: tuple[str, ...] = ()
    base_model_name_or_path: str | None = None
    fan_in_fan_out: bool = False

    @classmethod
    def load(cls, directory: epath.PathLike) -> AdapterConfig:
        """The directory's adapter_config.json.

        Raises:
          PeftError: not a LoRA adapter, or one with settings paxlite has no layer for.
        """
        path = epath.Path(directory) / CONFIG_FILE
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise PeftError(f"{path} is no adapter config ({e}).") from None
        if fields.get("peft_type", "LORA") != "LORA":
            raise PeftError(f"{path}: peft_type {fields['peft_type']!r}; paxlite reads LoRA only.")
        _refuse_unsupported(path, fields)
        targets = fields.get("target_modules") or ()
        return cls(
            rank=int(fields["r"]),
            alpha=float(fields.get("lora_alpha", 8)),
            dropout=float(fields.get("lora_dropout") or 0.0),
            use_rslora=bool(fields.get("use_rslora", False)),
            target_modules=(targets,) if isinstance(targets, str) else tuple(sorted(targets)),
            base_model_name_or_path=fields.get("base_model_name_or_path"),
            fan_in_fan_out=bool(fields.get("fan_in_fan_out", False)),
        )

    def to_json(self) -> str:
        """PEFT's adapter_config.json for these settings."""
        fields = {
            "base_model_name_or_path": self.base_model_name_or_path,
            "bias": "none",
            "fan_in_fan_out": self.fan_in_fan_out,
            "inference_mode": True,
            "init_lora_weights": True,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "modules_to_save": None,
            "peft_type": "LORA",
            "r": self.rank,
            "target_modules": sorted(self.target_modules),
            "task_type": "CAUSAL_LM",
            "use_dora": False,
            "use_rslora": self.use_rslora,
        }
        return json.dumps(fields, indent=2, sort_keys=True) + "\n"


def _refuse_unsupported(path: epath.Path, fields: Mapping[str, Any]) -> None:
    """PeftError for settings that would change the numbers in ways paxlite's adapters do not."""
    unsupported = {
        "use_dora": fields.get("use_dora"),
        "rank_pattern": fields.get("rank_pattern"),
        "alpha_pattern": fields.get("alpha_pattern"),
        "modules_to_save": fields.get("modules_to_save"),
        "layers_to_transform": fields.get("layers_to_transform"),
        "lora_bias": fields.get("lora_bias"),
    }
    if fields.get("bias", "none") != "none":
        unsupported["bias"] = fields["bias"]
    used = {k: v for k, v in unsupported.items() if v}
    if used:
        raise PeftError(
            f"{path}: {', '.join(f'{k}={v!r}' for k, v in used.items())} is not supported "
            "(paxlite's adapters are plain LoRA on whole projections); merge it with peft first."
        )


def is_adapter_dir(path: epath.Path) -> bool:
    """Whether ``path`` holds a PEFT adapter (its config beside its safetensors)."""
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


#: config.json fields whose values make two base models different ones for an adapter.
_BASE_IDENTITY = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)


def check_base(adapter_dir: epath.Path, adapter: AdapterConfig, base_dir: epath.Path) -> str | None:
    """Checks the base model ``base_dir`` given for an adapter against the one it records
    (``base_model_name_or_path``).

    Returns a warning when the recorded base is a name paxlite cannot open (a hub id)
    unlike ``base_dir``'s name (lower case, letters and digits only), None otherwise.

    Raises:
      PeftError: the recorded base is a local model directory whose config.json differs
        from ``base_dir``'s (model type or sizes): another model.
    """
    recorded = adapter.base_model_name_or_path
    if not recorded:
        return None
    recorded_dir = epath.Path(recorded)
    if not (base_dir / hf_models.CONFIG_FILE).is_file():
        return None  # Not a model directory: whatever opens it says so.
    if (recorded_dir / hf_models.CONFIG_FILE).is_file():
        theirs, ours = _identity(recorded_dir), _identity(base_dir)
        differ = [  # A field one config leaves out (derived from others) is not compared.
            f"{k} {theirs[k]} vs {ours[k]}"
            for k in _BASE_IDENTITY
            if None not in (theirs[k], ours[k]) and theirs[k] != ours[k]
        ]
        if differ:
            raise PeftError(
                f"{adapter_dir} adapts {recorded}, but the base model given, {base_dir}, is "
                f"another model ({'; '.join(differ)}); give the base it was trained on."
            )
        return None
    if _name_key(recorded_dir.name) != _name_key(base_dir.name):
        return (
            f"{adapter_dir} was trained on {recorded!r} (its base_model_name_or_path) and is "
            f"put on {base_dir}: check that they are the same model (paxlite cannot open "
            f"{recorded!r} to compare)."
        )
    return None


def _identity(model_dir: epath.Path) -> dict[str, Any]:
    try:
        fields = json.loads((model_dir / hf_models.CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return dict.fromkeys(_BASE_IDENTITY)  # Unreadable: nothing to compare.
    return {k: fields.get(k) for k in _BASE_IDENTITY} if isinstance(fields, dict) else {}


def _name_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# --- our adapters in PEFT's tensors -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where one of our adapter variables is in PEFT's tensors: ``matrix`` (``lora_A`` or
    ``lora_B``) of ``module`` (with ``{}`` for the layer when ``stacked``), part ``part`` of
    ``parts`` along B's rows (a fused module)."""

    module: str
    matrix: str
    part: int = 0
    parts: int = 1
    stacked: bool = False

    def names(self, num_layers: int) -> list[str]:
        """PEFT's tensor names, one per layer (one when not stacked)."""
        name = f"{PEFT_PREFIX}{self.module}.{self.matrix}.weight"
        return [name.format(i) for i in range(num_layers)] if self.stacked else [name]

    def their_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
        """The PEFT tensor's shape for our ``ours`` (one layer's): ``[r, in]`` or ``[out, r]``."""
        if self.matrix == "lora_A":
            return (ours[-1], int(np.prod(ours[:-1])))
        return (self.parts * int(np.prod(ours[1:])), ours[0])

    def to_ours(self, theirs: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
        """One layer of ours (shape ``ours``) from PEFT's whole tensor."""
        if self.matrix == "lora_A":
            return theirs.T.reshape(ours)
        rows = int(np.prod(ours[1:]))
        return theirs[self.part * rows : (self.part + 1) * rows].T.reshape(ours)

    def to_theirs(self, ours: np.ndarray) -> np.ndarray:
        """One layer of ours as PEFT's tensor (one part of it for a fused module)."""
        if self.matrix == "lora_A":
            return ours.reshape(-1, ours.shape[-1]).T
        return ours.reshape(ours.shape[0], -1).T


def _places(table: hf_layout.Table, paths: Sequence[str]) -> dict[str, _Place]:
    """``{our adapter path: its place}`` for each of ``paths`` the table names the base of."""
    bases = {}
    for path in paths:
        if not re.match(lora.ADAPTER_PATTERN, path):
            continue
        weight = path[: -len(lora.LORA_A)]  # LORA_A and LORA_B are as long.
        scope, _, name = weight.rpartition("/")
        if name in lora.SHARED_A:  # One A for several weights: their module's.
            weight = f"{scope}/{lora.SHARED_A[name][0]}"
        bases[path] = weight
    named = hf_layout.their_names(table, sorted(set(bases.values())))
    places = {}
    for path, weight in bases.items():
        where = named.get(weight)
        if where is None:
            continue
        module = where.theirs.rsplit(".", 1)[0]  # Without ".weight".
        if path.endswith(lora.LORA_A):
            places[path] = _Place(module, "lora_A", stacked=where.stacked)
        else:
            places[path] = _Place(module, "lora_B", where.part, where.parts, where.stacked)
    return places


def _table_of(names: Sequence[str]) -> hf_layout.Table:
    """The table of the first family whose modules include every module ``names`` adapt.

    Raises:
      PeftError: no family has them all.
    """
    modules = {n[len(PEFT_PREFIX) :].rsplit(".", 2)[0] for n in names}
    for family in hf_models.FAMILIES.values():
        patterns = [
            re.escape(row.theirs.rsplit(".", 1)[0])
            .replace(r"\{\}", r"\d+")
            .replace(r"\{expert\}", r"\d+")
            for row in family.table
        ]
        if all(any(re.fullmatch(p, m) for p in patterns) for m in modules):
            if family.mixture_of_experts:
                kinds = {m.rsplit(".", 1)[-1] for m in modules}
                _refuse_moe_feed_forwards(family, sorted(kinds), module_targets(family.table))
            return family.table
    raise PeftError(
        f"the adapter's modules ({', '.join(sorted(modules)[:4])} ...) are no family's paxlite "
        f"knows ({', '.join(hf_models.FAMILIES)})."
    )


class PeftSource(checkpoint_sources.PartsSource):
    """A PEFT LoRA adapter directory opened for reading.

    Attributes:
      config: its adapter_config.json; table: the family table its module names follow.
    """

    kind = "peft adapter"

    def __init__(self, directory: epath.Path, table: hf_layout.Table | None = None):
        self.path, self.step = directory, 0
        self.config = AdapterConfig.load(directory)
        self._file = hf_checkpoint.open_safetensors(directory / WEIGHTS_FILE)
        self._stored = list(self._file.keys())  # noqa: SIM118 (no __iter__)
        self.table = table if table is not None else _table_of(self._stored)

    def variables(self) -> dict[str, Variable]:
        out = {}
        for name in self._stored:
            tensor = self._file.get_slice(name)
            dtype = np.dtype(self._file.get_tensor(name).dtype)
            out[_variable_name(name)] = Variable(tuple(tensor.get_shape()), dtype)
        return out

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        out = {}
        for path, place, names in self._leaf_parts(run_params):
            ours = tuple(run_params[path].shape)[1 if place.stacked else 0 :]
            variable = Variable(place.their_shape(ours), np.dtype(run_params[path].dtype))
            out.update(dict.fromkeys(names, variable))
        return out

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        loaded = self.loaded_leaves(assigned, run_params)
        out = {}
        for path, place, names in self._leaf_parts(run_params):
            if path not in loaded:
                continue
            target = run_params[path]
            ours = tuple(target.shape)[1 if place.stacked else 0 :]
            layers = [
                place.to_ours(self._file.get_tensor(_stored_name(assigned[n])), ours) for n in names
            ]
            whole = (np.stack(layers) if place.stacked else layers[0]).astype(target.dtype)
            out[path] = checkpoint_sources.sharded_array(target, lambda index, w=whole: w[index])
        return out

    def _leaf_parts(self, run_params: Mapping[str, Any]) -> list[tuple[str, _Place, list[str]]]:
        """``(our adapter path, its place, its variable names: one per layer when stacked)``."""
        out = []
        for path, place in sorted(_places(self.table, list(run_params)).items()):
            layers = run_params[path].shape[0] if place.stacked else 1
            out.append((path, place, [_variable_name(n) for n in place.names(layers)]))
        return out


def _variable_name(name: str) -> str:
    return PARAMS + name.replace(".", "/")


def _stored_name(variable: str) -> str:
    return variable[len(PARAMS) :].replace("/", ".")


def _open(path: epath.Path, step: int | None, layout: Any, observer: Any) -> PeftSource:
    del layout, observer  # Adapters are small: each is read whole, then placed.
    if step is not None:
        raise checkpoint_sources.CheckpointSourceError(
            f"{path} is a PEFT adapter (one set of weights, no steps); leave the step unset."
        )
    return PeftSource(path)


checkpoint_sources.register(
    checkpoint_sources.Kind(
        PeftSource.kind, f"{CONFIG_FILE} beside {WEIGHTS_FILE}", is_adapter_dir, _open
    )
)


# --- writing -----------------------------------------------------------------------------


def save(
    directory: epath.PathLike,
    params: Mapping[str, np.ndarray],
    family: hf_models.Family,
    config: AdapterConfig,
) -> list[str]:
    """Writes the adapters among ``params`` (our flat paths -> host arrays) as a PEFT
    adapter directory of ``config``; returns the files written.

    Raises:
      PeftError: no adapters, or one the family's table has no module for.
    """
    adapters = {p: np.asarray(v) for p, v in params.items() if re.match(lora.ADAPTER_PATTERN, p)}
    places = _places(family.table, list(adapters))
    unplaced = sorted(set(adapters) - set(places))
    if not adapters or unplaced:
        raise PeftError(
            f"no PEFT module for {', '.join(unplaced)}" if unplaced else "the run has no adapters"
        )
    parts: dict[str, list[tuple[int, np.ndarray]]] = {}
    for path, place in places.items():
        layers = list(adapters[path]) if place.stacked else [adapters[path]]
        for name, layer in zip(place.names(len(layers)), layers, strict=True):
            parts.setdefault(name, []).append((place.part, place.to_theirs(layer)))
    tensors = {
        name: np.ascontiguousarray(np.concatenate([a for _, a in sorted(p, key=lambda x: x[0])]))
        for name, p in parts.items()
    }
    directory = epath.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    planned = {name: Variable(t.shape, t.dtype) for name, t in tensors.items()}
    # Not safetensors' save_file: its file is 0600 whatever the umask; this one honours it.
    hf_checkpoint.write_safetensors(directory / WEIGHTS_FILE, planned, tensors.__getitem__)
    (directory / CONFIG_FILE).write_text(config.to_json())
    return [WEIGHTS_FILE, CONFIG_FILE]
