"""Mesh TensorFlow's T5 checkpoints as a registered checkpoint kind, and the T5 they hold.

A path is such a checkpoint when it is a prefix with its ``.index`` beside it
(``.../model.ckpt-1000000``, as T5X's ``INITIAL_CHECKPOINT_PATH`` takes it) or a directory
holding ``<name>-<step>.index`` files (its newest step, by its ``checkpoint`` state file, or
the step asked for). :class:`MtfSource` reads it onto a run's shardings a tensor at a time
(:mod:`bundle`): each tensor is read whole, once, every distinct device slice of it is
copied out and the tensor is let go; a scanned stack's ``[L, ...]`` array is filled layer
by layer. Never more than one of the checkpoint's tensors is held at once, beside the run's
arrays being filled.

Names are MTF's (:mod:`layout`); the optimizer's leaves are named as T5X names its own
(``state/step`` from ``global_step``, ``state/param_states/<name>/v_row|v_col|v`` from
``<name>_slot_vr|_slot_vc|_slot_v``), so T5X's reader's Adafactor conversion
(``paxlite.formats.t5x.checkpoint``) puts them into the run's optimizer state.

The model's sizes come from the tensors' shapes (:func:`t5_shape`): the vocabulary with its
padding, the heads from the relative bias, the blocks counted; the activation from the
operative config (:mod:`operative_config`), whose size macros must agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import PARAMS, CheckpointSourceError, Variable
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.mtf import bundle as tf_bundle
from paxlite.formats.mtf import layout as mtf_layout
from paxlite.formats.mtf import operative_config
from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.formats.t5x import gin as t5x_gin
from paxlite.runtime import storage
from praxis_lite import config as config_lib
from praxis_lite.decoding import sampling
from praxis_lite.models.t5 import T5Shape, t5_model

KIND = "mtf checkpoint"
_STEP = t5x_checkpoint.STATE + "step"
_BLOCK = re.compile(r"(encoder|decoder)/block_(\d+)/")
#: Every variable of an MTF T5 (T5X's importer's patterns), optionally with a slot suffix.
_KNOWN = re.compile(
    r"(shared/embedding|decoder/logits/kernel|(encoder|decoder)/(final_layer_norm|rms_norm)/scale"
    r"|(encoder|decoder)/block_\d+/layer_\d+/("
    r"(SelfAttention/(q|k|v|o|relative_attention_bias)|EncDecAttention/(q|k|v|o))"
    r"|DenseReluDense/(wi|wi_0|wi_1|wo)/kernel|(layer_norm|rms_norm)/scale))"
    r"(_slot_vr|_slot_vc|_slot_v)?"
)


def check_architecture(names: list[str], where: epath.Path) -> mtf_layout.Names:
    """How the checkpoint spells its T5 (:class:`mtf_layout.Names`).

    Raises:
      CheckpointSourceError: an architecture paxlite's T5 is not (MTF's decoder-only
        ``transformer/``, separate stack embeddings, a relative bias in every block), or
        variables it has no place for (named).
    """
    if any(n.startswith("transformer/") for n in names):
        raise CheckpointSourceError(
            f"{where} is MTF's decoder-only language model (transformer/...): paxlite reads "
            "MTF's encoder-decoder T5 (encoder/ and decoder/) only."
        )
    if any(re.match(r"(encoder|decoder)/embedding", n) for n in names):
        raise CheckpointSourceError(
            f"{where} has an embedding table per stack (encoder/embedding, decoder/embedding): "
            "paxlite's T5 shares one (shared/embedding)."
        )
    per_block = [
        n for n in names if n.endswith("relative_attention_bias") and "/block_000/" not in n
    ]
    if per_block:
        raise CheckpointSourceError(
            f"{where} has a relative attention bias in every block ({per_block[0]}; MTF's "
            "relative_attention_type='bias'): paxlite's T5 holds one per stack "
            "(T5's 'bias_shared', in block_000)."
        )
    unknown = sorted(n for n in names if n != mtf_layout.GLOBAL_STEP and not _KNOWN.fullmatch(n))
    if unknown:
        raise CheckpointSourceError(
            f"{where} holds variables paxlite's T5 has no place for: {', '.join(unknown[:3])}"
            f"{' ...' if len(unknown) > 3 else ''}."
        )
    norm = "rms_norm" if any("/layer_000/rms_norm/" in n for n in names) else "layer_norm"
    final = "rms_norm" if "encoder/rms_norm/scale" in names else "final_layer_norm"
    gated = any(n.endswith("/DenseReluDense/wi_0/kernel") for n in names)
    return mtf_layout.Names(norm, final, gated)


class MtfSource(t5x_checkpoint.T5xSource):
    """A Mesh TensorFlow T5 checkpoint opened for reading.

    Attributes:
      names: how it spells its T5; gated: its MLPs are gated.
    """

    kind = KIND
    embed_last: ClassVar[tuple[str, ...]] = ("/o", "/wo/kernel", mtf_layout.SHARED_EMBEDDING)

    def __init__(self, prefix: epath.Path, observer: checkpoint_sources.ReadObserver | None):
        self.path, self._observer, self.version = prefix, observer, None
        self._bundle = tf_bundle.Bundle(prefix)
        self.step = self._bundle.step
        try:
            self.names = check_architecture(list(self._bundle.variables), prefix)
        except CheckpointSourceError:
            self._bundle.close()
            raise
        self.gated = self.names.gated
        self._leaves = {}  # paxlite's name of each leaf -> TensorFlow's.
        for name in self._bundle.variables:
            self._leaves[_leaf_name(name)] = name
        self._stores = {}

    def _table(self) -> hf_layout.Table:
        return mtf_layout.mtf_table(self.names)

    @staticmethod
    def row_axis(shape: tuple[int, ...]) -> int:
        """MTF's Adafactor (``_factored_dims``: the two largest dims by a stable sort, ``vr``
        averaging the largest away) keeps the smaller dim in ``_slot_vr``, and of two equal
        dims the second: T5X's rule (:func:`t5x_checkpoint.t5x_row_axis`) keeps the first,
        so a square kernel's slots are T5X's swapped."""
        return 0 if shape[0] < shape[1] else 1

    def _variable(self, name: str) -> Variable:
        return self._bundle.variables[self._leaves[name]]

    def _tensor(self, name: str, observed: str) -> np.ndarray:
        """The whole tensor of leaf ``name`` (reported to the observer as ``observed``)."""
        values = self._bundle.tensor(self._leaves[name])
        if self._observer is not None:
            self._observer(observed, values.nbytes)
        return values

    def _reader(self, name: str, observed: str) -> hf_layout.SliceReader:
        def read(index: tuple[slice, ...]) -> np.ndarray:
            return self._tensor(name, observed)[index]

        return read

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        loaded = self.loaded_leaves(assigned, run_params)
        for path, where, names in sorted(self._leaf_parts(run_params), key=lambda x: x[0]):
            if path in loaded:
                sources = [assigned[n] for n in names]
                out[path] = self._filled(run_params[path], where, sources, path)
        return out

    def _filled(self, target: Any, where: Any, names: list[str], observed: str) -> jax.Array:
        """``target``'s array: each tensor of ``names`` (one per layer of a scanned stack)
        read whole once, its part of every distinct device slice copied out, then let go."""
        shape = tuple(target.shape)
        slices = _distinct_slices(target)
        buffers = {
            key: np.empty(_sliced_shape(index, shape), target.dtype)
            for key, index in slices.items()
        }
        for layer, name in enumerate(names):
            tensor = self._tensor(name, observed)
            for key, index in slices.items():
                _fill(buffers[key], where, shape, index, layer, tensor)
            del tensor
        return jax.make_array_from_callback(
            shape, target.sharding, lambda index: buffers[_slice_key(index, shape)]
        )

    def read_train_state(self, abstract: Any, *, opt_state: bool) -> dict[str, Any]:
        if _STEP not in self._leaves:
            raise CheckpointSourceError(
                f"{self.path} has no global_step; leave load_step and load_opt_states False for it."
            )
        return super().read_train_state(abstract, opt_state=opt_state)

    def close(self) -> None:
        self._bundle.close()


def _leaf_name(name: str) -> str:
    """paxlite's name of MTF variable ``name``: ``params/<name>``, the step and Adafactor's
    slots as T5X's reader names them."""
    if name == mtf_layout.GLOBAL_STEP:
        return _STEP
    for suffix, slot in mtf_layout.SLOTS.items():
        if name.endswith(suffix):
            return f"{t5x_checkpoint.SLOTS}{name[: -len(suffix)]}/{slot}"
    return PARAMS + name


