"""The decode program: a trained tiny LM continues progressions; JSONL + TensorBoard through
main.py; sharded decoding on 8 devices equals 1 device, also for decoder batches of 1, 2 and 3;
--fdl_set reaches decoder datasets; a bfloat16 run trains and decodes through main.py;
one-line errors without a checkpoint, for LM batches as a decoder dataset, for a pipelined
stack and for Pax's names of decoder fields.

One in-process train_and_eval run of LmSyntheticTiny (80 steps at a higher learning rate,
decoding at 40 and 80) is shared by the tests of this module.
"""

import json
import math
import shutil

import fiddle as fdl
import flax.linen as nn
import jax
import numpy as np
import pytest
from absl import flags
from jax.sharding import NamedSharding, PartitionSpec

from paxlite.cli.overrides import resolve_configs
from paxlite.evaluation import decode_lib, decode_run
from paxlite.experiments.base_experiment import with_overrides
from paxlite.runtime import partitioning
from paxlite.runtime.job import build_job
from paxlite.train import train_loop, train_setup
from praxis_lite.decoding.sampling import DecoderParams
from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyPipeline
from tests.paxlite.test_main import (
    EXP,
    main_in_process,
    restore_params,
    run_main,
    scalar_series,
)

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

NAME = "progressions"


STEPS = 80  # At 2e-2 as many as greedy decoding needs to continue every progression.
FAST = {
    "PERCORE_BATCH_SIZE": 2,  # conftest gives 8 devices; keep the batch of 16 on any mesh here.
    "NUM_TRAIN_STEPS": STEPS,
    "LR_COS_DECAY_END": STEPS,  # The cosine ends with the run (the tiny's own ends at 300).
    "LEARNING_RATE": 2e-2,
    "EVAL_INTERVAL_STEPS": 0,
    "CHECKPOINT_EVERY_N_STEPS": STEPS,
    "SUMMARY_INTERVAL_STEPS": STEPS,
}


def _experiment(**knobs):
    return with_overrides(LmSyntheticTiny, {**FAST, **knobs})()


