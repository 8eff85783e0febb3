"""paxlite.pretrained.loading.from_pretrained: a job (trained here) and a paxml checkpoint (a
fixture paxml's own main.py wrote), their logits and greedy generation, for any number of
prompts on any mesh; what a job fine-tuned from a Hugging Face model kept of it (its tokenizer,
config and chat template: the fine-tuning tests load such jobs)."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from etils import epath

from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.formats.hf import models as hf_models
from paxlite.pretrained import export, loading
from paxlite.pretrained.loading import HfOrigin, PretrainedError, from_pretrained
from paxlite.runtime import job_record
from praxis_lite.tokenizers import hf_chat
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tests import FIXTURES
from tests.gcs import BUCKET
from tests.paxlite.test_main import run_main_in_process

_PAX = FIXTURES / "pax" / "TinyLmCloudSpmd"
_PAX_STEP = _PAX / "checkpoints" / "checkpoint_00000003"
# tools/pax_fixtures/tiny_experiments.py's sizes, as --set strings on Pax's LmCloudSpmd2B.
_PAX_KNOBS = [
    "NUM_LAYERS=2",
    "MODEL_DIMS=32",
    "HIDDEN_DIMS=64",
    "NUM_HEADS=4",
    "DIMS_PER_HEAD=8",
    "VOCAB_SIZE=128",
    "MAX_SEQ_LEN=16",
    "FPROP_DTYPE=float32",
    "ICI_MESH_SHAPE=1,1,1",
]


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    """LmSyntheticTiny trained 60 steps on 8 devices (the progressions become predictable)."""
    job = tmp_path_factory.mktemp("pretrained") / "job"
    code, out, err = run_main_in_process(
        f"--job_log_dir={job}",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=NUM_TRAIN_STEPS=60",
        "--set=LR_COS_DECAY_END=60",
        "--set=LEARNING_RATE=2e-2",
        "--set=CHECKPOINT_EVERY_N_STEPS=30",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--peak_tflops=1",  # No MFU read here: no matmul timed to calibrate the CPU's peak.
    )
    assert code == 0, out + err
    return job


@pytest.mark.slow
def test_a_paxlite_job_generates_what_its_own_logits_say(tiny_job):
    lm = from_pretrained(tiny_job)  # the experiment is read from config.txt; step 60
    assert lm.tokenizer is None and lm.origin is None  # paxlite's own model: nothing kept.
    leaf = jax.tree_util.tree_leaves(lm.params)[0]
    assert leaf.sharding.mesh.devices.size == 8  # placed as training placed it
    prompts = np.array([[3, 5, 7, 9], [10, 13, 16, 19]])
    new = lm.generate(prompts, max_new_tokens=5)
    assert new.shape == (2, 5) and new.dtype.kind == "i"
    # Greedy: each new token is the argmax of the full forward's logits at its position
    # (the KV-cache decode path against the plain forward pass).
    sequence = np.concatenate([prompts, new], axis=1)
    logits = lm.logits(sequence)
    assert logits.shape == (2, 9, 64) and logits.dtype == np.float32
    np.testing.assert_array_equal(logits[:, 3:-1].argmax(-1), new)
    # The trained tiny model continues arithmetic progressions.
    assert (new[0] == [11, 13, 15, 17, 19]).all(), new


@pytest.mark.slow
def test_any_number_of_prompts_on_8_devices_gives_what_1_device_gives(tiny_job):
    """1, 2 and 3 prompts on the 8-device data mesh (padded to 8 rows, the padding dropped)
    against the same checkpoint placed on one device (no padding)."""
    eight = from_pretrained(tiny_job)
    one = from_pretrained(tiny_job, overrides=["ICI_MESH_SHAPE=1,1,1"])
    assert one.mesh.devices.size == 1 and eight.mesh.devices.size == 8
    prompts = np.array([[3, 5, 7, 9], [10, 13, 16, 19], [20, 21, 22, 23]])
    for b in (1, 2, 3):
        new = eight.generate(prompts[:b], max_new_tokens=4)
        assert new.shape == (b, 4)
        np.testing.assert_array_equal(new, one.generate(prompts[:b], max_new_tokens=4))
        logits = eight.logits(prompts[:b])
        assert logits.shape == (b, 4, 64)
        np.testing.assert_allclose(logits, one.logits(prompts[:b]), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"input_ids must be token ids \[B, T\]") as e:
        eight.generate(prompts[0], max_new_tokens=4)  # one prompt, not a batch of one
    assert "\n" not in str(e.value) and "[[3, 5, 7]]" in str(e.value)


@pytest.mark.slow
def test_a_step_dir_and_eos_padding(tiny_job):
    lm = from_pretrained(tiny_job / "checkpoints" / "30")
    prompts = np.array([[3, 5, 7, 9]])
    free = lm.generate(prompts, max_new_tokens=4)
    stopped = lm.generate(prompts, max_new_tokens=4, eos_token_id=int(free[0, 0]), pad_token_id=63)
    assert stopped[0, 0] == free[0, 0] and (stopped[0, 1:] == 63).all(), (free, stopped)


@pytest.mark.slow
def test_a_pax_checkpoint_loads_with_its_experiment_and_gives_praxiss_logits():
    fixture = np.load(_PAX / "logits.npz")
    lm = from_pretrained(
        _PAX_STEP, exp="tasks.lm.params.lm_cloud.LmCloudSpmd2B", overrides=_PAX_KNOBS
    )
    want = fixture["logits"]
    np.testing.assert_allclose(lm.logits(fixture["ids"]), want, atol=1e-4 * np.abs(want).max())
    assert lm.generate(fixture["ids"][:, :4], max_new_tokens=3).shape == (2, 3)


def test_a_pax_checkpoint_without_its_experiment_or_an_empty_dir_is_one_line(tmp_path):
    with pytest.raises(PretrainedError, match="name the experiment") as e:
        from_pretrained(_PAX_STEP)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointSourceError, match="holds no checkpoint paxlite can read"):
        from_pretrained(tmp_path)
    with pytest.raises(CheckpointSourceError) as e:  # Said in its first words.
        from_pretrained(tmp_path / "no_such_job")
    assert (
        str(e.value) == f"{tmp_path / 'no_such_job'} does not exist: no checkpoint to read there."
    )
    assert e.value.__cause__ is None and e.value.__context__ is None


_QWEN2 = FIXTURES / "hf" / "qwen2"  # With a chat template (chat_template.jinja).


def _job_keeping(job: pathlib.Path, names: tuple[str, ...] | None = None) -> pathlib.Path:
    """A job directory holding what a job fine-tuned from the qwen2 fixture keeps
    (``export.kept_files``; only ``names`` of them when given), as its start copies them."""
    for relative, source in export.kept_files(str(_QWEN2)).items():
        if names is None or pathlib.Path(relative).name in names:
            (job / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, job / relative)
    return job


def _origin_of(directory: pathlib.Path) -> HfOrigin:
    """The HfOrigin a Hugging Face directory's own from_pretrained carries."""
    config = json.loads((directory / "config.json").read_text())
    generation = json.loads((directory / "generation_config.json").read_text())
    return HfOrigin(hf_models.FAMILIES[config["model_type"]], config, generation)