def _slice_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))


def _distinct_slices(target: Any) -> dict[tuple[tuple[int, int], ...], tuple[slice, ...]]:
    """This process's devices' slices of ``target`` (devices holding the same slice share it)."""
    shape = tuple(target.shape)
    indices = target.sharding.addressable_devices_indices_map(shape).values()
    return {_slice_key(index, shape): index for index in indices}


def _sliced_shape(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape, strict=True))


def _fill(
    buffer: np.ndarray,
    where: hf_layout.Named,
    shape: tuple[int, ...],
    index: tuple[slice, ...],
    layer: int,
    tensor: np.ndarray,
) -> None:
    """Copies ``tensor``'s part of our slice ``index`` into ``buffer`` (layer ``layer`` of a
    scanned stack's slice, when in it)."""
    read = lambda part: tensor[part]  # noqa: E731
    if not where.stacked:
        buffer[...] = hf_layout.read_slice(where, shape, index, read)
        return
    layers = range(*index[0].indices(shape[0]))
    if layer in layers:
        buffer[layer - layers.start] = hf_layout.read_slice(where, shape[1:], index[1:], read)


# --- the T5 a checkpoint holds --------------------------------------------------------------


def t5_shape(variables: Mapping[str, Variable], config: Any, where: epath.Path) -> T5Shape:
    """The T5 whose variables these are (``config``: its operative config, or None).

    Raises:
      CheckpointSourceError: a variable the sizes need is missing, or the operative
        config's size macros disagree with the tensors (each named).
    """
    names = check_architecture(list(variables), where)

    def shape_of(name: str) -> tuple[int, ...]:
        if name not in variables:
            raise CheckpointSourceError(f"{where} has no {name}, which every MTF T5 has.")
        return variables[name].shape

    vocab, dims = shape_of(mtf_layout.SHARED_EMBEDDING)
    heads, buckets = shape_of(mtf_layout.RELATIVE_BIAS.format(stack="encoder"))
    joined = shape_of("encoder/block_000/layer_000/SelfAttention/q")[1]
    first = "wi_0" if names.gated else "wi"
    hidden = shape_of(f"encoder/block_000/layer_001/DenseReluDense/{first}/kernel")[1]
    blocks = {"encoder": 0, "decoder": 0}  # Each stack's blocks: its largest number + 1.
    for name in variables:
        found = _BLOCK.match(name)
        if found:
            stack = found.group(1)
            blocks[stack] = max(blocks[stack], int(found.group(2)) + 1)
    tied = mtf_layout.LOGITS not in variables
    if config is not None and config.tied_logits is False and tied:
        tied = False  # The config says the logits are their own: decoder/logits is missing.
    missing = [n for n in mtf_layout.expected_names(names, blocks, tied) if n not in variables]
    if missing:
        raise CheckpointSourceError(
            f"{where} lacks {len(missing)} of the variables an MTF T5 of its sizes has: "
            f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; the checkpoint is "
            "incomplete: copy it again."
        )
    activations = config.activations if config is not None else None
    if activations is None:  # T5 1.1 and mT5 are gated GELU; T5 1.0 ReLU.
        activations = ("gelu", "linear") if names.gated else ("relu",)
    shape = T5Shape(
        num_encoder_layers=blocks["encoder"],
        num_decoder_layers=blocks["decoder"],
        model_dims=dims,
        hidden_dims=hidden,
        num_heads=heads,
        dims_per_head=joined // heads,
        vocab_size=vocab,
        mlp_activations=activations,
        logits_via_embedding=tied,
        relative_buckets=buckets,
    )
    if config is not None:
        _check_sizes(shape, config)
    return shape


