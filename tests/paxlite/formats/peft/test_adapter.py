"""PEFT adapter directories that cannot be read (``paxlite.formats.peft.adapter``): one line
naming the file, as for a Hugging Face model's safetensors."""

import shutil

import pytest

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.peft import adapter as peft_adapter
from tests import FIXTURES


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
