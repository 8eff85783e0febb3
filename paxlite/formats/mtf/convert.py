"""A Mesh TensorFlow T5 checkpoint converted to T5X's format or to a Hugging Face T5
directory, streaming: each tensor is read whole, put in the output's layout, written, and let
go.

Where each tensor goes is the name-and-layout tables': every parameter of paxlite's T5 of the
checkpoint's sizes has a place in MTF's table (:mod:`layout`) and one in the output's (T5X's
``paxlite.formats.t5x.layout``, Hugging Face's ``hf_layout.t5_table``); a tensor is read in
MTF's layout into ours (``hf_layout.read_slice``) and written in the output's
(``hf_layout.to_theirs``). Adafactor's slots go to T5X's ``param_states`` unchanged (T5X's
layout of them is MTF's), with T5X's ``(1,)`` placeholders for the slots a parameter lacks.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
from etils import epath
from flax import traverse_util

from paxlite.checkpoints.checkpoint_sources import PARAMS, Variable
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from paxlite.formats.mtf.checkpoint import MtfSource
from paxlite.formats.t5x import gin as t5x_gin
from paxlite.formats.t5x import layout as t5x_layout
from paxlite.formats.t5x.legacy_writer import LegacyStepWriter
from praxis_lite import config as config_lib
from praxis_lite.models.t5 import T5Shape, t5_model

_SLOT_NAMES = ("v_row", "v_col", "v")
_PLACEHOLDER = np.zeros((1,), np.float32)  # T5X's shape for a slot a parameter lacks.


@dataclasses.dataclass(frozen=True)
class Move:
    """One output tensor: where it is in MTF's checkpoint and in the output, and the shape
    of our parameter between the two."""

    mtf: hf_layout.Named
    theirs: hf_layout.Named
    our_shape: tuple[int, ...]


def our_shapes(shape: T5Shape, scanned: bool = False) -> dict[str, tuple[int, ...]]:
    """``{flat path: shape}`` of the parameters of paxlite's T5 of ``shape`` (plain stacks,
    or ``scanned``: each stack's layers in one ``[L, ...]`` array)."""
    model = config_lib.instantiate(t5_model(shape, scanned=scanned))
    init = lambda b: model.init(jax.random.key(0), b)  # noqa: E731
    boxed = jax.eval_shape(init, model.example_batch())["params"]
    flat = traverse_util.flatten_dict(boxed, sep="/")
    return {path: tuple(getattr(leaf, "value", leaf).shape) for path, leaf in flat.items()}


def moves(source: MtfSource, shape: T5Shape, table: hf_layout.Table) -> dict[str, Move]:
    """``{output name: Move}`` of every parameter of the checkpoint's T5 (tied tables once)."""
    ours = our_shapes(shape)
    in_mtf = hf_layout.their_names(source._table(), list(ours))  # noqa: SLF001
    in_output = hf_layout.their_names(table, list(ours))
    out = {}
    for path, our_shape in ours.items():
        out.setdefault(in_output[path].theirs, Move(in_mtf[path], in_output[path], our_shape))
    return out


def our_params(source: MtfSource, shape: T5Shape, dtype: np.dtype | None) -> dict[str, np.ndarray]:
    """``{flat path: host array}`` of paxlite's T5 of ``shape`` with scanned stacks (its
    experiments' layout) in ``dtype`` (or as stored): each MTF tensor read whole once and put
    in place; a stacked array is filled layer by layer. What it returns is the output: the
    model, once."""
    ours = our_shapes(shape, scanned=True)
    in_mtf = hf_layout.their_names(source._table(), list(ours))  # noqa: SLF001
    out = {}
    for path, our_shape in ours.items():
        where = in_mtf[path]
        names = where.layer_names(our_shape[0] if where.stacked else 1)
        stored = source.variables()[PARAMS + names[0]].dtype
        array = np.empty(our_shape, dtype or stored)
        layer_shape = our_shape[1:] if where.stacked else our_shape
        full = tuple(slice(0, n) for n in layer_shape)
        for layer, name in enumerate(names):
            tensor = source.read_whole(PARAMS + name)
            values = hf_layout.read_slice(where, layer_shape, full, lambda i, t=tensor: t[i])
            (array[layer] if where.stacked else array)[...] = values
            del tensor, values
        out[path] = array
    return out


def step_of(source: MtfSource) -> int:
    """The checkpoint's ``global_step`` (what T5X restores), else its prefix's step."""
    if "state/step" in source.state_variables():
        return int(source.read_whole("state/step"))
    return source.step


def _converted(source: MtfSource, move: Move, dtype: np.dtype | None) -> np.ndarray:
    """The output tensor of ``move``: MTF's tensor read whole, in the output's layout."""
    tensor = source.read_whole(PARAMS + move.mtf.theirs)
    full = tuple(slice(0, n) for n in move.our_shape)
    ours = hf_layout.read_slice(move.mtf, move.our_shape, full, lambda index: tensor[index])
    theirs = hf_layout.to_theirs(move.theirs.layout, ours)  # Views of the tensor, mostly.
    return np.ascontiguousarray(theirs, dtype=dtype or theirs.dtype)  # One copy at most.