def _job(job_dir, devices, decode_interval_steps=0, **knobs):
    exp = _experiment(**knobs)
    task_cfg = exp.task()
    task_cfg.decode_interval_steps = decode_interval_steps
    train_only = [cfg for cfg in exp.datasets() if cfg.is_training]  # no eval: faster
    return build_job(
        exp, task_cfg, train_only, job_dir, devices, decoder_dataset_cfgs=exp.decoder_datasets()
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("decode") / "job"
    job = _job(job_dir, jax.devices()[:1], decode_interval_steps=STEPS // 2)
    result = train_loop.run(job, evaluate=True, peak_tflops=1.0)  # (No MFU calibration.)
    return job_dir, result


def _progression_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _continues(row, vocab=64):
    """The decoded ids continue the prompt's arithmetic progression (mod vocab)."""
    prompt = row["prompt_ids"]
    stride = (prompt[1] - prompt[0]) % vocab
    want = [(prompt[-1] + stride * (i + 1)) % vocab for i in range(len(row["target_ids"]))]
    return row["decoded_ids"] == want


@pytest.mark.slow
def test_greedy_decoding_of_the_trained_model_continues_the_progressions(trained):
    job_dir, result = trained
    metrics = result.decode[NAME]
    assert metrics["num_examples"] == 16
    assert metrics["exact_match"] >= 0.9, metrics
    assert metrics["token_accuracy"] >= 0.95, metrics
    # The interval hook decoded half-way and at the end.
    outputs = sorted(p.name for p in (job_dir / "decoder_out").iterdir())
    assert outputs == sorted([f"{NAME}_step{STEPS}.jsonl", f"{NAME}_step{STEPS // 2}.jsonl"])
    rows = _progression_rows(job_dir / "decoder_out" / f"{NAME}_step{STEPS}.jsonl")
    assert len(rows) == 16 and {len(r["prompt_ids"]) for r in rows} >= {3, 8}
    # The continuation rule, checked from the prompts alone (not against the targets).
    assert np.mean([_continues(r) for r in rows]) >= 0.9
    for row in rows:
        assert row["decoded"] == " ".join(map(str, row["decoded_ids"]))
        assert len(row["decoded_ids"]) == len(row["log_probs"]) == 8
        assert math.isclose(row["score"], sum(row["log_probs"]), abs_tol=1e-4)
        assert all(lp <= 0 for lp in row["log_probs"])


@pytest.mark.slow
def test_decode_through_main_writes_jsonl_and_metrics(trained):
    job_dir, _ = trained
    out = job_dir / "decoder_out" / f"{NAME}_step{STEPS}.jsonl"
    out.unlink()
    proc = run_main(f"--job_log_dir={job_dir}", "--mode=decode")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Restored the parameters of step {STEPS}" in proc.stdout
    assert f"decode '{NAME}' at step {STEPS}: 16 examples" in proc.stdout
    rows = _progression_rows(out)
    assert len(rows) == 16
    assert set(rows[0]) == {
        "prompt",
        "prompt_ids",
        "decoded",
        "decoded_ids",
        "target",
        "target_ids",
        "log_probs",
        "score",
    }
    exact = np.mean([r["decoded"] == r["target"] for r in rows])
    series = scalar_series(job_dir / "summaries" / f"decode_{NAME}", f"decode_{NAME}/exact_match")
    # In-process decodes half-way and at the end, then main.py's at the end (from its JSONL).
    assert [s for s, _ in series] == [STEPS // 2, STEPS, STEPS]
    assert series[-1][1] == pytest.approx(exact)
    assert scalar_series(job_dir / "summaries" / f"decode_{NAME}", f"decode_{NAME}/mean_score")


@pytest.mark.slow
def test_sharded_decoding_on_8_devices_matches_1_device(trained, tmp_path):
    _, result = trained
    params = jax.device_get(result.state.params)
    # Temperature sampling with top-k and EOS: the same key gives the same draws on any mesh.
    dparams = DecoderParams(do_sample=True, top_k=5, eos_token_id=7)
    outputs = []
    for devices, ici in ((jax.devices()[:1], (1, 1, 1)), (jax.devices(), (1, 2, 4))):
        job = _job(tmp_path / str(len(devices)), devices, ICI_MESH_SHAPE=ici)
        batch = job.experiment.decoder_datasets()
        inp = partitioning.instantiate_input(batch[0])
        host_batch = inp.get_next()
        sharding = job.batch_sharding
        with jax.set_mesh(job.mesh), nn.logical_axis_rules(job.rules):
            sample = partitioning.to_global(job.train_input.get_next(), sharding)
            _, state_shardings = train_setup.abstract_train_state(job, sample)
            sharded = jax.device_put(params, state_shardings.params)
            w_q = sharded["lm"]["transformer"]["repeat"]["block"]["self_attention"]["w_q"]
            assert len(w_q.sharding.device_set) == len(devices)
            replicated = NamedSharding(job.mesh, PartitionSpec())
            fn = jax.jit(
                decode_lib.make_decode_fn(job.task, dparams, 8),
                in_shardings=(state_shardings.params, sharding, replicated),
                out_shardings=replicated,
            )
            out = fn(sharded, partitioning.to_global(host_batch, sharding), jax.random.key(3))
        outputs.append(jax.device_get(out))
    one, eight = outputs
    np.testing.assert_array_equal(one["tokens"], eight["tokens"])
    np.testing.assert_array_equal(one["lengths"], eight["lengths"])
    np.testing.assert_allclose(one["scores"], eight["scores"], rtol=1e-4, atol=1e-5)
    # Sampling (temperature 1, top-k 5) drew off the progressions somewhere, so this
    # compared more than argmax; and EOS (id 7) stopped some rows early.
    continued = [
        _continues({"prompt_ids": list(p[:n]), "decoded_ids": list(t), "target_ids": t})
        for p, n, t in zip(one["prefix_ids"], one["prefix_lengths"], one["tokens"], strict=True)
    ]
    assert not all(continued) and np.any(one["lengths"] < 8)


@pytest.mark.slow
def test_decoder_batches_of_1_2_3_on_8_devices_decode_as_on_1_device(trained, tmp_path):
    """--mode=decode (decode_run.run) on the 8-device data mesh with decoder batches of 1, 2
    and 3 prompts (padded to 8 rows, the padding dropped): every row as one 1-device decode
    of all 6 prompts in one batch gives it."""
    job_dir, result = trained
    shutil.copytree(job_dir / "checkpoints", tmp_path / "checkpoints")  # step STEPS
    exp = _experiment(ICI_MESH_SHAPE=(1, 8, 1))
    task_cfg, datasets, decoders = resolve_configs(exp, [], [])
    decoders = [fdl.copy_with(decoders[0], batch_size=b, name=f"b{b}", seed=b) for b in (1, 2, 3)]
    train_only = [cfg for cfg in datasets if cfg.is_training]
    job = build_job(exp, task_cfg, train_only, tmp_path, decoder_dataset_cfgs=decoders)
    assert partitioning.batch_ways(job.batch_sharding) == 8
    metrics = decode_run.run(job).decode
    rows = {
        b: _progression_rows(tmp_path / "decoder_out" / f"b{b}_step{STEPS}.jsonl")
        for b in (1, 2, 3)
    }
    assert [metrics[f"b{b}"]["num_examples"] for b in (1, 2, 3)] == [1, 2, 3]
    assert [len(rows[b]) for b in (1, 2, 3)] == [1, 2, 3]

    one = _job(tmp_path / "one", jax.devices()[:1])
    host = [partitioning.instantiate_input(cfg).get_next() for cfg in decoders]
    batch = jax.tree_util.tree_map(lambda *x: np.concatenate(x), *host)
    with one.scope():
        fn = jax.jit(decode_lib.make_decode_fn(one.task, DecoderParams(), 8))
        want = jax.device_get(fn(result.state.params, batch, jax.random.key(0)))
    got = [row for b in (1, 2, 3) for row in rows[b]]
    for i, row in enumerate(got):
        assert row["prompt_ids"] == list(want["prefix_ids"][i, : want["prefix_lengths"][i]])
        assert row["decoded_ids"] == list(want["tokens"][i, : want["lengths"][i]]), i
        assert row["score"] == pytest.approx(float(want["scores"][i]), rel=1e-4, abs=1e-4)


def _main_here(*argv: str) -> None:
    """``paxlite.main.main`` in this process (8 CPU devices); any exit fails the test."""
    from paxlite import main

    try:
        flags.FLAGS(["paxlite", f"--exp={EXP}", *argv])
        main.main(["paxlite"])
    finally:
        flags.FLAGS.unparse_flags()


@pytest.mark.slow
def test_a_bfloat16_run_trains_and_decodes_through_main(tmp_path, capsys):
    """--set=FPROP_DTYPE=bfloat16: bfloat16 compute (float32 weights) trains (the loss falls
    clearly in 40 steps) and --mode=decode restores it and writes its JSONL."""
    job = tmp_path / "job"
    steps = 40
    knobs = [
        "--set=FPROP_DTYPE=bfloat16",
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=ICI_MESH_SHAPE=1,8,1",
    ]
    _main_here(
        f"--job_log_dir={job}",
        "--mode=train",
        *knobs,
        f"--set=NUM_TRAIN_STEPS={steps}",
        "--set=LEARNING_RATE=1e-2",
        "--set=SUMMARY_INTERVAL_STEPS=5",
        f"--set=CHECKPOINT_EVERY_N_STEPS={steps}",
        "--set=EVAL_INTERVAL_STEPS=0",
    )
    config = (job / "config.txt").read_text()
    fprop = [line for line in config.splitlines() if "fprop_dtype" in line]
    assert fprop and all("bfloat16" in line for line in fprop), fprop
    losses = [v for _, v in scalar_series(job / "summaries" / "train", "train/loss")]
    assert len(losses) == steps // 5 and np.isfinite(losses).all()
    assert losses[-1] < 0.6 * losses[0], losses  # losses[0]: the summary at step 5
    params = restore_params(job, steps)
    assert {np.asarray(x).dtype for x in jax.tree_util.tree_leaves(params)} == {
        np.dtype(np.float32)
    }

    _main_here(f"--job_log_dir={job}", "--mode=decode", *knobs)
    assert f"Restored the parameters of step {steps}" in capsys.readouterr().out
    rows = _progression_rows(job / "decoder_out" / f"{NAME}_step{steps}.jsonl")
    assert len(rows) == 16
    for row in rows:
        assert len(row["decoded_ids"]) == len(row["log_probs"]) == 8
        assert all(0 <= t < 64 for t in row["decoded_ids"])
        assert all(np.isfinite(lp) and lp <= 0 for lp in row["log_probs"])
        assert math.isclose(row["score"], sum(row["log_probs"]), abs_tol=1e-3)
    # Decoded in bfloat16, most rows already continue their progression (from the prompts).
    assert np.mean([_continues(r) for r in rows]) >= 0.5


def test_decode_without_a_checkpoint_is_one_clear_error(tmp_path):
    job = _job(tmp_path / "empty", jax.devices()[:1])
    with pytest.raises(FileNotFoundError, match="--mode=decode needs a checkpoint"):
        decode_run.run(job)


@pytest.mark.slow
def test_fdl_set_reaches_a_decoder_dataset(trained):
    """decoder_datasets[i].field overrides build the decoder inputs that run() decodes."""
    job_dir, _ = trained
    exp = _experiment()
    task_cfg, datasets, decoders = resolve_configs(
        exp, ["decoder_datasets[0].num_batches=2", "decoder_datasets[0].name='twice'"], []
    )
    train_only = [cfg for cfg in datasets if cfg.is_training]
    job = build_job(
        exp, task_cfg, train_only, job_dir, jax.devices()[:1], decoder_dataset_cfgs=decoders
    )
    assert [(i.name, i.num_batches) for i in job.decoder_inputs] == [("twice", 2)]
    metrics = decode_run.run(job).decode
    assert list(metrics) == ["twice"] and metrics["twice"]["num_examples"] == 32
    assert len(_progression_rows(job_dir / "decoder_out" / f"twice_step{STEPS}.jsonl")) == 32


@pytest.mark.slow
def test_lm_batches_as_a_decoder_dataset_is_one_error_line(tmp_path):
    """Checked when the job is built, before any checkpoint is looked for."""
    proc = run_main(
        f"--job_log_dir={tmp_path / 'job'}",
        "--mode=decode",
        "--fdl_set=decoder_datasets[0].prompt_len=0",  # LM batches: ids, labels, ...
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("paxlite: error:")]
    assert (
        "Decoder input 'progressions' (SyntheticLmInput) yields batches without prefix_ids, "
        "prefix_lengths, target_ids, target_lengths (it has ids, labels, paddings, weights)"
    ) in line
    assert "prompt_len > 0" in line and "decode_form" in line


def test_pipelined_stack_cannot_decode_one_clear_error(tmp_path):
    exp = LmSyntheticTinyPipeline()
    devices = jax.devices()[:2]
    with pytest.raises(decode_lib.DecodeConfigError) as e:  # a ValueError: main.py exits 2
        build_job(exp, exp.task(), exp.datasets(), tmp_path, devices, exp.decoder_datasets())
    message = str(e.value)
    assert "\n" not in message
    assert "not supported for the LayerwiseShardablePipelined stack" in message
    assert "--set=NUM_STAGES=1" in message and "--set=ICI_MESH_SHAPE=1,1,2,1" in message
    # The suggestion builds a decoding job whose parameters are the pipelined ones
    # (same names and shapes), so the pipelined checkpoint restores into it.
    plain = with_overrides(
        LmSyntheticTinyPipeline, {"NUM_STAGES": 1, "ICI_MESH_SHAPE": (1, 1, 2, 1)}
    )()
    jobs = [
        build_job(exp, exp.task(), exp.datasets(), tmp_path, devices),
        build_job(
            plain, plain.task(), plain.datasets(), tmp_path, devices, plain.decoder_datasets()
        ),
    ]
    shapes = []
    for job in jobs:
        sample = job.train_input.get_next()
        with jax.set_mesh(job.mesh), nn.logical_axis_rules(job.rules):
            abstract, _ = train_setup.abstract_train_state(
                job, partitioning.to_global(sample, job.batch_sharding)
            )
        shapes.append(jax.tree_util.tree_map(lambda x: x.shape, abstract.params))
    assert shapes[0] == shapes[1]


def set_pax_eos_id(task_cfg) -> None:
    """A fiddler (``--fiddler``) that edits the task as an experiment's task() would."""
    task_cfg.decoder.eos_id = 1


@pytest.mark.parametrize(
    "flag, old, new",
    [
        ("--fdl_set=task.decoder.max_decode_steps=4", "max_decode_steps", "max_new_tokens"),
        ("--fdl_set=task.decoder.eos_id=1", "eos_id", "eos_token_id"),
        ("--fdl_set=task.decoder.pad_id=0", "pad_id", "pad_token_id"),
        (f"--fiddler={__name__}.set_pax_eos_id", "eos_id", "eos_token_id"),
        ("--fdl_set=task.decoder.beam_size=4", "beam_size", "num_beams"),
    ],
)
def test_pax_names_of_decoder_fields_are_one_error_line(tmp_path, flag, old, new):
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", flag)
    assert code == 2, stderr[-2000:]
    assert stderr.startswith("paxlite: error: ") and stderr.count("\n") == 1, stderr
    assert f"DecoderParams: {old} is now {new} (Hugging Face's name)." in stderr
    assert not job.exists()


@pytest.mark.slow
def test_beam_search_through_decode_run_on_8_devices_writes_the_n_best(trained, tmp_path):
    """task.decoder.num_beams / num_return_sequences (--fdl_set) on the data 2 x mdl 4 mesh:
    the JSONL gains each example's n best with scores, best first, and they equal a
    1-device beam search of the same prompts."""
    job_dir, result = trained
    shutil.copytree(job_dir / "checkpoints", tmp_path / "checkpoints")  # step STEPS
    exp = _experiment(ICI_MESH_SHAPE=(1, 2, 4))
    beams = ["num_beams=3", "num_return_sequences=2", "eos_token_id=7"]
    beams += ["length_norm_alpha=None", "length_penalty=0.5"]  # HF's rules, not praxis'.
    task_cfg, datasets, decoders = resolve_configs(
        exp, [f"task.decoder.{b}" for b in beams] + ["decoder_datasets[0].num_batches=1"], []
    )
    train_only = [cfg for cfg in datasets if cfg.is_training]
    job = build_job(exp, task_cfg, train_only, tmp_path, decoder_dataset_cfgs=decoders)
    decode_run.run(job)
    rows = _progression_rows(tmp_path / "decoder_out" / f"{NAME}_step{STEPS}.jsonl")
    assert len(rows) == 16

    one = _job(tmp_path / "one", jax.devices()[:1])
    batch = partitioning.instantiate_input(decoders[0]).get_next()
    params = DecoderParams(num_beams=3, num_return_sequences=2, length_penalty=0.5, eos_token_id=7)
    with one.scope():
        fn = jax.jit(decode_lib.make_decode_fn(one.task, params, 8))
        want = jax.device_get(fn(result.state.params, batch, jax.random.key(0)))
    assert want["tokens"].shape == (16, 2, 8)
    for i, row in enumerate(rows):
        assert len(row["n_best"]) == 2
        assert row["n_best"][0]["score"] >= row["n_best"][1]["score"]
        assert row["decoded_ids"] == row["n_best"][0]["decoded_ids"]
        assert row["score"] == row["n_best"][0]["score"]
        for j, seq in enumerate(row["n_best"]):
            assert seq["decoded_ids"] == list(want["tokens"][i, j, : want["lengths"][i, j]])
            assert seq["score"] == pytest.approx(float(want["scores"][i, j]), rel=1e-4)


def test_contradicting_beam_settings_are_one_error_line(tmp_path):
    job = tmp_path / "job"
    code, stderr = main_in_process(
        f"--job_log_dir={job}",
        "--mode=decode",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--fdl_set=task.decoder.length_penalty=1.0",
        "--fdl_set=task.decoder.length_norm_alpha=0.6",
    )
    assert code == 2, stderr[-2000:]
    assert stderr.startswith("paxlite: error: ") and stderr.count("\n") == 1, stderr
    assert "set length_penalty" in stderr and "not both" in stderr
    assert not job.exists()
