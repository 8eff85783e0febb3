"""T5Tiny end to end: it learns reversal and greedy decoding reproduces it; T5TextTiny trains
on JSONL pairs and decodes them; the T5 knobs are checked."""

from __future__ import annotations

import json

import jax
import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.runtime.job import Job, build_job
from paxlite.train import train_loop
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.synthetic_input import SyntheticLmInput
from tasks.t5.text import T5TextTiny
from tasks.t5.tiny import T5Tiny

#: A 1 + 1 layer model, its stacks not scanned: compiles faster (FlanT5's test trains scanned
#: stacks).
ONE_PLUS_ONE_LAYERS = dict(NUM_ENCODER_LAYERS=1, NUM_DECODER_LAYERS=1, USE_REPEATED_LAYER=False)


def _one_device_job(experiment: type, job_dir, **knobs) -> Job:
    """The experiment with ``knobs``, its job (with its decoder inputs) on one device."""
    exp = base_experiment.with_overrides(experiment, {"ICI_MESH_SHAPE": (1, 1, 1), **knobs})()
    return build_job(
        exp, exp.task(), exp.datasets(), job_dir, jax.devices()[:1], exp.decoder_datasets()
    )


@pytest.mark.slow
def test_t5_tiny_learns_reversal_and_greedy_decoding_reproduces_it(tmp_path):
    """500 steps of a 1 + 1 layer model on one device (inputs of 1..4 tokens), its learning
    rate decayed over them, decoded at the end: exact match 0.875 on our 2-core CPU; chance
    is below 1/28."""
    job = _one_device_job(
        T5Tiny,
        tmp_path,
        **ONE_PLUS_ONE_LAYERS,
        PERCORE_BATCH_SIZE=4,  # Per device of this 8-device process: 32 rows.
        MAX_LEN=4,
        NUM_TRAIN_STEPS=500,
        LR_COS_DECAY_END=500,
        EVAL_INTERVAL_STEPS=0,
        SUMMARY_INTERVAL_STEPS=50,
        CHECKPOINT_EVERY_N_STEPS=500,
    )
    result = train_loop.run(job, evaluate=True, peak_tflops=1.0)
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


@pytest.mark.slow
def test_t5_text_tiny_trains_on_jsonl_pairs_and_decodes_their_inputs(tmp_path):
    """JSONL inputs/targets pairs (bytes: id = byte + 3, EOS 1), no task written: packed
    training rows, one eval pass and a decode of the held-out inputs scored by their
    targets; 10 steps of a 1 + 1 layer model on one device."""
    pairs = [{"src": f"{w}=", "tgt": w[::-1]} for w in ("abc", "hello", "paxlite", "t5", "xy")]
    for name, rows in (("train", pairs * 8), ("eval", pairs[:3])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = _one_device_job(
        T5TextTiny,
        tmp_path / "job",
        TEXT_DATA_PATH=str(tmp_path / "train.jsonl"),
        TEXT_EVAL_DATA_PATH=str(tmp_path / "eval.jsonl"),
        PROMPT_FIELD="src",
        COMPLETION_FIELD="tgt",
        TEXT_TASK_NAME="test_t5_text_pairs",
        **ONE_PLUS_ONE_LAYERS,
        PERCORE_BATCH_SIZE=1,  # Per device of this 8-device process: 8 rows.
        NUM_TRAIN_STEPS=10,
        EVAL_INTERVAL_STEPS=10,
        SUMMARY_INTERVAL_STEPS=1,
        CHECKPOINT_EVERY_N_STEPS=1000,
    )
    batch = job.train_input.get_next()
    assert batch.encoder_segment_ids.max() > 1  # Packed: several pairs a row.
    result = train_loop.run(job, evaluate=True, peak_tflops=1.0)
    losses = [s["loss"] for _, s in result.history]
    assert losses[-1] < losses[0]
    rows = [json.loads(r) for r in (tmp_path / "job/decoder_out/pairs_step10.jsonl").open()]
    assert sorted(r["prompt"] for r in rows) == sorted(p["src"] for p in pairs[:3])
    assert sorted(r["target"] for r in rows) == sorted(p["tgt"] for p in pairs[:3])
    assert result.decode["pairs"]["num_examples"] == 3


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"TASK_FEATURE_LENGTHS": {"inputs": 8}}, "TASK_FEATURE_LENGTHS"),
        ({"PROMPT_FIELD": "x", "COMPLETION_FIELD": "x"}, "both 'x'"),
    ],
)
def test_t5_text_knobs_are_checked(knobs, message):
    with pytest.raises(KnobError, match=message):
        base_experiment.with_overrides(T5TextTiny, {"TEXT_DATA_PATH": "x.jsonl", **knobs})()


def test_an_eval_input_of_the_wrong_kind_stops_the_run_before_it_trains(tmp_path):
    """A decoder-only LM input among a T5 job's eval inputs is named at start-up, before a
    step or a checkpoint, not at the first eval."""
    exp = base_experiment.with_overrides(T5Tiny, {"ICI_MESH_SHAPE": (1, 1, 1)})()
    train_input, _ = exp.datasets()
    lm_eval = config_lib.Config(
        SyntheticLmInput, name="lm_test", batch_size=8, is_training=False, num_batches=1
    )
    job = build_job(exp, exp.task(), [train_input, lm_eval], tmp_path, jax.devices()[:1])
    with pytest.raises(InputConfigError, match=r"^Input 'lm_test' yields batches with .* but "):
        train_loop.run(job, evaluate=True, peak_tflops=1.0)
    assert not [p.name for p in (tmp_path / "checkpoints").glob("[0-9]*")]