def to_t5x(
    source: MtfSource, shape: T5Shape, output_dir: epath.Path, dtype: np.dtype | None
) -> epath.Path:
    """Writes T5X's ``checkpoint_<step>/`` (parameters in ``dtype``, or as stored; the
    step; Adafactor's slots) and a ``config.gin`` naming the T5 (``network.T5Config``) into
    ``output_dir``. Returns the step directory."""
    writer = LegacyStepWriter(output_dir, step_of(source))
    slots = _slots_by_param(source)
    for name, move in moves(source, shape, t5x_layout.t5x_table(shape.gated)).items():
        writer.write(f"target/{name}", _converted(source, move, dtype))
        if slots:  # T5X's slots: MTF's; placeholders for the rest.
            have = _t5x_slots(slots.get(move.mtf.theirs, {}), source, move.mtf.theirs)
            for slot in (*_SLOT_NAMES, "m"):
                key = f"state/param_states/{name}/{slot}"
                if slot in have:
                    writer.write(key, source.read_whole(have[slot]))
                else:
                    writer.inline(key, _PLACEHOLDER)
    writer.finish()
    (output_dir / t5x_gin.CONFIG_GIN).write_text(t5x_gin.t5_config_text(shape))
    return writer.step_dir


def _t5x_slots(have: dict[str, str], source: MtfSource, name: str) -> dict[str, str]:
    """T5X's slot -> the MTF leaf holding it: MTF's as they are, but a square kernel's factors
    swapped (of two equal dims MTF's ``_slot_vr`` keeps the second, T5X's ``v_row`` the first;
    T5X's own importer copies them unchanged)."""
    shape = source.variables()[PARAMS + name].shape
    if "v_row" in have and "v_col" in have and len(shape) == 2 and shape[0] == shape[1]:
        return {**have, "v_row": have["v_col"], "v_col": have["v_row"]}
    return have


def _slots_by_param(source: MtfSource) -> dict[str, dict[str, str]]:
    """``{MTF parameter: {T5X slot: leaf name}}`` of the checkpoint's Adafactor slots."""
    prefix = "state/param_states/"
    out: dict[str, dict[str, str]] = {}
    for leaf in source.state_variables():
        if leaf.startswith(prefix):
            param, _, slot = leaf[len(prefix) :].rpartition("/")
            out.setdefault(param, {})[slot] = leaf
    return out


def to_hf(
    source: MtfSource,
    shape: T5Shape,
    output_dir: epath.Path,
    dtype: np.dtype | None,
    sentencepiece_model: epath.Path | None,
    max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Writes a ``T5ForConditionalGeneration`` directory transformers loads: config.json,
    safetensors (one file, or shards of ``max_shard_bytes`` and an index; a tensor at a time),
    generation_config.json and, when given, the SentencePiece model as ``spiece.model``.
    Returns the files written."""
    output_dir.mkdir(parents=True, exist_ok=True)
    planned = moves(source, shape, hf_layout.t5_table(shape.gated))
    stored = {n: source.variables()[PARAMS + m.mtf.theirs].dtype for n, m in planned.items()}
    written = {
        name: Variable(_their_shape(move), np.dtype(dtype or stored[name]))
        for name, move in planned.items()
    }
    files = hf_checkpoint.write_tensors(
        output_dir, written, lambda name: _converted(source, planned[name], dtype), max_shard_bytes
    )
    config = hf_models.t5_config(shape)
    config["dtype"] = np.dtype(dtype or next(iter(stored.values()))).name
    (output_dir / hf_models.CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: config[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id")}
    generation_file = output_dir / hf_checkpoint.GENERATION_CONFIG_FILE
    generation_file.write_text(json.dumps(generation, indent=2) + "\n")
    files += [hf_models.CONFIG_FILE, hf_checkpoint.GENERATION_CONFIG_FILE]
    if sentencepiece_model is not None:
        sentencepiece_model.copy(output_dir / "spiece.model", overwrite=True)
        files.append("spiece.model")
    return files


def _their_shape(move: Move) -> tuple[int, ...]:
    return hf_layout.their_shape(move.theirs, move.our_shape)


#: The sizes a gin file's model must share with the checkpoint.
_SIZES = (
    "num_encoder_layers",
    "num_decoder_layers",
    "model_dims",
    "hidden_dims",
    "num_heads",
    "dims_per_head",
    "vocab_size",
    "mlp_activations",
    "logits_via_embedding",
)


def gin_model_mismatches(gin_shape: T5Shape, shape: T5Shape) -> list[str]:
    """Each size of a gin file's T5 (T5X's ``convert_checkpoint.model``) that the
    checkpoint's tensors do not have (T5X's own check: a shape mismatch per variable)."""
    return [
        f"{f} {getattr(gin_shape, f)!r} (the checkpoint's {getattr(shape, f)!r})"
        for f in _SIZES
        if getattr(gin_shape, f) != getattr(shape, f)
    ]


def described(shape: T5Shape) -> str:
    """The T5 of ``shape`` in a few words, for the console."""
    return (
        f"T5 {shape.num_encoder_layers}+{shape.num_decoder_layers} blocks, d_model "
        f"{shape.model_dims}, {shape.num_heads} heads x {shape.dims_per_head}, d_ff "
        f"{shape.hidden_dims} {'/'.join(shape.mlp_activations)}, vocab {shape.vocab_size}"
    )