def _check_sizes(shape: T5Shape, config: operative_config.OperativeConfig) -> None:
    tensors = {
        "d_model": shape.model_dims,
        "d_ff": shape.hidden_dims,
        "d_kv": shape.dims_per_head,
        "num_heads": shape.num_heads,
    }
    differ = [
        f"{name} = {config.sizes[name]} (the tensors': {value})"
        for name, value in tensors.items()
        if name in config.sizes and config.sizes[name] != value
    ]
    layers = config.sizes.get("num_layers")
    if layers is not None and layers not in (shape.num_encoder_layers, shape.num_decoder_layers):
        differ.append(
            f"num_layers = {layers} (the tensors': {shape.num_encoder_layers} encoder, "
            f"{shape.num_decoder_layers} decoder blocks)"
        )
    if differ:
        raise CheckpointSourceError(
            f"{config.file} disagrees with the checkpoint's tensors: {'; '.join(differ)}; "
            "the checkpoint and its operative config are of different models."
        )


def prefix_of(path: epath.Path, step: int | None = None) -> epath.Path:
    """The checkpoint prefix ``path`` names (itself, or its directory's newest or ``step``).

    Raises:
      CheckpointSourceError: no such step.
    """
    if tf_bundle.is_prefix(path):
        if step is not None and step != tf_bundle.step_of(path):
            raise CheckpointSourceError(f"{path} is step {tf_bundle.step_of(path)}, not {step}.")
        return path
    found = tf_bundle.prefixes(path)
    if not found:
        what = "does not exist" if not path.exists() else "holds no <name>-<step>.index"
        raise CheckpointSourceError(
            f"{path} {what}: no Mesh TensorFlow checkpoint there (give its prefix, e.g. "
            ".../model.ckpt-1000000, or the directory holding it)."
        )
    chosen = tf_bundle.newest(path, found) if step is None else step
    return found[checkpoint_sources.pick_step(path, sorted(found), chosen)]


