"""Mesh TensorFlow T5 checkpoints read directly (tests/fixtures/mtf, written by TensorFlow's
own ``Saver`` from the Hugging Face T5 fixtures: tools/t5x_fixtures/make_mtf_checkpoints.py).

Oracles: the logits, encoder outputs and greedy tokens transformers computed for the weights
(tests/fixtures/hf/t5_flan/outputs.npz; for the bfloat16 fixture, transformers on the
weights rounded to bfloat16: tests/fixtures/mtf/t5_1_0_bf16/outputs.npz, made by
tools/hf_fixtures/make_mtf_outputs.py); TensorFlow's reader for what each tensor holds. T5X's
own importer reads the same fixtures to the same arrays (tools/t5x_fixtures/
check_mtf_with_t5x.py, run by hand).
"""

from __future__ import annotations

import collections
import pathlib
import shutil
from collections.abc import Callable

import jax
import numpy as np
import pytest
from etils import epath
from flax import traverse_util

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.mtf import checkpoint as mtf_checkpoint
from paxlite.pretrained.loading import from_pretrained
from tests import FIXTURES
from tests.gcs import BUCKET
from tests.paxlite.formats.hf.test_t5 import assert_transformers_t5_outputs
from tools.t5x_fixtures import make_mtf_checkpoints

MTF = FIXTURES / "mtf"
T5_1_1 = MTF / "t5_1_1"  # t5_flan's weights, float32, rms_norm names, Adafactor slots.
BF16 = MTF / "t5_1_0_bf16"  # t5_v1_0's, bfloat16, layer_norm names, tied logits.
OUTPUTS = {
    "t5_1_1": FIXTURES / "hf" / "t5_flan" / "outputs.npz",
    "t5_1_0_bf16": BF16 / "outputs.npz",
}


def _assert_transformers_outputs(t5, name: str) -> None:
    assert_transformers_t5_outputs(t5, dict(np.load(OUTPUTS[name])), name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [T5_1_1, BF16 / "model.ckpt-500"], ids=["directory, float32", "prefix, bfloat16"]
)
def test_from_pretrained_gives_transformers_logits_encoder_outputs_and_greedy_tokens(path):
    t5 = from_pretrained(path)
    _assert_transformers_outputs(t5, path.name if path.is_dir() else path.parent.name)


def test_sizes_come_from_the_tensors_and_the_activation_from_the_operative_config():
    config_file, shape = mtf_checkpoint.shape_of_checkpoint(T5_1_1)
    assert config_file.name == "operative_config.gin"
    assert (shape.num_encoder_layers, shape.num_decoder_layers) == (3, 2)
    assert (shape.model_dims, shape.hidden_dims, shape.num_heads, shape.dims_per_head) == (
        32,
        48,
        4,
        8,
    )
    assert (shape.vocab_size, shape.relative_buckets) == (256, 32)
    assert shape.mlp_activations == ("gelu", "linear") and not shape.logits_via_embedding
    _, tied = mtf_checkpoint.shape_of_checkpoint(BF16)
    assert tied.mlp_activations == ("relu",) and tied.logits_via_embedding


def _copy(fixture: pathlib.Path, tmp_path: pathlib.Path, name: str = "ckpt") -> pathlib.Path:
    return pathlib.Path(shutil.copytree(fixture, tmp_path / name))


def test_the_state_file_names_the_newest_step_and_a_step_can_be_asked_for(tmp_path):
    directory = _copy(T5_1_1, tmp_path)
    for file in list(directory.glob("model.ckpt-1000*")):  # The same tensors as step 2000.
        shutil.copy(file, directory / file.name.replace("-1000", "-2000"))
    assert checkpoint_sources.identify(directory).name == "mtf checkpoint"
    assert mtf_checkpoint.prefix_of(epath.Path(directory)).name == "model.ckpt-1000"  # State file.
    (directory / "checkpoint").unlink()
    assert mtf_checkpoint.prefix_of(epath.Path(directory)).name == "model.ckpt-2000"  # Largest.
    assert mtf_checkpoint.prefix_of(epath.Path(directory), 1000).name == "model.ckpt-1000"
    with pytest.raises(CheckpointSourceError, match="no checkpoint at step 3; its steps: 1000"):
        mtf_checkpoint.prefix_of(epath.Path(directory), 3)


