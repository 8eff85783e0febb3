"""Constant-time resume of a file input: each host saves its tf.data reader's position (and
the batches the prefetcher read ahead) beside each checkpoint; a resumed run reads exactly
the batches an uninterrupted run reads, without re-reading the stream."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf
from etils import epath

from paxlite.checkpoints import input_positions
from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import prefetch, train_loop
from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.seqio_input import SeqIOInput
from tasks.lm.text import LmTextTiny, TextFormat
from tests.gcs import BUCKET
from tests.paxlite.test_main import REPO, assert_ended_cleanly, main_in_process, restore_params
from tests.praxis_lite.inputs.test_seqio_input import assert_batches_equal
from tests.processes import cpu_env, free_port, run_together
from tests.tasks.lm.test_text import FAST, write

T = 24
READS = {"documents": 0}  # Documents the counted task's pipeline has read, in this process.


def _count(line: bytes) -> bytes:
    READS["documents"] += 1
    return line


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> str:
    """'counted_lm': 4 files of 200 one-line documents, shuffled (a 64-document buffer);
    every document read passes through Python, which counts it."""
    root = tmp_path_factory.mktemp("counted")
    for f in range(4):
        docs = (f"f{f} d{i} " + "abc"[i % 3] * (i % 11) for i in range(200))
        (root / f"train-{f}.txt").write_text("\n".join(docs))

    def counted(ds):
        def one(line):
            text = tf.numpy_function(_count, [line], tf.string, stateful=False)
            text.set_shape([])
            return {"targets": text}

        return ds.map(one)

    seqio.TaskRegistry.remove("counted_lm")
    seqio.TaskRegistry.add(
        "counted_lm",
        source=seqio.TextLineDataSource({"train": str(root / "train-*.txt")}),
        preprocessors=[counted, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)},
        shuffle_buffer_size=64,
    )
    return "counted_lm"


def make(task: str, **kwargs) -> SeqIOInput:
    kwargs.setdefault("feature_converter_pack", True)
    kwargs.setdefault("seed", 7)
    return SeqIOInput(
        mixture_name=task, batch_size=4, task_feature_lengths={"targets": T}, **kwargs
    )


@pytest.fixture(scope="module")
def expected(task) -> list:
    """The first 10 batches of an uninterrupted ``make(task)``: the stream resumed runs must
    read (read once for the tests that compare with it; none of them changes it)."""
    reference = make(task)
    return [reference.get_next() for _ in range(10)]


@pytest.mark.slow
def test_a_saved_position_resumes_exactly_without_re_reading_the_stream(task, tmp_path):
    kwargs = dict(num_infeed_hosts=2, infeed_host_index=1)
    run = make(task, **kwargs)
    before = READS["documents"]
    for _ in range(120):
        run.get_next()
    read_to_get_there = READS["documents"] - before
    assert run.save_position(str(tmp_path))
    state = json.loads(json.dumps(run.get_state()))
    expected = [run.get_next() for _ in range(3)]  # The uninterrupted run's next batches.

    resumed = make(task, **kwargs)
    before = READS["documents"]
    resumed.restore_position(str(tmp_path), state)
    first = resumed.get_next()
    read_to_resume = READS["documents"] - before
    assert_batches_equal([first, resumed.get_next(), resumed.get_next()], expected)
    assert resumed.get_state()["num_batches"] == 123
    # The reader starts where it was (the shuffle buffer comes back from the saved state):
    # it reads a few documents ahead, not the 120 batches' worth again.
    assert read_to_resume < read_to_get_there / 10, (read_to_resume, read_to_get_there)


@pytest.mark.slow
def test_the_prefetchers_read_ahead_batches_are_saved_and_replayed_first(task, expected, tmp_path):
    job_dir = epath.Path(tmp_path)
    with prefetch.Prefetcher(make(task), lambda b: b, depth=3) as batches:
        taken = [batches.next() for _ in range(4)]
        batches.save_position(lambda inp, pending: input_positions.save(job_dir, 4, inp, pending))
        state = batches.input_state()
    assert_batches_equal(taken, expected[:4])
    assert state["num_batches"] == 4
    assert (input_positions.host_dir(job_dir, 4) / "pending.npz").exists()

    resumed = make(task)
    replay = input_positions.restore(job_dir, 4, resumed)
    assert replay  # The thread had read ahead of the 4 batches taken.
    with prefetch.Prefetcher(resumed, lambda b: b, replay=replay) as batches:
        assert_batches_equal([batches.next() for _ in range(6)], expected[4:])
        assert batches.input_state()["num_batches"] == 10


def test_nothing_saved_for_this_host_means_the_input_re_reads_to_its_state(task, tmp_path):
    assert input_positions.restore(epath.Path(tmp_path), 7, make(task)) is None


@pytest.mark.slow
def test_a_state_saved_by_another_number_of_hosts_stops_with_one_line(task, tmp_path):
    two_hosts = make(task, num_infeed_hosts=2, infeed_host_index=0)
    two_hosts.get_next()
    assert two_hosts.save_position(str(tmp_path))
    for resume in (
        lambda inp: inp.restore_position(str(tmp_path), two_hosts.get_state()),
        lambda inp: inp.set_state(two_hosts.get_state()),
    ):
        with pytest.raises(InputConfigError, match="resume with 2 processes") as e:
            resume(make(task))
        assert "\n" not in str(e.value) and "this run has 1" in str(e.value)


@pytest.mark.slow
def test_a_changed_num_batches_to_skip_moves_the_restored_stream(task, expected, tmp_path):
    """Pax's TRAINING_NUM_BATCHES_TO_SKIP set for the resume (to step past bad data): the
    stream goes on that many batches after the saved count, as a re-read would."""
    run = make(task)
    run.get_next(), run.get_next()
    assert run.save_position(str(tmp_path))
    moved = make(task, num_batches_to_skip=3)
    moved.restore_position(str(tmp_path), run.get_state())
    assert_batches_equal([moved.get_next() for _ in range(3)], expected[5:8])


def _text_experiment(path: str, **knobs) -> LmTextTiny:
    settings = {
        **FAST,
        "TEXT_DATA_PATH": path,
        "TEXT_FORMAT": TextFormat.JSONL,
        "TEXT_TASK_NAME": "resume_jsonl",
        "NUM_TRAIN_STEPS": 6,
        "CHECKPOINT_EVERY_N_STEPS": 2,
        "CHECKPOINT_MAX_TO_KEEP": 2,
        "DROPOUT_PROB": 0.1,
        **knobs,
    }
    return base_experiment.with_overrides(LmTextTiny, settings)()


@pytest.mark.slow
def test_a_text_run_stopped_and_resumed_equals_an_uninterrupted_one(tmp_path, capsys):
    """LmTextTiny on JSONL (a Python parser in the pipeline), shuffled and packed: stopped at
    step 3 (between two saves) and resumed from its saved reader position, its final
    parameters are bit-equal to an uninterrupted run's."""
    docs = [f"doc {i}: " + "the cat sat on the mat " * (1 + i % 4) for i in range(300)]
    exp = _text_experiment(write(tmp_path, TextFormat.JSONL, docs))

    def run(job_dir, **kwargs):
        job = build_job(exp, exp.task(), exp.datasets(), job_dir)
        return train_loop.run(job, peak_tflops=1.0, **kwargs)

    run(tmp_path / "straight")
    run(tmp_path / "stopped", stop_at_step=3)
    positions = tmp_path / "stopped" / "checkpoints" / input_positions.DIRNAME
    assert (positions / "3" / "host_0_of_1" / "iterator.index").exists()
    capsys.readouterr()
    run(tmp_path / "stopped")
    assert "input: its saved reader position" in capsys.readouterr().out

    a, b = restore_params(tmp_path / "straight", 6), restore_params(tmp_path / "stopped", 6)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # Positions of deleted checkpoints (2 and 3 of the stopped run) are pruned (one may
    # outlive its checkpoint by a save).
    kept = {
        int(p.name) for p in (tmp_path / "stopped" / "checkpoints").iterdir() if p.name.isdigit()
    }
    saved = {int(p.name) for p in positions.iterdir()}
    assert kept <= saved and len(saved) <= len(kept) + 1, (kept, saved)


