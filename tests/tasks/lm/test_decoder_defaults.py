"""Each family's decoding defaults: T5 experiments take T5X's beam rules (length_norm_alpha
0.6), Pax-style LMs praxis' (0.8), Hugging Face experiments and models their
generation_config.json's beam and control settings (transformers' rules)."""

import json
import shutil

from paxlite.experiments import base_experiment
from paxlite.pretrained.loading import from_pretrained
from praxis_lite import config as config_lib
from praxis_lite.decoding import beam_search
from tasks.lm.hf import HfCausalLm
from tasks.lm.synthetic import LmSyntheticTiny
from tasks.t5.flan_t5 import FlanT5Small
from tasks.t5.tiny import T5Tiny
from tests import FIXTURES

_HF = FIXTURES / "hf"


def _decoder(experiment) -> object:
    """The experiment's built DecoderParams."""
    decoder = experiment.task().decoder
    return config_lib.instantiate(getattr(decoder, "value", decoder))


def test_t5_experiments_take_t5xs_rules_and_pax_lms_praxis():
    for t5 in (T5Tiny(), FlanT5Small()):
        assert _decoder(t5).length_norm_alpha == beam_search.T5X_LENGTH_NORM_ALPHA == 0.6
    assert _decoder(LmSyntheticTiny()).length_norm_alpha == 0.8


def test_hugging_face_models_take_their_generation_config(tmp_path):
    model = tmp_path / "llama3"
    shutil.copytree(_HF / "llama3", model)
    path = model / "generation_config.json"
    fields = json.loads(path.read_text())
    settings = {"num_beams": 4, "length_penalty": 2.0, "early_stopping": True}
    path.write_text(json.dumps({**fields, **settings, "no_repeat_ngram_size": 3}))
    experiment = base_experiment.with_overrides(
        HfCausalLm, {"HF_MODEL": str(model), "TEXT_DATA_PATH": str(tmp_path / "unread.jsonl")}
    )()
    for params in (_decoder(experiment), from_pretrained(model).generation):
        assert (params.num_beams, params.length_penalty, params.early_stopping) == (4, 2.0, True)
        assert params.no_repeat_ngram_size == 3 and params.length_norm_alpha is None
        assert params.eos_token_id == (318, 317)