def assert_same_tokenizer(ours: HfTokenizer, theirs: HfTokenizer) -> None:
    """Same files, special ids, vocabulary and ids of a few texts."""
    assert ours.files == theirs.files and ours.vocab_size == theirs.vocab_size
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    for text in ("hello", "The river", "abc = cba!", ""):
        assert ours.encode(text) == theirs.encode(text), text


def test_a_job_carries_the_tokenizer_config_and_chat_template_it_kept(tmp_path):
    tokenizer, origin, chat_template = loading._kept_hf(_job_keeping(tmp_path / "job"))
    assert_same_tokenizer(tokenizer, HfTokenizer.from_dir(_QWEN2))
    assert origin == _origin_of(_QWEN2)
    assert chat_template.text == hf_chat.ChatTemplate.from_dir(_QWEN2).text


def test_a_job_that_kept_no_tokenizer_or_nothing_carries_none(tmp_path):
    """A model from its config alone (HF_RANDOM_INIT), a T5 from T5X (config and generation
    config only); a job of paxlite's own model (nothing kept)."""
    configs = _job_keeping(tmp_path / "configs", ("config.json", "generation_config.json"))
    assert loading._kept_hf(configs) == (None, _origin_of(_QWEN2), None)
    assert loading._kept_hf(tmp_path / "own_model") == (None, None, None)


@pytest.mark.slow
def test_a_job_in_a_bucket_carries_its_config_and_no_tokenizer(emulator, tmp_path):
    """The tokenizer reads local files: a job in a bucket loads without it."""
    local = _job_keeping(tmp_path / "job")
    bucket = epath.Path(f"gs://{BUCKET}/kept_job")
    for file in (local / job_record.HF_MODEL_DIR).iterdir():
        (bucket / job_record.HF_MODEL_DIR / file.name).write_bytes(file.read_bytes())
    assert loading._kept_hf(bucket) == (None, _origin_of(_QWEN2), None)
