"""Hugging Face model directories: safetensors read onto a run's shardings, and written.

A directory is recognised by its ``config.json`` beside ``model.safetensors`` or
``model.safetensors.index.json`` (sharded: the index maps each tensor to its file). Its
variables are Hugging Face's names, ``/`` for ``.`` as loading rules read names
(``params/model/layers/0/self_attn/q_proj/weight``); the family's table
(``paxlite.formats.hf.layout``) names a run's parameters the same way. Each device's
slice is read by itself with safetensors' ``get_slice``, in the layout
``hf_layout.read_slice`` works out, and cast to the run's dtype: never a whole array on
one host.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np
from etils import epath
from safetensors import SafetensorError, safe_open

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import PARAMS, Variable
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from paxlite.formats.layout_source import LayoutSource

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG_FILE = "generation_config.json"
#: transformers 5's ``save_pretrained`` default ``max_shard_size`` ("50GB"; 4.x's was
#: "5GB"): above it, shards.
DEFAULT_MAX_SHARD_BYTES = 50 * 10**9

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
}


class HfSource(LayoutSource):
    """A Hugging Face model directory opened for reading (its config.json and safetensors).

    Attributes:
      config: the model's config.json; family: its family (names and layouts).
    """

    kind = "hugging face model"

    def __init__(self, directory: epath.Path, observer: checkpoint_sources.ReadObserver | None):
        self.path, self.step, self._observer = directory, 0, observer
        self.config = hf_models.HfConfig.load(directory)
        self.family = hf_models.family_of(self.config)
        self._file_of = _tensor_files(directory)
        # Variable name (the family's spelling) -> the stored tensor; buffers left out.
        self._name_of = {}
        for stored in self._file_of:
            name = self.family.canonical_name(stored)
            if name is not None:
                self._name_of[_variable_name(name)] = stored
        self._open: dict[str, Any] = {}

    def variables(self) -> dict[str, Variable]:
        out = {}
        for name, stored in self._name_of.items():
            tensor = self._tensor(stored)
            dtype = _dtype(tensor.get_dtype(), stored, self.path / self._file_of[stored])
            out[name] = Variable(tuple(tensor.get_shape()), dtype)
        return out

    def unreadable(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> list[str]:
        """Raises, in one line, for a leaf the rules load of which the directory holds only
        some tensors (an expert of a layer missing, say); otherwise the parts' problems
        (``PartsSource``)."""
        missing = []
        for _, _, names in self._leaf_parts(run_params):
            if any(n in assigned for n in names):
                missing += [n for n in names if n not in self._name_of]
        if missing:
            names = [n[len(PARAMS) :].replace("/", ".") for n in missing]
            raise checkpoint_sources.CheckpointSourceError(
                f"{self.path} holds only some tensors of a parameter; it lacks {len(names)} "
                f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}): an interrupted "
                "download? Download the safetensors again."
            )
        return super().unreadable(assigned, run_params)

    def read(self, assigned: Mapping[str, str], run_params: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        loaded = self.loaded_leaves(assigned, run_params)
        for path, where, names in sorted(self._leaf_parts(run_params), key=lambda x: x[0]):
            if path in loaded:
                stored = [self._name_of[assigned[n]] for n in names]
                out[path] = self._read_leaf(path, stored, where, run_params[path])
        return out

    def _leaf_parts(self, run_params: Mapping[str, Any]) -> list[tuple[str, Any, list[str]]]:
        """``(our path, where it is, its variable names: one per layer when stacked and per
        expert)``."""
        named = hf_layout.their_names(self.family.table_of(self.config.fields), list(run_params))
        return [
            (path, where, [_variable_name(n) for n in where.tensor_names(run_params[path].shape)])
            for path, where in named.items()
        ]

    def close(self) -> None:
        self._open.clear()

    def _tensor(self, name: str) -> Any:
        """safetensors' lazy slice of tensor ``name`` (its file opened once)."""
        file = self._file_of[name]
        if file not in self._open:
            self._open[file] = open_safetensors(self.path / file)
        return self._open[file].get_slice(name)

    def _read_leaf(self, path: str, stored: list[str], where: hf_layout.Named, target: Any) -> Any:
        """Our leaf ``path`` on ``target``'s sharding and dtype, from their tensors ``stored``
        (one, or one per layer of a scanned stack and per expert)."""

        def read_tensor(i: int) -> hf_layout.SliceReader:
            tensor = self._tensor(stored[i])
            file = self.path / self._file_of[stored[i]]
            itemsize = _dtype(tensor.get_dtype(), stored[i], file).itemsize

            def read(index: tuple[slice, ...]) -> np.ndarray:
                values = tensor[index]
                if self._observer is not None:
                    self._observer(path, values.size * itemsize)
                return values

            return read

        def read_ours(index: tuple[slice, ...]) -> np.ndarray:
            values = hf_layout.read_stacked(where, tuple(target.shape), index, read_tensor)
            return values.astype(target.dtype)

        return checkpoint_sources.sharded_array(target, read_ours)


