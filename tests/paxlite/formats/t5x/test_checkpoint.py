"""T5X checkpoints: the flan-t5-style Hugging Face fixture's weights as T5X writes them, in its
legacy format (tests/fixtures/t5x/flan_legacy) and its orbax one (tests/fixtures/t5x/flan_orbax),
both made by tools/t5x_fixtures/make_t5x_fixtures.py.

Oracles: the same weights read from the Hugging Face fixture (tests/fixtures/hf/t5_flan), and
the logits transformers computed with them (its outputs.npz).
"""

import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from etils import epath
from flax import serialization, traverse_util

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.pretrained.loading import from_pretrained
from tests import FIXTURES
from tests.gcs import BUCKET

_FIXTURES = FIXTURES
_T5X = _FIXTURES / "t5x" / "flan_legacy"
_ORBAX = _FIXTURES / "t5x" / "flan_orbax"


@pytest.fixture(scope="module")
def hf_params():
    """The Hugging Face fixture's parameters as loaded on the 8 fake devices (flat paths)."""
    return traverse_util.flatten_dict(from_pretrained(_FIXTURES / "hf" / "t5_flan").params, sep="/")


def _run_params(params):
    return {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in params.items()
    }


def _read_all(source, run_params):
    assigned = {name: name for name in source.run_names(run_params)}
    return source.read(assigned, run_params)


def test_the_model_dir_opens_its_newest_step_and_a_step_dir_opens_itself():
    for path in (_T5X, _T5X / "checkpoint_7"):
        source = checkpoint_sources.open_source(path)
        assert (source.kind, source.step, source.version) == ("t5x checkpoint", 7, 3)
        assert source.path.name == "checkpoint_7"
    with pytest.raises(CheckpointSourceError, match="no checkpoint at step 8"):
        checkpoint_sources.open_source(_T5X, step=8)


@pytest.mark.parametrize("model_dir", [_T5X, _ORBAX], ids=["legacy", "orbax"])
def test_every_parameter_reads_onto_the_run_shardings_as_the_hugging_face_weights(
    hf_params, model_dir
):
    run_params = _run_params(hf_params)
    seen = []
    source = checkpoint_sources.open_source(model_dir, observer=lambda p, n: seen.append(p))
    got = _read_all(source, run_params)
    assert sorted(got) == sorted(hf_params)
    for path, value in hf_params.items():
        assert got[path].sharding == value.sharding, path
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(value), err_msg=path)
    assert set(source.run_names(run_params)) == set(source.variables())  # Every one used.
    assert set(seen) == set(hf_params)


@pytest.mark.parametrize("model_dir", [_T5X, _ORBAX], ids=["legacy", "orbax"])
def test_from_pretrained_with_an_experiment_matches_transformers_logits(model_dir):
    """T5Tiny (scanned stacks: each layer read from its own T5X array) at the fixture's sizes."""
    sizes = ["NUM_ENCODER_LAYERS=3", "MODEL_DIMS=32", "HIDDEN_DIMS=48", "NUM_HEADS=4"]
    sizes += ["DIMS_PER_HEAD=8", "VOCAB_SIZE=256"]
    t5 = from_pretrained(model_dir, exp="tasks.t5.tiny.T5Tiny", overrides=sizes)
    out = dict(np.load(_FIXTURES / "hf" / "t5_flan" / "outputs.npz"))
    logits = np.asarray(t5.logits(out["input_ids"], decoder_input_ids=out["decoder_input_ids"]))
    real = out["decoder_mask"].astype(bool)
    scale = np.abs(out["logits"][real]).max()
    np.testing.assert_allclose(logits[real], out["logits"][real], atol=1e-4 * scale, rtol=0)


def test_inline_and_tensorstore_leaves_are_both_read():
    source = checkpoint_sources.open_source(_T5X)
    kernel, scale = "params/decoder/logits_dense/kernel", "params/encoder/encoder_norm/scale"
    assert source.in_tensorstore(kernel) and not source.in_tensorstore(scale)
    assert source.read_whole(kernel).shape == (32, 256)  # zstd; the others gzip.
    assert source.read_whole(scale).dtype == np.float32


def test_the_step_and_adafactor_slots_are_listed():
    source = checkpoint_sources.open_source(_T5X)
    state = source.state_variables()
    assert int(source.read_whole("state/step")) == 7
    kernel = "state/param_states/encoder/layers_0/mlp/wi_0/kernel/"  # [32, 48]: factored.
    assert state[kernel + "v_row"].shape == (32,) and state[kernel + "v_col"].shape == (48,)
    assert state[kernel + "v"].shape == (1,) and state[kernel + "m"].shape == (1,)
    bias = "state/param_states/encoder/relpos_bias/rel_embedding/v"
    assert state[bias].shape == (4, 32) and source.in_tensorstore(bias)
    assert (source.read_whole(kernel + "v_row") > 0).all()
    assert not any(name.startswith("state/") for name in source.variables())


def _copy(tmp_path):
    shutil.copytree(_T5X, tmp_path / "model")
    return tmp_path / "model" / "checkpoint_7"


