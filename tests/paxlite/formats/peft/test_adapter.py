"""PEFT adapter directories that cannot be read (``paxlite.formats.peft.adapter``): one line
naming the file, as for a Hugging Face model's safetensors; the files an adapter is saved to
take the process's umask."""

import json
import pathlib
import shutil

import numpy as np
import pytest
from safetensors import safe_open

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from tests import FIXTURES
from tests.paxlite.formats.hf.test_checkpoint import assert_written_with_umask


def test_an_adapter_file_cut_short_is_one_line_naming_it(tmp_path):
    adapter = shutil.copytree(FIXTURES / "hf" / "llama3_lora", tmp_path / "adapter")
    weights = adapter / peft_adapter.WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-64])  # An interrupted download.
    with pytest.raises(CheckpointSourceError) as error:
        checkpoint_sources.open_source(adapter)
    message = str(error.value)
    assert "\n" not in message
    assert f"{weights} is not a readable safetensors file" in message
    assert "download it again" in message


def _adapter_naming(base: str, tmp_path) -> pathlib.Path:
    """llama3_lora (trained on the llama3 fixture), its config naming ``base`` as its base."""
    adapter = shutil.copytree(FIXTURES / "hf" / "llama3_lora", tmp_path / "adapter")
    config = adapter / peft_adapter.CONFIG_FILE
    fields = json.loads(config.read_text())
    config.write_text(json.dumps({**fields, "base_model_name_or_path": base}))
    return adapter


def test_a_base_other_than_the_local_one_an_adapter_names_is_refused_naming_both(tmp_path):
    adapter = _adapter_naming(str(FIXTURES / "hf" / "llama3"), tmp_path)
    config = peft_adapter.AdapterConfig.load(adapter)
    qwen2 = FIXTURES / "hf" / "qwen2"  # Same sizes and modules; another model.
    with pytest.raises(peft_adapter.PeftError) as error:
        peft_adapter.check_base(adapter, config, qwen2)
    assert str(error.value) == (
        f"{adapter} adapts {FIXTURES / 'hf' / 'llama3'}, but the base model given, {qwen2}, is "
        "another model (model_type llama vs qwen2); give the base it was trained on."
    )
    llama2 = FIXTURES / "hf" / "llama2"  # Same family, another vocabulary.
    with pytest.raises(peft_adapter.PeftError, match="vocab_size 320 vs 352"):
        peft_adapter.check_base(adapter, config, llama2)
    assert peft_adapter.check_base(adapter, config, FIXTURES / "hf" / "llama3") is None


def test_a_base_unlike_the_hub_id_an_adapter_names_is_warned_about(tmp_path):
    adapter = _adapter_naming("meta-llama/Llama-3.2-1B", tmp_path)
    config = peft_adapter.AdapterConfig.load(adapter)
    other, same = tmp_path / "qwen2.5-0.5b", tmp_path / "llama_3.2_1b"  # Local copies.
    for base in (other, same):
        shutil.copytree(FIXTURES / "hf" / "llama3", base)
    warning = peft_adapter.check_base(adapter, config, other)
    assert warning is not None and "'meta-llama/Llama-3.2-1B'" in warning
    assert f"is put on {other}: check that they are the same" in warning
    assert peft_adapter.check_base(adapter, config, same) is None
    # A base that is no model directory is for whatever opens it to refuse.
    assert peft_adapter.check_base(adapter, config, tmp_path / "no_such_dir") is None


def test_a_saved_adapter_takes_the_umask_and_reads_back(tmp_path):
    """Layer 0's q_proj adapter of llama3's sizes (D 64, 4 heads of 16, rank 4): PEFT's
    tensors (torch's layout) with the metadata transformers asks for."""
    a = np.arange(64 * 4, dtype=np.float32).reshape(64, 4)
    b = np.arange(4 * 4 * 16, dtype=np.float32).reshape(4, 4, 16)
    block = "lm/transformer/x_layers_0/self_attention/"
    params = {f"{block}w_q_lora_a": a, f"{block}w_q_lora_b": b, f"{block}w_q": np.ones(3)}
    config = peft_adapter.AdapterConfig(rank=4, alpha=8.0, target_modules=("q_proj",))
    out, family = tmp_path / "adapter", hf_models.FAMILIES["llama"]
    assert_written_with_umask(lambda: peft_adapter.save(out, params, family, config), out)
    assert peft_adapter.AdapterConfig.load(out) == config
    module = "base_model.model.model.layers.0.self_attn.q_proj"
    with safe_open(str(out / peft_adapter.WEIGHTS_FILE), "numpy") as f:
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_tensor(f"{module}.lora_A.weight"), a.T)
        np.testing.assert_array_equal(f.get_tensor(f"{module}.lora_B.weight"), b.reshape(4, 64).T)