def test_each_tensor_is_read_once_whole_however_many_devices_hold_slices_of_it():
    """8 devices, the weights split over them (from_pretrained's FSDP): each of the
    checkpoint's tensors is read from TensorFlow exactly once, and a second read of the same
    slices gives what from_pretrained read (that those are right, the logits test says)."""
    loaded = from_pretrained(T5_1_1)  # The run's parameters and shardings.
    flat = traverse_util.flatten_dict(loaded.params, sep="/")
    run_params = {
        path: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
        for path, v in flat.items()
    }
    reads = collections.Counter()
    source = checkpoint_sources.open_source(T5_1_1, observer=lambda leaf, n: reads.update([leaf]))
    parts = source._leaf_parts(run_params)  # noqa: SLF001 (the table's names of each leaf)
    got = source.read({n: n for _, _, names in parts for n in names}, run_params)
    assert any(len(v.sharding.device_set) == 8 for v in got.values())
    assert set(reads.values()) == {1} and len(reads) == len(got) == len(flat)
    for path, value in got.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(flat[path]), err_msg=path)


# --- bad input: one line each -------------------------------------------------------------------


def _refused_in_one_line(read: Callable[[], object], *parts: str) -> None:
    """``read()`` raises CheckpointSourceError with a one-line message naming ``parts``."""
    with pytest.raises(CheckpointSourceError) as error:
        read()
    message = str(error.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


def _with_operative_config(tmp_path: pathlib.Path, old: str, new: str) -> pathlib.Path:
    """A copy of the t5_1_1 fixture, ``old`` replaced by ``new`` in its operative_config.gin."""
    directory = _copy(T5_1_1, tmp_path)
    config = directory / "operative_config.gin"
    config.write_text(config.read_text().replace(old, new))
    return directory


def test_an_index_without_its_data_shards(tmp_path):
    directory = _copy(T5_1_1, tmp_path)
    for file in directory.glob("*.data-*"):
        file.unlink()
    _refused_in_one_line(
        lambda: checkpoint_sources.open_source(directory),
        "model.ckpt-1000.index has no data beside it",
        "copy the checkpoint's .data-*",
    )


def test_a_missing_shard_of_several_is_named(tmp_path):
    directory = _copy(T5_1_1, tmp_path)
    data = directory / "model.ckpt-1000.data-00000-of-00001"
    data.rename(directory / "model.ckpt-1000.data-00000-of-00002")
    _refused_in_one_line(
        lambda: checkpoint_sources.open_source(directory),
        "missing 1 of its 2 data shards (model.ckpt-1000.data-00001-of-00002)",
    )


def test_a_truncated_shard_is_named_when_read(tmp_path):
    directory = _copy(T5_1_1, tmp_path)
    data = directory / "model.ckpt-1000.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:1000])
    source = checkpoint_sources.open_source(directory)
    _refused_in_one_line(
        lambda: source.read_whole("params/decoder/logits/kernel"),
        "tensor decoder/logits/kernel cannot be read",
        "truncated or damaged",
    )


def _resaved(tmp_path: pathlib.Path, drop: str) -> pathlib.Path:
    """The t5_1_1 fixture saved again by TensorFlow without variable ``drop``."""
    from tensorflow.python.training import py_checkpoint_reader

    reader = py_checkpoint_reader.NewCheckpointReader(str(T5_1_1 / "model.ckpt-1000"))
    variables = {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name not in (drop, "global_step")
    }
    out = tmp_path / "resaved"
    make_mtf_checkpoints.save(out, variables, 1000, "float32")
    shutil.copy(T5_1_1 / "operative_config.gin", out)
    return out


@pytest.mark.slow
def test_a_variable_missing_is_named_with_its_mtf_name(tmp_path):
    directory = _resaved(tmp_path, "decoder/block_001/layer_002/DenseReluDense/wo/kernel")
    _refused_in_one_line(
        lambda: from_pretrained(directory),
        "lacks 1 of the variables",
        "decoder/block_001/layer_002/DenseReluDense/wo/kernel",
    )


def test_a_shape_that_disagrees_with_the_operative_config(tmp_path):
    directory = _with_operative_config(tmp_path, "d_model = 32", "d_model = 768")
    _refused_in_one_line(
        lambda: from_pretrained(directory),
        "operative_config.gin disagrees with the checkpoint's tensors",
        "d_model = 768",
    )


def test_an_activation_paxlite_lacks_is_named(tmp_path):
    directory = _with_operative_config(tmp_path, "['gelu', 'linear']", "['squared_relu', 'linear']")
    _refused_in_one_line(
        lambda: mtf_checkpoint.shape_of_checkpoint(directory),
        "DenseReluDense.activation",
        "'squared_relu'",
    )


@pytest.mark.parametrize(
    ("fixture", "named"),
    [
        ("decoder_only", "MTF's decoder-only language model (transformer/...)"),
        ("per_block_bias", "a relative attention bias in every block"),
    ],
)
def test_an_architecture_paxlite_s_t5_is_not(fixture, named):
    _refused_in_one_line(lambda: from_pretrained(MTF / fixture), named)


def test_a_prefix_without_an_index_is_not_an_mtf_checkpoint(tmp_path):
    assert not mtf_checkpoint.recognises(epath.Path(tmp_path / "model.ckpt-1"))
    with pytest.raises(CheckpointSourceError, match="does not exist"):
        checkpoint_sources.identify(tmp_path / "model.ckpt-1")


@pytest.mark.slow
def test_a_checkpoint_in_a_bucket_reads_as_the_local_one(emulator):
    """gs:// through the project's storage layer (the GCS emulator): the index and shards are
    copied to a local temporary directory for TensorFlow's reader, then removed."""
    bucket = epath.Path(f"gs://{BUCKET}/mtf/t5_1_1")
    for file in T5_1_1.iterdir():
        (bucket / file.name).write_bytes(file.read_bytes())
    t5 = from_pretrained(f"gs://{BUCKET}/mtf/t5_1_1/model.ckpt-1000")
    _assert_transformers_outputs(t5, "t5_1_1")
    source = checkpoint_sources.open_source(bucket)
    staged = pathlib.Path(source._bundle._staged)  # noqa: SLF001
    assert (staged / "model.ckpt-1000.index").is_file()
    source.close()
    assert not staged.exists()


def test_scoped_activations_count_and_must_agree(tmp_path):
    """Some T5 operative configs bind the activation per stack only."""
    directory = _copy(T5_1_1, tmp_path)
    config = directory / "operative_config.gin"
    text = config.read_text().replace(
        "DenseReluDense.activation", "encoder/DenseReluDense.activation", 1
    )
    config.write_text(text)
    assert mtf_checkpoint.shape_of_checkpoint(directory)[1].mlp_activations == ("gelu", "linear")
    config.write_text(
        text.replace(
            "decoder/DenseReluDense.activation = ['gelu', 'linear']",
            "decoder/DenseReluDense.activation = ['silu', 'linear']",
        )
    )
    _refused_in_one_line(
        lambda: mtf_checkpoint.shape_of_checkpoint(directory),
        "DenseReluDense.activation differs between scopes",
    )


@pytest.mark.slow
def test_logits_missing_where_the_config_says_they_are_their_own(tmp_path):
    directory = _resaved(tmp_path, "decoder/logits/kernel")  # Its config: not tied.
    _refused_in_one_line(
        lambda: mtf_checkpoint.shape_of_checkpoint(directory),
        "lacks 1 of the variables",
        "decoder/logits/kernel",
    )
