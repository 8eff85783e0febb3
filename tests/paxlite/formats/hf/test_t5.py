"""Hugging Face T5 in and out: a flan-t5-style (gated-gelu, separate lm_head, 3 encoder and
2 decoder layers) and a T5 1.0-style (relu, tied and scaled logits) directory that
transformers wrote (tests/fixtures/hf/t5_*, made by tools/hf_fixtures/make_t5_fixtures.py).

Oracles: the logits, encoder outputs and greedy tokens transformers computed for each
fixture; the fixture's own safetensors for what save_pretrained writes back.
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from paxlite.pretrained.loading import from_pretrained
from paxlite.pretrained.pretrained_models import PretrainedSeq2Seq
from tests import FIXTURES

_HF = FIXTURES / "hf"


def _close(got: np.ndarray, want: np.ndarray, where: np.ndarray) -> None:
    """Within 1e-4 of the reference's scale at the ``where`` positions (real tokens)."""
    scale = np.abs(want[where]).max()
    np.testing.assert_allclose(got[where], want[where], atol=1e-4 * scale, rtol=0)


@pytest.fixture(scope="module", params=["t5_flan", "t5_v1_0"])
def loaded(request):
    """(name, its outputs, the fixture loaded on this process's 8 fake devices)."""
    name = request.param
    return name, dict(np.load(_HF / name / "outputs.npz")), from_pretrained(_HF / name)


def assert_transformers_t5_outputs(t5: PretrainedSeq2Seq, out: dict, name: str) -> None:
    """``t5``'s logits and encoder outputs are within 1e-4 of the scale of transformers' in
    ``out`` (a fixture's outputs.npz) at the real tokens, and its 8 greedy tokens of each
    prompt (the prompts unpadded: one row right-padded) are transformers' exactly."""
    logits = t5.logits(out["input_ids"], decoder_input_ids=out["decoder_input_ids"])
    _close(logits, out["logits"], out["decoder_mask"].astype(bool))
    _close(t5.encode(out["input_ids"]), out["encoder_out"], out["attention_mask"].astype(bool))
    rows = [
        ids[mask.astype(bool)].tolist()
        for ids, mask in zip(out["input_ids"], out["attention_mask"], strict=True)
    ]
    tokens = np.asarray(t5.generate(rows, max_new_tokens=8))
    for i in range(2):
        np.testing.assert_array_equal(tokens[i], out[f"greedy_{i}"], err_msg=f"{name} row {i}")


@pytest.mark.slow
def test_t5_matches_transformers_logits_encoder_outputs_and_greedy_tokens(loaded):
    name, out, t5 = loaded
    assert isinstance(t5, PretrainedSeq2Seq)
    assert_transformers_t5_outputs(t5, out, name)


@pytest.mark.slow
def test_save_pretrained_writes_back_transformers_tensors_and_config(loaded, tmp_path):
    """Every tensor of the fixture, by its name and bit for bit (the tied variant without an
    lm_head), its config's fields, and a tokenizer the reloaded model encodes with."""
    name, out, t5 = loaded
    t5.save_pretrained(tmp_path)
    theirs, ours = (
        load_file(_HF / name / "model.safetensors"),
        load_file(tmp_path / "model.safetensors"),
    )
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)
    fields = json.loads((_HF / name / "config.json").read_text())
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {k: saved[k] for k in fields if k != "transformers_version"} == {
        k: v for k, v in fields.items() if k != "transformers_version"
    }
    again = from_pretrained(tmp_path)
    assert again.generate(["the old mill"], max_new_tokens=4) == t5.generate(
        ["the old mill"], max_new_tokens=4
    )


def test_a_scanned_t5_stack_reads_each_layer_from_its_own_tensor():
    table = hf_layout.t5_table(gated=True)
    named = hf_layout.their_names(
        table,
        [
            "network/encoder/repeat/block/self_attention/w_q",
            "network/decoder/repeat/block/cross_attention/w_post",
            "network/decoder/repeat/block/ff_layer/ffn_layer1/w",
        ],
    )
    q, post, wi = named.values()
    assert q.layer_names(2) == [f"encoder.block.{i}.layer.0.SelfAttention.q.weight" for i in (0, 1)]
    assert post.layer_names(1) == ["decoder.block.0.layer.1.EncDecAttention.o.weight"]
    assert wi.layer_names(1) == ["decoder.block.0.layer.2.DenseReluDense.wi_0.weight"]
    relu = hf_layout.their_names(
        hf_layout.t5_table(gated=False), ["network/encoder/repeat/block/ff_layer/ffn_layer1/w"]
    )
    assert next(iter(relu.values())).theirs == "encoder.block.{}.layer.1.DenseReluDense.wi.weight"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"feed_forward_proj": "gated-swish"}, 'feed_forward_proj="gated-swish" is not supported'),
        ({"layer_norm_epsilon": 1e-5}, "layer_norm_epsilon=1e-05 is not supported"),
        ({"is_decoder": True}, "is_decoder=true is not supported"),
        ({"d_model": None}, "has no 'd_model'"),
    ],
)
def test_t5_configs_it_cannot_build_are_one_line(tmp_path, change, message):
    fields = json.loads((_HF / "t5_flan" / "config.json").read_text())
    fields.update(change)
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(hf_models.HfConfigError, match=message) as e:
        hf_models.build_model(hf_models.HfConfig.load(tmp_path))
    assert "\n" not in str(e.value)


def test_a_t5s_config_json_describes_it_again():
    """hf_models.t5_config (a T5 from T5X written as HF) is t5_shape_of's inverse."""
    for name in ("t5_flan", "t5_v1_0"):
        shape = hf_models.t5_shape_of(hf_models.HfConfig.load(_HF / name))
        again = hf_models.HfConfig(hf_models.t5_config(shape), "config.json")
        assert hf_models.t5_shape_of(again) == shape


def test_t5s_sentencepiece_with_its_100_extra_ids_tokenizes_as_transformers(tmp_path):
    """A T5 directory with spiece.model and no tokenizer.json (older Hub copies): the ids,
    with and without EOS, and the texts transformers gave for each case; <extra_id_0> is
    the vocabulary's last id."""
    import shutil

    from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer

    names = ("spiece.model", "tokenizer_config.json", "special_tokens_map.json", "config.json")
    for name in names:
        shutil.copy(_HF / "t5_flan" / name, tmp_path / name)
    tokenizer = HfTokenizer.from_dir(tmp_path)
    assert tokenizer.vocab_size == 250 and tokenizer.eos_token_id == 1
    assert tokenizer.encode("<extra_id_0>", add_special_tokens=False) == [249]
    cases = json.loads((_HF / "t5_flan" / "tokenizer_cases.json").read_text())["cases"]
    for case in cases:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids_no_special"]
        assert (
            tokenizer.decode(case["ids_no_special"], skip_special_tokens=False) == case["decoded"]
        )
