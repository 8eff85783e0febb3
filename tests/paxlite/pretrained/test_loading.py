"""paxlite.pretrained.loading.from_pretrained: a job (trained here) and a paxml checkpoint (a
fixture paxml's own main.py wrote), their logits and greedy generation, for any number of
prompts on any mesh."""

import jax
import numpy as np
import pytest

from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.pretrained.loading import PretrainedError, from_pretrained
from tests import FIXTURES
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