def shape_of_checkpoint(path: epath.PathLike) -> tuple[epath.Path, T5Shape]:
    """``(its operative config or its index, the T5 it holds)`` of checkpoint ``path``: its
    sizes from the index alone (no tensor is read).

    Raises:
      CheckpointSourceError: see :func:`t5_shape`; operative_config.OperativeConfigError.
    """
    prefix = prefix_of(storage.job_path(path))
    bundle = tf_bundle.Bundle(prefix)
    try:
        config = operative_config.read(prefix.parent)
        shape = t5_shape(bundle.variables, config, prefix)
    except operative_config.OperativeConfigError as e:
        raise CheckpointSourceError(str(e)) from None
    finally:
        bundle.close()
    described_by = config.file if config is not None else epath.Path(f"{prefix}{tf_bundle.INDEX}")
    return described_by, shape


def described(path: epath.Path) -> tuple[config_lib.Config, sampling.DecoderParams]:
    """The T5 the checkpoint holds (float32, plain stacks) and T5's decoding ids."""
    shape = shape_of_checkpoint(path)[1]
    return t5_model(shape, fprop_dtype=jnp.float32, scanned=False), t5x_gin.T5_DECODING


def recognises(path: epath.Path) -> bool:
    """Whether ``path`` is an MTF checkpoint prefix or a directory of them."""
    return tf_bundle.is_prefix(path) or bool(tf_bundle.prefixes(path))


def _open(path: epath.Path, step: int | None, layout: Any, observer: Any) -> MtfSource:
    return MtfSource(prefix_of(path, step), observer)


checkpoint_sources.register(
    checkpoint_sources.Kind(
        KIND,
        "<prefix>.index beside <prefix>.data-*, or a directory of them (a Mesh TensorFlow "
        "checkpoint: model.ckpt-<step>)",
        recognises,
        _open,
        described,
    )
)