@pytest.mark.slow
def test_positions_are_saved_to_and_restored_from_a_bucket(emulator, task, expected):
    """A ``gs://`` job dir (fake-gcs-server on loopback): the same files through epath."""
    checkpoint_dir = epath.Path(f"gs://{BUCKET}/positions/checkpoints")
    run = make(task)
    for _ in range(3):
        run.get_next()
    assert input_positions.save(checkpoint_dir, 3, run, [])
    assert (input_positions.host_dir(checkpoint_dir, 3) / "iterator.index").exists()

    resumed = make(task)
    assert input_positions.restore(checkpoint_dir, 3, resumed) == []
    assert_batches_equal([resumed.get_next() for _ in range(3)], expected[3:6])
    input_positions.prune(checkpoint_dir, {5})
    assert not input_positions.host_dir(checkpoint_dir, 3).exists()


@pytest.mark.slow
def test_two_hosts_save_their_own_positions_and_one_process_cannot_resume_them(tmp_path):
    """Each of 2 processes saves its own reader position; resuming the job with 1 process
    stops with one line naming the 2 it needs, and nothing in the job dir is lost."""
    data = write(
        tmp_path, TextFormat.LINES, [f"document {i} " + "abc " * (i % 9) for i in range(80)]
    )
    job = tmp_path / "job"
    knobs = [
        "--exp=tasks.lm.text.LmTextTiny",
        f"--job_log_dir={job}",
        f"--set=TEXT_DATA_PATH={data}",
        "--set=CHECKPOINT_EVERY_N_STEPS=2",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--peak_tflops=1",
    ]
    port = free_port()
    commands = [
        [sys.executable, "-m", "paxlite.main", *knobs, "--set=NUM_TRAIN_STEPS=2"]
        + ["--set=PERCORE_BATCH_SIZE=2", "--set=ICI_MESH_SHAPE=1,2,1"]
        + ["--set=DCN_MESH_SHAPE=2,1,1", f"--coordinator_address=127.0.0.1:{port}"]
        + ["--num_processes=2", f"--process_id={i}", "--distributed_timeout_s=120"]
        for i in range(2)
    ]
    # Compiled with most of XLA's optimizations off (about 4 s of CPU less in each):
    # the test reads where each host's input stopped, not how fast the step runs.
    env = cpu_env(2, JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    for result in run_together(commands, REPO, env, timeout=400):
        assert_ended_cleanly(result)
    step = job / "checkpoints" / input_positions.DIRNAME / "2"
    assert sorted(p.name for p in step.iterdir()) == ["host_0_of_2", "host_1_of_2"]

    before = sorted(str(p) for p in job.rglob("*"))
    # The 1-process resume runs in this process (its 8 devices, the same global batch of 8):
    # the point is what the 2 processes above saved.
    code, stderr = main_in_process(
        f"--job_log_dir={job}",
        *knobs[2:],
        "--set=NUM_TRAIN_STEPS=4",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=1",
        exp="tasks.lm.text.LmTextTiny",
    )
    assert code == 2, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("paxlite: error:")]
    assert len(errors) == 1 and "resume with 2 processes" in errors[0], stderr[-2000:]
    assert sorted(str(p) for p in job.rglob("*")) == before
