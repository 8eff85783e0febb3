"""A pipelined experiment (GPipe and circular) checkpoints and resumes, and its losses and
weights equal the unpipelined model's, in one process and through main.py on 2 processes; bad
pipeline knobs get one line, exit 2, and nothing written.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from tasks.lm.synthetic import LmSyntheticTinyPipeline
from tests.paxlite.test_main import REPO, main_in_process, restore_params, run_main, scalar_series
from tests.processes import cpu_env, free_port, run_together

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

EXP = "tasks.lm.synthetic.LmSyntheticTinyPipeline"
STEPS = 6
COMMON = [
    f"--set=NUM_TRAIN_STEPS={STEPS}",
    "--set=SUMMARY_INTERVAL_STEPS=1",
    "--set=CHECKPOINT_EVERY_N_STEPS=3",
    "--set=EVAL_INTERVAL_STEPS=0",
    "--peak_tflops=1",  # No MFU calibration: not what these tests check.
]


@pytest.fixture(scope="module")
def unpipelined(tmp_path_factory) -> tuple[list[float], dict]:
    return _unpipelined(tmp_path_factory.mktemp("plain"))


def _unpipelined(tmp_path: pathlib.Path) -> tuple[list[float], dict]:
    """The same model without a pipeline, in this process on 2 devices: losses, final params."""
    cls = base_experiment.with_overrides(
        LmSyntheticTinyPipeline,
        {
            "NUM_STAGES": 1,
            "NUM_MICROBATCHES": None,
            "ICI_MESH_SHAPE": (1, 1, 2, 1),
            "NUM_TRAIN_STEPS": STEPS,
            "SUMMARY_INTERVAL_STEPS": 1,
            "CHECKPOINT_EVERY_N_STEPS": 1000,
            # 2 x this process's 8 devices = the global batch of 16 of the 2-device runs.
            "PERCORE_BATCH_SIZE": 2,
        },
    )
    exp = cls()
    job = build_job(exp, exp.task(), exp.datasets(), tmp_path, devices=jax.devices()[:2])
    assert job.train_input.batch_size == 16
    result = train_loop.run(job, peak_tflops=1.0)  # (No MFU calibration.)
    return [s["loss"] for _, s in result.history], jax.device_get(result.state.params)


def _pipelined(
    job_dir: pathlib.Path, *, stop_at_step: int | None = None, **knobs
) -> train_loop.RunResult:
    """LmSyntheticTinyPipeline with COMMON's knobs, in this process on 2 of its devices (the
    command line and its processes are the 2-process run's and the bad knobs' tests)."""
    settings = {
        "NUM_TRAIN_STEPS": STEPS,
        "SUMMARY_INTERVAL_STEPS": 1,
        "CHECKPOINT_EVERY_N_STEPS": 3,
        "EVAL_INTERVAL_STEPS": 0,
        "PERCORE_BATCH_SIZE": 2,  # x this process's 8 devices: the 2-device runs' batch of 16.
        **knobs,
    }
    exp = base_experiment.with_overrides(LmSyntheticTinyPipeline, settings)()
    job = build_job(exp, exp.task(), exp.datasets(), job_dir, devices=jax.devices()[:2])
    assert job.train_input.batch_size == 16
    return train_loop.run(job, stop_at_step=stop_at_step, peak_tflops=1.0)  # (No eval, MFU.)


@pytest.mark.slow
def test_pipeline_trains_checkpoints_resumes_and_matches_unpipelined_and_two_processes(
    tmp_path, unpipelined, capsys
):
    job = tmp_path / "pipelined"
    # Stages on 2 devices of one process; stop (with a checkpoint) at step 3.
    first = _pipelined(job, stop_at_step=3)
    assert int(first.state.step) == 3
    assert "'stage': 2" in capsys.readouterr().out
    assert (job / "checkpoints" / "3").is_dir()

    # The same job resumes from step 3 to the end.
    resumed = _pipelined(job)
    assert int(resumed.state.step) == STEPS
    assert "Restored checkpoint at step 3" in capsys.readouterr().out

    losses = scalar_series(job / "summaries" / "train", "train/loss")
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))
    plain_losses, plain_params = unpipelined

    # The same pipeline through main.py with its stages on 2 processes (stage axis over DCN):
    # both read the same rows of the input, and the losses are the 1-process run's.
    multi = tmp_path / "two_processes"
    two = _run_two_processes(
        f"--job_log_dir={multi}",
        *COMMON,
        "--set=ICI_MESH_SHAPE=1,1,1,1",
        "--set=DCN_MESH_SHAPE=2,1,1,1",
    )
    assert "'stage': 2" in two and "(2 processes)" in two
    multi_losses = scalar_series(multi / "summaries" / "train", "train/loss")
    np.testing.assert_allclose(
        [v for _, v in multi_losses], [v for _, v in losses], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose([v for _, v in losses], plain_losses, rtol=2e-5, atol=2e-5)
    assert plain_losses[-1] < plain_losses[0]

    # The pipelined weights are stored as the plain scanned stack's ([L, ...]), and agree.
    params = restore_params(job, STEPS)
    w_ours = params["lm"]["transformer"]["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    w_plain = plain_params["lm"]["transformer"]["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    assert w_ours.shape == w_plain.shape == (4, 64, 256)
    for a, b in zip(
        jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(plain_params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_circular_pipeline_trains_checkpoints_and_matches_unpipelined(
    tmp_path, unpipelined, capsys
):
    """CIRCULAR_REPEAT=2: 2 devices each run 2 virtual stages of 1 layer (layers s and s + 2 on
    device s), in 4 microbatches; the losses and final weights are the plain stack's."""
    job = tmp_path / "circular"
    run = _pipelined(job, CIRCULAR_REPEAT=2)
    assert int(run.state.step) == STEPS
    assert "'stage': 2" in capsys.readouterr().out
    assert sorted(int(p.name) for p in (job / "checkpoints").iterdir()) == [3, STEPS]

    plain_losses, plain_params = unpipelined
    losses = scalar_series(job / "summaries" / "train", "train/loss")
    assert [s for s, _ in losses] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([v for _, v in losses], plain_losses, rtol=2e-5, atol=2e-5)

    # Stored as [R, L / R, ...]: layer r * L / R + i at [r, i], the plain stack's [L, ...] order.
    params = restore_params(job, STEPS)
    w = params["lm"]["transformer"]["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    assert w.shape == (2, 2, 64, 256)
    flat_ours = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_plain = jax.tree_util.tree_flatten_with_path(plain_params)[0]
    for (path, a), (plain_path, b) in zip(flat_ours, flat_plain, strict=True):
        assert path == plain_path
        a, b = np.asarray(a), np.asarray(b)
        if "repeat" in jax.tree_util.keystr(path):
            a = a.reshape(b.shape)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def _run_two_processes(*args: str) -> str:
    """Runs the experiment as 2 processes of 1 CPU device each; process 0's stdout."""
    port = free_port()
    commands = [
        [sys.executable, "-m", "paxlite.main", f"--exp={EXP}", *args]
        + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"]
        for i in range(2)
    ]
    results = run_together(commands, REPO, cpu_env(1), timeout=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return results[0].stdout


def _main_in_process(*argv: str) -> tuple[int, str]:
    return main_in_process(*argv, exp=EXP)


@pytest.mark.parametrize(
    "overrides, phrases",
    [
        (
            ["--set=NUM_LAYERS=3"],
            ["NUM_LAYERS=3", "NUM_STAGES=2 x CIRCULAR_REPEAT=1", "multiple of 2"],
        ),
        (
            ["--set=NUM_LAYERS=4", "--set=CIRCULAR_REPEAT=4"],
            ["NUM_LAYERS=4", "CIRCULAR_REPEAT=4", "multiple of 8"],
        ),
        (["--set=NUM_MICROBATCHES=3"], ["global batch 16", "NUM_MICROBATCHES=3"]),
        (
            ["--set=NUM_MICROBATCHES=None", "--set=MICROBATCH_SIZE=5"],
            ["global batch 16", "MICROBATCH_SIZE=5"],
        ),
        (
            ["--set=NUM_MICROBATCHES=32", "--set=ICI_MESH_SHAPE=2,1,4,1"],
            ["microbatch of 2 examples", "4 data-parallel devices", "NUM_MICROBATCHES"],
        ),
        (
            ["--set=MESH_AXIS_NAMES=replica,data,mdl", "--set=ICI_MESH_SHAPE=1,2,1"],
            ["NUM_STAGES=2 needs a 'stage' mesh axis", "MESH_AXIS_NAMES=stage,replica,data,mdl"],
        ),
        (
            ["--set=ICI_MESH_SHAPE=1,1,2,1"],
            ["NUM_STAGES=2 but the mesh has 1 devices on its 'stage' axis"],
        ),
        (
            ["--set=CIRCULAR_REPEAT=2", "--set=NUM_MICROBATCHES=1"],
            ["circular schedule", "at least NUM_STAGES=2 microbatches"],
        ),
    ],
    ids=[
        "layers",
        "layers_circular",
        "microbatches",
        "microbatch_size",
        "data_shards",
        "no_stage_axis",
        "stage_size",
        "circular_microbatches",
    ],
)
def test_bad_pipeline_knobs_fail_in_one_line_and_write_nothing(tmp_path, overrides, phrases):
    job = tmp_path / "job"
    code, stderr = _main_in_process(f"--job_log_dir={job}", *overrides)
    assert code == 2, stderr
    assert "Traceback" not in stderr
    message = stderr[stderr.index("paxlite: error:") :].rstrip()
    assert "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message
    assert not job.exists()


@pytest.mark.slow
def test_bad_pipeline_knob_from_the_command_line(tmp_path):
    job = tmp_path / "job"
    proc = run_main(f"--job_log_dir={job}", f"--exp={EXP}", "--set=NUM_LAYERS=3", devices=2)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    message = proc.stderr[proc.stderr.index("paxlite: error:") :].rstrip()
    assert "\n" not in message and "NUM_LAYERS=3" in message, message
    assert not job.exists()
