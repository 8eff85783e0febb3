"""HfSyntheticLm: a Hugging Face config.json's model on synthetic rows, with no data or tokenizer.

Oracle: HfCausalLm's model of the same config.json (the fine-tuning experiment, which the
HF fixtures test against transformers) is the same Fiddle config.
"""

import json
import shutil

import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from tasks.lm.hf import HfCausalLm
from tasks.lm.hf_synthetic import HfSyntheticLm
from tests.tasks.lm.test_hf_finetune import _HF


@pytest.fixture
def config_only(tmp_path):
    """llama3's fixture directory reduced to its config.json (no weights, no tokenizer)."""
    shutil.copy(_HF / "llama3" / "config.json", tmp_path / "config.json")
    return tmp_path


def _synthetic(hf_model, **knobs):
    return base_experiment.with_overrides(HfSyntheticLm, {"HF_MODEL": str(hf_model), **knobs})()


def test_model_is_hf_causal_lm_model(config_only):
    knobs = {"NUM_LOSS_CHUNKS": 2, "FPROP_DTYPE": np.float32, "MAX_SEQ_LEN": 32}
    ours = _synthetic(config_only, **knobs)
    theirs = base_experiment.with_overrides(
        HfCausalLm, {"HF_MODEL": str(_HF / "llama3"), "TEXT_DATA_PATH": "unread.txt", **knobs}
    )()
    assert ours.model() == theirs.model()
    fields = json.loads((config_only / "config.json").read_text())
    assert ours.VOCAB_SIZE == fields["vocab_size"]
    assert ours.eos_token_id() == tuple(fields["eos_token_id"])
    train_input = ours.datasets()[0]
    assert train_input.vocab_size == fields["vocab_size"] and train_input.seq_len == 32


def test_size_knob_against_config_is_one_error(config_only):
    with pytest.raises(KnobError, match=r"NUM_LAYERS=4 \(config.json: 2\)"):
        _synthetic(config_only, NUM_LAYERS=4)


def test_lora_targets_take_hugging_face_names(config_only):
    exp = _synthetic(config_only, LORA_RANK=4, LORA_TARGET_MODULES="q_proj,o_proj")
    assert exp.lora_targets() == ("query", "post")
