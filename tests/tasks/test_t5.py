"""T5Tiny end to end: it learns reversal and greedy decoding reproduces it; the T5 knobs are
checked."""

from __future__ import annotations

import jax
import pytest

from paxlite import base_experiment, train
from paxlite.base_experiment import KnobError
from paxlite.job import build_job
from tasks.t5.tiny import T5Tiny


def _job(job_dir, devices, **knobs):
    exp = base_experiment.with_overrides(T5Tiny, knobs)()
    return build_job(exp, exp.task(), exp.datasets(), job_dir, devices, exp.decoder_datasets())


def test_t5_tiny_learns_reversal_and_greedy_decoding_reproduces_it(tmp_path):
    """500 steps on one device (inputs of 1..4 tokens), decoded at the end: exact match
    0.75 on our 2-core CPU; chance is below 1/28."""
    knobs = dict(
        ICI_MESH_SHAPE=(1, 1, 1),
        PERCORE_BATCH_SIZE=4,  # Per device of this 8-device process: 32 rows.
        MAX_LEN=4,
        NUM_TRAIN_STEPS=500,
        EVAL_INTERVAL_STEPS=0,
        SUMMARY_INTERVAL_STEPS=50,
        CHECKPOINT_EVERY_N_STEPS=500,
    )
    job = _job(tmp_path, jax.devices()[:1], **knobs)
    result = train.run(job, evaluate=True, peak_tflops=1.0)
    losses = [s["loss"] for _, s in result.history]
    decoded = result.decode["reversals"]
    assert losses[-1] < losses[0] / 5, losses
    assert decoded["exact_match"] >= 0.5 and decoded["num_examples"] == 32, decoded
    rows = (tmp_path / "decoder_out" / "reversals_step500.jsonl").read_text().splitlines()
    assert len(rows) == 32


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"MLP_ACTIVATIONS": ("gelu", "tanh")}, "MLP_ACTIVATIONS"),
        ({"NUM_HEADS": 3}, "not divisible by NUM_HEADS"),
        ({"NUM_DECODER_LAYERS": 0}, "NUM_DECODER_LAYERS = 0"),
        ({"ICI_MESH_SHAPE": (1, 1, 8), "NUM_HEADS": 4}, "NUM_HEADS=4 does not split evenly"),
    ],
)
def test_knobs_are_checked(knobs, message):
    with pytest.raises(KnobError, match=message):
        base_experiment.with_overrides(T5Tiny, knobs)()
