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
from praxis_lite.sharding import EXPERT
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
    assert ours.vocab_size() == fields["vocab_size"]
    assert ours.eos_token_id() == tuple(fields["eos_token_id"])
    train_input = ours.datasets()[0]
    assert train_input.vocab_size == fields["vocab_size"] and train_input.seq_len == 32


def test_a_knob_of_our_own_transformer_is_not_one_and_names_config_json(config_only):
    for knob, field in (("NUM_LAYERS", "num_hidden_layers"), ("NUM_EXPERTS", "num_experts")):
        with pytest.raises(KnobError, match=f"has no knob '{knob}'.*config.json.*{field}"):
            _synthetic(config_only, **{knob: "4"})
    with pytest.raises(KnobError, match="has no knob 'NORM'; HF_MODEL's config.json builds"):
        _synthetic(config_only, NORM="RMS_NORM")


def test_the_mesh_check_splits_config_json_sizes(config_only):
    """llama3's 2 key/value heads do not split over 4 'mdl' devices: one line naming them
    (the tiny LM's 4 heads, which the check once read, would have split)."""
    with pytest.raises(KnobError, match="config.json's key/value heads=2 does not split evenly"):
        _synthetic(config_only, ICI_MESH_SHAPE=(1, 2, 4), PERCORE_BATCH_SIZE=1).validate()
    _synthetic(config_only, ICI_MESH_SHAPE=(1, 4, 2), PERCORE_BATCH_SIZE=1).validate()


def test_lora_targets_take_hugging_face_names(config_only):
    exp = _synthetic(config_only, LORA_RANK=4, LORA_TARGET_MODULES="q_proj,o_proj")
    assert exp.lora_targets() == ("query", "post")


def test_a_stage_axis_is_refused_as_the_model_is_not_pipelined(config_only):
    mesh = {"MESH_AXIS_NAMES": ("stage", "replica", "data", "mdl"), "ICI_MESH_SHAPE": (2, 1, 1, 1)}
    with pytest.raises(KnobError, match="2 devices on its 'stage' axis but NUM_STAGES=1"):
        _synthetic(config_only, PERCORE_BATCH_SIZE=1, **mesh).validate()


def test_a_subclass_setting_our_transformers_knob_is_told_config_json_sets_it():
    with pytest.raises(KnobError) as e:

        class MyFinetune(HfCausalLm):
            NUM_LAYERS = 4

    assert "NUM_LAYERS = 4 sets a knob that no base class declares; HF_MODEL's config.json " in (
        str(e.value)
    )
    assert "declare a new knob" not in str(e.value)


@pytest.mark.parametrize(
    "field, named",
    [
        ("moe_intermediate_size", "expert intermediate size=33"),
        ("shared_expert_intermediate_size", "shared expert intermediate size=33"),
    ],
)
def test_the_mesh_check_splits_the_experts_hidden_dims(tmp_path, field, named):
    """Qwen2-MoE's experts and shared expert have hidden dims of their own, on 'mlp' too."""
    fields = json.loads((_HF / "qwen2_moe" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**fields, field: 33}))
    with pytest.raises(KnobError, match=f"config.json's {named} does not split evenly"):
        _synthetic(tmp_path, ICI_MESH_SHAPE=(1, 4, 2), PERCORE_BATCH_SIZE=1).validate()
    exp = _synthetic(_HF / "qwen2_moe", ICI_MESH_SHAPE=(1, 4, 2), PERCORE_BATCH_SIZE=1)
    assert exp.weight_sizes()[EXPERT] == ("config.json's experts", fields["num_experts"])
