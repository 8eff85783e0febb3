"""The classification MLP family through the real CLI, in this process (8 CPU devices).

MlpSyntheticTiny trains with the unchanged trainer: its loss falls, eval and MFU
summaries and checkpoints are written, and the compile dry run counts its FLOPs.
"""

import math

import pytest

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError, with_overrides
from tasks.lm import classification
from tests.paxlite.test_main import run_main_in_process, scalar_series

EXP = "MlpSyntheticTiny"
# The 8 devices of the test process on the 'data' axis, 4 examples each: a global batch of
# 32 as on one device.
EIGHT_DEVICES = ["--set=ICI_MESH_SHAPE=1,8,1", "--set=PERCORE_BATCH_SIZE=4"]
SHORT = [
    "--set=NUM_TRAIN_STEPS=60",
    "--set=SUMMARY_INTERVAL_STEPS=20",
    "--set=CHECKPOINT_EVERY_N_STEPS=30",
    "--set=EVAL_INTERVAL_STEPS=30",
]


def test_short_name_resolves():
    found = registry.get(EXP, search_packages=("tasks",))
    assert found is classification.MlpSyntheticTiny


@pytest.mark.slow
def test_train_and_eval_end_to_end(tmp_path):
    job = tmp_path / "job"
    code, stdout, stderr = run_main_in_process(
        f"--job_log_dir={job}",
        "--mode=train_and_eval",
        "--peak_tflops=1",
        *EIGHT_DEVICES,
        *SHORT,
        exp=EXP,
    )
    assert code == 0, stderr[-3000:]
    assert "step      60/60" in stdout

    train = job / "summaries" / "train"
    losses = scalar_series(train, "train/loss")
    assert [s for s, _ in losses] == [20, 40, 60]
    # Progressions with strides 1..3: a token tells its label up to the stride, so the loss
    # falls from log(64) towards log(3).
    assert losses[-1][1] < 0.5 * losses[0][1] and losses[-1][1] < math.log(64) / 2
    assert all(0.0 < v <= 1.0 for _, v in scalar_series(train, "train/accuracy"))
    assert all(v > 0.0 for _, v in scalar_series(train, "train/mfu"))
    evals = scalar_series(job / "summaries" / "eval_test", "eval_test/loss")
    assert [s for s, _ in evals] == [30, 60]
    steps = sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [30, 60]


def test_compile_dry_run_counts_model_flops():
    code, stdout, stderr = run_main_in_process("--mode=compile", *EIGHT_DEVICES, exp=EXP)
    assert code == 0, stderr[-3000:]
    # 5120 MLP weights + 128 biases, the 64 x 64 table and its 64 logit biases (praxis's).
    assert "for 8 fake CPU devices" in stdout and "parameters:             9,408" in stdout
    # Per step of 32 x 16 tokens: 6N = 6 * N_mlp * tokens, N_mlp = 64*32 + 32*32 + 32*64.
    assert f"6N {6 * 5120 * 32 * 16:.4g}" in stdout
    assert f"causal {6 * (5120 + 64 * 64) * 32 * 16:.4g}" in stdout


@pytest.mark.parametrize(
    "overrides, message",
    [({"OUTPUT_DIM": 32}, "set OUTPUT_DIM to INPUT_DIM"), ({"NUM_LAYER": 0}, "at least 1")],
)
def test_bad_knobs_fail_clearly(overrides, message):
    with pytest.raises(KnobError, match=message):
        with_overrides(classification.MlpSyntheticTiny, overrides)()


def test_pax_defaults():
    """Pax's ClassificationModelAdam knobs (the family base keeps them)."""
    base = classification.ClassificationModelAdam
    assert (base.NUM_LAYER, base.INPUT_DIM, base.HIDDEN_DIM, base.OUTPUT_DIM) == (
        8,
        4096,
        7168,
        4096,
    )
    assert (base.LEARNING_RATE, base.WEIGHT_DECAY, base.NUM_TRAIN_STEPS) == (1e-3, 1e-3, 10)
    assert base.SUMMARY_INTERVAL_STEPS == base.CHECKPOINT_EVERY_N_STEPS == 5
