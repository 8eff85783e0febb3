"""Hugging Face model directories that cannot be read: each is one line naming the file and the
fix (``paxlite.formats.hf.checkpoint``), whatever reads them (--init_from, HF_MODEL,
``from_pretrained``); nothing is written. The directories are the transformers-made fixtures
(tests/fixtures/hf/), damaged here as downloads and copies damage them. And the files
``hf_checkpoint.save`` writes take the process's umask (:func:`assert_written_with_umask`)."""

import json
import os
import pathlib
import shutil
import stat
from collections.abc import Callable

import numpy as np
import pytest

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from tests import FIXTURES

#: A umask stricter than the usual 022: the group reads, others nothing.
UMASK = 0o027


def assert_written_with_umask(write: Callable[[], object], root: pathlib.Path) -> None:
    """``write()``, run under :data:`UMASK` (the process's umask restored after), leaves
    ``root`` and everything under it as that umask makes them: files 0o640, directories
    0o750 (no writer of its own modes, such as a temporary file renamed into place)."""
    old = os.umask(UMASK)
    try:
        write()
    finally:
        os.umask(old)
    paths = [root, *sorted(root.rglob("*"))]
    modes = {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths}
    wants = {
        str(p.relative_to(root)): oct((0o777 if p.is_dir() else 0o666) & ~UMASK) for p in paths
    }
    assert len(paths) > 1 and modes == wants


def _copy(name: str, tmp_path: pathlib.Path, *, without: tuple[str, ...] = ()) -> pathlib.Path:
    """Fixture ``name``'s directory copied into ``tmp_path``, less the files ``without``."""
    return shutil.copytree(FIXTURES / "hf" / name, tmp_path / name, ignore=lambda *_: without)


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def _cut(file: pathlib.Path, keep: int) -> None:
    """``file`` ends after its first ``keep`` bytes (a negative ``keep``: that many fewer)."""
    data = file.read_bytes()
    file.write_bytes(data[:keep])


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: _cut(f, -100),  # Cut in the data: the header names more bytes than there are.
        lambda f: _cut(f, 5),  # Cut in the header's length.
        lambda f: f.write_bytes(f.read_bytes()[:8] + b"{not json" + f.read_bytes()[17:]),
        lambda f: f.write_bytes(b""),
    ],
    ids=["cut_in_data", "cut_in_header", "header_not_json", "empty"],
)
def test_a_damaged_safetensors_file_is_one_line_naming_it(tmp_path, damage):
    model = _copy("llama3", tmp_path)
    damage(model / hf_checkpoint.SINGLE_FILE)
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(model)
    message = _one_line(error)
    assert f"{model / hf_checkpoint.SINGLE_FILE} is not a readable safetensors file" in message
    assert "download it again" in message


def test_a_damaged_shard_is_one_line_when_its_tensors_are_read(tmp_path):
    model = _copy("qwen3", tmp_path)  # Three shards and an index.
    shard = sorted(model.glob("model-*.safetensors"))[1]
    _cut(shard, -50)
    source = checkpoint_sources.open_source(model)  # The index alone is read here.
    with pytest.raises(CheckpointSourceError) as error:
        source.variables()
    assert f"{shard} is not a readable safetensors file" in _one_line(error)


def test_a_config_without_weights_is_one_line_not_a_random_model(tmp_path):
    model = _copy("llama3", tmp_path, without=(hf_checkpoint.SINGLE_FILE,))
    assert (model / "tokenizer.json").is_file()  # The small files a download fetches first.
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(model)
    message = _one_line(error)
    assert f"{model} has config.json but no weights" in message
    assert "HfSyntheticLm" in message and "HF_RANDOM_INIT=True" in message


def test_weights_only_as_pytorch_pickles_say_how_to_convert_them(tmp_path):
    model = _copy("gpt2", tmp_path, without=(hf_checkpoint.SINGLE_FILE,))
    (model / "pytorch_model.bin").write_bytes(b"PK\x03\x04 a torch.save zip")
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(model)
    message = _one_line(error)
    assert "holds its weights as PyTorch pickles (pytorch_model.bin)" in message
    assert "paxlite reads safetensors" in message and ".save_pretrained(DIR)" in message


def test_a_directory_of_neither_kind_still_lists_what_was_looked_for(tmp_path):
    (tmp_path / "config.json").write_text('{"not": "a model"}')  # No model_type.
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(tmp_path)
    assert "holds no checkpoint paxlite can read: looked for" in _one_line(error)


def test_a_tensor_in_a_dtype_paxlite_cannot_hold_is_one_line_naming_it(tmp_path):
    """An 8-bit quantized download: one weight stored as I8."""
    from safetensors.numpy import load_file, save_file

    model = _copy("llama3", tmp_path)
    weights = model / hf_checkpoint.SINGLE_FILE
    tensors = load_file(weights)
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name] = tensors[name].astype("int8")
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(model).variables()
    assert _one_line(error).startswith(
        f"{weights}: tensor {name} is stored as safetensors dtype I8, which paxlite does not read"
    )
    assert "save the model unquantized" in str(error.value)


@pytest.mark.parametrize("max_shard_bytes", [hf_checkpoint.DEFAULT_MAX_SHARD_BYTES, 600])
def test_saved_files_take_the_umask(tmp_path, max_shard_bytes):
    """A single file, or shards and their index (600 bytes: a tensor a shard)."""
    config = json.loads((FIXTURES / "hf" / "llama3" / hf_models.CONFIG_FILE).read_text())
    vocab, dims = config["vocab_size"], config["hidden_size"]
    params = {  # Three of llama's parameters (our paths), float32.
        "lm/embedding/emb_var": np.ones((vocab, dims), np.float32),
        "lm/softmax/w": np.ones((dims, vocab), np.float32),
        "lm/final_ln/scale": np.ones((dims,), np.float32),
    }
    out, family = tmp_path / "out", hf_models.FAMILIES["llama"]
    files = []
    save = hf_checkpoint.save
    assert_written_with_umask(
        lambda: files.extend(save(out, params, family, config, max_shard_bytes=max_shard_bytes)),
        out,
    )
    sharded = max_shard_bytes < hf_checkpoint.DEFAULT_MAX_SHARD_BYTES
    assert (hf_checkpoint.INDEX_FILE in files) == sharded, files