def _variable_name(name: str) -> str:
    """Hugging Face's tensor ``name`` as a variable name (``params/``, ``/`` for ``.``)."""
    return PARAMS + name.replace(".", "/")


def _dtype(name: str, tensor: str, file: epath.Path) -> np.dtype:
    """numpy's dtype of safetensors' dtype ``name`` (of ``tensor`` in ``file``, for the
    message when paxlite cannot hold it: quantized or 8-bit weights)."""
    if name not in _DTYPES:
        raise checkpoint_sources.CheckpointSourceError(
            f"{file}: tensor {tensor} is stored as safetensors dtype {name}, which paxlite "
            f"does not read (it reads "
            f"{', '.join(_DTYPES)}); save the model unquantized in one of those, e.g. "
            "transformers' save_pretrained after loading it with torch_dtype=torch.bfloat16."
        )
    return _DTYPES[name]


def _tensor_files(directory: epath.Path) -> dict[str, str]:
    """``{tensor name: file}`` from the index, or of the single file."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            return dict(json.loads(index.read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise checkpoint_sources.CheckpointSourceError(
                f"{index} is not a safetensors index ({e!r}); re-save the model."
            ) from None
    with open_safetensors(directory / SINGLE_FILE) as f:
        return {name: SINGLE_FILE for name in f.keys()}  # noqa: SIM118 (no __iter__)


def open_safetensors(file: epath.Path) -> Any:
    """safetensors' reader of ``file``; one line when it is cut short or not safetensors.

    Raises:
      CheckpointSourceError: safetensors refuses the file (an interrupted download is the
        common cause: its header names more bytes than the file holds).
    """
    try:
        return safe_open(os.fspath(file), framework="numpy")
    except (SafetensorError, OSError) as e:
        raise checkpoint_sources.CheckpointSourceError(
            f"{file} is not a readable safetensors file ({e}); an interrupted download leaves "
            "one cut short: download it again."
        ) from None


def is_hf_model_dir(path: epath.Path) -> bool:
    """Whether ``path`` holds a Hugging Face model: config.json beside its safetensors."""
    return (path / hf_models.CONFIG_FILE).is_file() and (
        (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()
    )


def _is_hf_config_dir(path: epath.Path) -> bool:
    """Whether ``path`` has a Hugging Face config.json (its ``model_type``), weights or not."""
    try:
        fields = json.loads((path / hf_models.CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(fields, dict) and "model_type" in fields


#: How PyTorch-only downloads hold their weights (transformers' older default).
_PICKLED_WEIGHTS = ("pytorch_model*.bin", "pytorch_model.bin.index.json", "*.pt", "*.pth")


def _without_weights(path: epath.Path) -> checkpoint_sources.CheckpointSourceError:
    """The error for a model directory whose config.json has no safetensors beside it."""
    pickled = sorted({f.name for pattern in _PICKLED_WEIGHTS for f in path.glob(pattern)})
    if pickled:
        return checkpoint_sources.CheckpointSourceError(
            f"{path} holds its weights as PyTorch pickles ({', '.join(pickled)}); paxlite reads "
            f"safetensors: convert them with transformers (AutoModel.from_pretrained(DIR)"
            f".save_pretrained(DIR) writes {SINGLE_FILE}), then try again."
        )
    return checkpoint_sources.CheckpointSourceError(
        f"{path} has {hf_models.CONFIG_FILE} but no weights ({SINGLE_FILE} or {INDEX_FILE}): a "
        "download that fetched only the small files? Download the weights; to train from "
        "random weights, use HfSyntheticLm or set HF_RANDOM_INIT=True."
    )


def _open(path: epath.Path, step: int | None, layout: Any, observer: Any) -> HfSource:
    if step is not None:
        raise checkpoint_sources.CheckpointSourceError(
            f"{path} is a Hugging Face model (one set of weights, no steps); leave the step unset."
        )
    if not is_hf_model_dir(path):
        raise _without_weights(path)
    return HfSource(path, observer)


checkpoint_sources.register(
    checkpoint_sources.Kind(
        HfSource.kind,
        f"{hf_models.CONFIG_FILE} beside {SINGLE_FILE} or {INDEX_FILE}",
        lambda path: is_hf_model_dir(path) or _is_hf_config_dir(path),
        _open,
    )
)


# --- writing ---------------------------------------------------------------------------------


def save(
    directory: epath.PathLike,
    params: Mapping[str, np.ndarray],
    family: hf_models.Family,
    config: Mapping[str, Any],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Writes ``params`` (our flat paths -> host arrays) as the family's safetensors and
    ``config`` as config.json (the family's ``model_type`` and ``architectures``, the
    arrays' dtype). Above ``max_shard_bytes`` the tensors go to numbered shards and an
    index, as transformers writes them. Returns the files written.

    Raises:
      ValueError: a parameter the family's table does not name.
    """
    directory = epath.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    named = hf_layout.their_names(family.table_of(config), list(params))
    unnamed = sorted(set(params) - set(named))
    if unnamed:
        raise ValueError(f"{family.model_type} has no Hugging Face name for {', '.join(unnamed)}.")
    parts: dict[str, list[tuple[hf_layout.Named, np.ndarray]]] = {}
    for path, where in named.items():
        array = np.asarray(params[path])
        split = where.split_dims  # A scanned stack's [L, ...], experts' [E, ...].
        pieces = array.reshape(-1, *array.shape[split:])
        for name, piece in zip(where.tensor_names(array.shape), pieces, strict=True):
            parts.setdefault(name, []).append((where, hf_layout.to_theirs(where.layout, piece)))
    tensors = {name: np.ascontiguousarray(hf_layout.fused(p)) for name, p in parts.items()}
    written = _write_tensors(directory, tensors, max_shard_bytes)
    dtype = np.dtype(next(iter(tensors.values())).dtype).name
    fields = {**config, "model_type": family.model_type, "architectures": [family.architecture]}
    fields.pop("torch_dtype", None)
    fields["dtype"] = dtype
    (directory / hf_models.CONFIG_FILE).write_text(json.dumps(fields, indent=2) + "\n")
    return [*written, hf_models.CONFIG_FILE]


