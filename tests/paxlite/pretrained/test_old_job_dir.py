"""A job directory written before the packages moved (tests/fixtures/old_job: its config.json
names ``paxlite.tasks_lib``, ``praxis_lite.models``, ``praxis_lite.optimizers``, ...) still
loads, resumes and exports.

Oracles: the logits and the resumed step's loss that the commit which wrote the job computed
(``expected.npz``, see the fixture's README).
"""

import collections
import shutil

import numpy as np
import pytest

from paxlite.checkpoints import checkpoint_sources
from paxlite.inference import from_pretrained
from paxlite.pretrained import export
from praxis_lite import config as config_lib
from praxis_lite.layers.attentions import AttentionImpl
from tests import FIXTURES
from tests.paxlite.test_main import run_main_in_process, scalar_series

OLD = FIXTURES / "old_job"
#: The knobs the job was written with (its config.txt), its files at this checkout's paths;
#: its batch of 4 rows over 4 data x 2 model shards of this process's 8 devices (was 1 device).
KNOBS = [
    f"--set=HF_MODEL={FIXTURES / 'hf' / 'llama2'}",
    f"--set=TEXT_DATA_PATH={OLD / 'train.txt'}",
    "--set=ICI_MESH_SHAPE=1,4,2",
    "--set=PERCORE_BATCH_SIZE=0.5",
    "--set=MAX_SEQ_LEN=32",
    "--set=LEARNING_RATE=1e-2",
    "--set=CHECKPOINT_EVERY_N_STEPS=2",
    "--set=FPROP_DTYPE=float32",
]


@pytest.fixture
def old_job(tmp_path):
    """A copy of the old job directory (runs write into it; the fixture stays as written)."""
    job = tmp_path / "job"
    shutil.copytree(OLD / "job", job)
    return job


@pytest.fixture
def identified(monkeypatch) -> collections.Counter:
    """How often each path is identified (``checkpoint_sources.identify``, called through)."""
    calls: collections.Counter = collections.Counter()
    identify = checkpoint_sources.identify

    def counted(path):
        calls[str(path)] += 1
        return identify(path)

    monkeypatch.setattr(checkpoint_sources, "identify", counted)
    return calls


@pytest.fixture(scope="module")
def expected():
    return np.load(OLD / "expected.npz")


def test_the_config_names_modules_that_moved():
    """The fixture is what it claims: written with the old module paths."""
    text = (OLD / "job" / "config.json").read_text()
    assert '"paxlite.tasks_lib"' in text and '"praxis_lite.models"' in text
    assert '"praxis_lite.optimizers"' in text and '"praxis_lite.decoding"' in text


def test_its_attention_impl_is_the_string_of_then_read_as_todays_enum():
    text = (OLD / "job" / "config.json").read_text()
    assert '"value": "einsum"' in text and "AttentionImpl" not in text
    block = config_lib.from_json(text)["task"].model.lm_tpl.stacked_transformer_tpl.block_tpl
    assert block.tr_atten_tpl.attention_impl is AttentionImpl.EINSUM


def test_an_old_job_loads_with_the_logits_it_had(old_job, expected, identified):
    """... and from_pretrained identifies the path once (not once per helper it passes)."""
    logits = from_pretrained(old_job).logits(expected["ids"])
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-5, atol=1e-5)
    assert identified == {str(old_job): 1}


@pytest.mark.slow
def test_an_old_job_resumes_where_it_stopped(old_job, expected):
    code, out, err = run_main_in_process(
        f"--job_log_dir={old_job}",
        "--mode=train",
        *KNOBS,
        f"--set=NUM_TRAIN_STEPS={int(expected['resumed_step'])}",
        exp="tasks.lm.hf.HfCausalLm",
    )
    assert code == 0, err[-2000:]
    assert "Restored checkpoint at step 2" in out
    step, loss = scalar_series(old_job / "summaries" / "train", "train/loss")[-1]
    assert step == int(expected["resumed_step"])
    np.testing.assert_allclose(loss, float(expected["resumed_loss"]), rtol=1e-4)


def test_an_old_job_exports_as_hugging_face(old_job, expected, tmp_path, identified):
    out = tmp_path / "exported"
    files = export.export(old_job, out, dtype="float32")
    assert "model.safetensors" in files and "config.json" in files
    identified.clear()
    logits = from_pretrained(out).logits(expected["ids"])
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-5, atol=1e-5)
    assert identified == {str(out): 1}