@pytest.mark.parametrize("version", [2, 3])
def test_bfloat16_arrays_read_natively_in_version_3_and_from_uint16_in_version_2(tmp_path, version):
    """Version 2 wrote bfloat16 to tensorstore as its bits in uint16; version 3 as bfloat16."""
    step = _copy(tmp_path)
    name = "target.encoder.layers_0.attention.query.kernel"
    want = np.random.default_rng(0).normal(size=(32, 32)).astype(ml_dtypes.bfloat16)
    stored = want.view(np.uint16) if version == 2 else want
    contents = serialization.msgpack_restore((step / "checkpoint").read_bytes())
    spec = contents["optimizer"]["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    spec["dtype"] = "uint16" if version == 2 else "bfloat16"
    shutil.rmtree(step / name)
    local = dict(spec, kvstore={"driver": "file", "path": str(step / name)})
    ts.open(local, create=True, open=True).result().write(stored).result()
    contents["version"] = version
    (step / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))
    source = checkpoint_sources.open_source(step)
    variable = source.variables()["params/encoder/layers_0/attention/query/kernel"]
    assert variable.dtype == np.dtype(ml_dtypes.bfloat16)
    got = source.read_whole("params/encoder/layers_0/attention/query/kernel")
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_an_inline_array_in_flaxs_chunked_form_reads_whole(tmp_path, monkeypatch):
    """flax's msgpack_serialize splits an inline array over its MAX_CHUNK_SIZE into chunks
    (T5X's very large inline leaves); a small limit makes the fixture's norms chunked."""
    step = _copy(tmp_path)
    contents = serialization.msgpack_restore((step / "checkpoint").read_bytes())
    want = contents["optimizer"]["target"]["encoder"]["encoder_norm"]["scale"]
    monkeypatch.setattr(serialization, "MAX_CHUNK_SIZE", 16)  # Bytes: 4 floats a chunk.
    packed = serialization.msgpack_serialize(contents)
    assert b"__msgpack_chunked_array__" in packed
    (step / "checkpoint").write_bytes(packed)
    got = checkpoint_sources.open_source(step).read_whole("params/encoder/encoder_norm/scale")
    np.testing.assert_array_equal(got, want)


def test_a_corrupt_or_missing_array_or_msgpack_is_one_line_naming_the_file(tmp_path, hf_params):
    step = _copy(tmp_path)
    (step / "target.decoder.logits_dense.kernel" / "0.0").write_bytes(b"not zstd")
    shutil.rmtree(step / "target.token_embedder.embedding")
    source = checkpoint_sources.open_source(step)
    with pytest.raises(CheckpointSourceError, match="target.decoder.logits_dense.kernel") as e:
        source.read_whole("params/decoder/logits_dense/kernel")
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointSourceError, match="target.token_embedder.embedding") as e:
        _read_all(source, _run_params(hf_params))
    assert "\n" not in str(e.value)
    (step / "checkpoint").write_bytes(b"\xc1garbage")
    with pytest.raises(CheckpointSourceError, match=f"{step / 'checkpoint'} is not a T5X"):
        checkpoint_sources.open_source(step)


def test_an_orbax_model_dir_and_step_open_as_the_t5x_kind_with_its_step():
    """T5X's orbax manager: checkpoint_<step>/state/ (_METADATA, an OCDBT database)."""
    for path in (_ORBAX, _ORBAX / "checkpoint_7"):
        source = checkpoint_sources.open_source(path)
        assert isinstance(source, t5x_checkpoint.T5xOrbaxSource)
        assert (source.kind, source.step, source.path.name) == ("t5x checkpoint", 7, "checkpoint_7")
        assert source.gated and source.version is None
        assert set(source.state_variables()) == {"state/step"}
        assert int(source.read_whole("state/step")) == 7
    with pytest.raises(CheckpointSourceError, match="no checkpoint at step 8"):
        checkpoint_sources.open_source(_ORBAX, step=8)


def _copy_orbax(tmp_path):
    shutil.copytree(_ORBAX, tmp_path / "model")
    return tmp_path / "model" / "checkpoint_7"


def test_an_orbax_step_missing_a_data_file_or_its_manifest_is_one_line(tmp_path, hf_params):
    step = _copy_orbax(tmp_path)
    data = max((step / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda f: f.stat().st_size)
    data.unlink()  # The largest: some parameters' chunks.
    source = checkpoint_sources.open_source(step)
    with pytest.raises(CheckpointSourceError, match="T5X array params/") as e:
        _read_all(source, _run_params(hf_params))
    assert "\n" not in str(e.value) and "OCDBT key target." in str(e.value)
    (step / "state" / "manifest.ocdbt").unlink()
    (step / "state" / "ocdbt.process_0" / "manifest.ocdbt").unlink()
    with pytest.raises(CheckpointSourceError, match="cannot be opened") as e:
        checkpoint_sources.open_source(step).read_whole("state/step")
    assert "\n" not in str(e.value)


def test_a_corrupt_orbax_metadata_is_one_line_naming_the_file(tmp_path):
    step = _copy_orbax(tmp_path)
    metadata = step / "state" / "_METADATA"
    metadata.write_text('{"tree_metadata": ')
    with pytest.raises(CheckpointSourceError, match=f"{metadata} is not an orbax") as e:
        checkpoint_sources.open_source(tmp_path / "model")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_dir", [_T5X, _ORBAX], ids=["legacy", "orbax"])
def test_a_model_dir_in_a_bucket_reads_as_the_local_one(emulator, hf_params, model_dir):
    """gs:// through the project's storage helpers (the GCS emulator)."""
    bucket = epath.Path(f"gs://{BUCKET}/t5x/{model_dir.name}")
    for file in model_dir.rglob("*"):
        if file.is_file():
            (bucket / file.relative_to(model_dir)).parent.mkdir(parents=True, exist_ok=True)
            (bucket / file.relative_to(model_dir)).write_bytes(file.read_bytes())
    source = checkpoint_sources.open_source(f"gs://{BUCKET}/t5x/{model_dir.name}")
    assert (source.step, type(source)) == (7, type(checkpoint_sources.open_source(model_dir)))
    got = _read_all(source, _run_params(hf_params))
    for path, value in hf_params.items():
        np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(value), err_msg=path)