def _write_tensors(
    directory: epath.Path, tensors: dict[str, np.ndarray], max_shard_bytes: int
) -> list[str]:
    """One file, or shards of at most ``max_shard_bytes`` (a bigger tensor alone) + index."""
    planned = {name: Variable(t.shape, t.dtype) for name, t in tensors.items()}
    return write_tensors(directory, planned, tensors.__getitem__, max_shard_bytes)


def write_tensors(
    directory: epath.PathLike,
    planned: Mapping[str, Variable],
    produce: Callable[[str], np.ndarray],
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> list[str]:
    """Writes the tensors ``planned`` names (name -> shape and dtype) as
    ``model.safetensors``, or as shards of at most ``max_shard_bytes`` (a bigger tensor alone)
    and their index, as transformers writes them. ``produce(name)`` gives each tensor as its
    bytes are written (:func:`write_safetensors`): one tensor is held at a time. Returns the
    files written."""
    directory = epath.Path(directory)
    sizes = {name: math.prod(v.shape) * np.dtype(v.dtype).itemsize for name, v in planned.items()}
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(planned):
        if shards[-1] and size + sizes[name] > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += sizes[name]
    if len(shards) == 1:
        write_safetensors(directory / SINGLE_FILE, {n: planned[n] for n in shards[0]}, produce)
        (directory / INDEX_FILE).unlink(missing_ok=True)
        return [SINGLE_FILE]
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file, names in zip(files, shards, strict=True):
        write_safetensors(directory / file, {n: planned[n] for n in names}, produce)
        weight_map.update(dict.fromkeys(names, file))
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (directory / SINGLE_FILE).unlink(missing_ok=True)
    return [*files, INDEX_FILE]


#: numpy's dtype names -> safetensors'.
_SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def write_safetensors(
    file: epath.Path, planned: Mapping[str, Variable], produce: Callable[[str], np.ndarray]
) -> None:
    """One safetensors file of the tensors ``planned`` names, each ``produce``d as its bytes
    are written and let go. safetensors' own writer takes every tensor at once, so its
    documented layout is written here: an 8-byte little-endian header size, the JSON header
    (each tensor's dtype, shape and byte range; ``__metadata__`` ``{'format': 'pt'}``, which
    transformers asks for), padded with spaces to 8 bytes, then the tensors' bytes in order.
    safetensors' own reader reads it back (tests)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, variable in planned.items():
        nbytes = math.prod(variable.shape) * np.dtype(variable.dtype).itemsize
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[np.dtype(variable.dtype).name],
            "shape": list(variable.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with file.open("wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for name, variable in planned.items():
            array = np.ascontiguousarray(produce(name))
            if array.shape != tuple(variable.shape) or array.dtype != np.dtype(variable.dtype):
                raise ValueError(
                    f"{name}: produced {array.dtype}{list(array.shape)}, planned "
                    f"{np.dtype(variable.dtype)}{list(variable.shape)}."
                )
            out.write(array.reshape(-1).view(np.uint8).data)
            del array
