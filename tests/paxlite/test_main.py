"""main.py end to end in subprocesses: TensorBoard events, orbax checkpoints, resume, errors."""

import contextlib
import io
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable

import numpy as np
import orbax.checkpoint as ocp
import pytest
from absl import flags
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from tests import CPU_CODEGEN_FLAGS, REPO, cpu_xla_flags

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

EXP = "tasks.lm.synthetic.LmSyntheticTiny"
SHORT = [
    "--set=NUM_TRAIN_STEPS=60",
    "--set=SUMMARY_INTERVAL_STEPS=10",
    "--set=CHECKPOINT_EVERY_N_STEPS=20",
    "--set=EVAL_INTERVAL_STEPS=30",
]


# Runs paxlite.main as `python -m` does, then prints which heavy input libraries it imported.
REPORT_IMPORTS = (
    "import atexit, runpy, sys; atexit.register(lambda: print('imported input libraries:', "
    "[m for m in ('tensorflow', 'seqio', 'tensorflow_datasets') if m in sys.modules])); "
    "runpy.run_module('paxlite.main', run_name='__main__', alter_sys=True)"
)
NO_INPUT_LIBRARIES = "imported input libraries: []"


def run_main(
    *args: str,
    devices: int = 1,
    timeout: int = 300,
    report_imports: bool = False,
    exp: str = EXP,
    unset_env: tuple[str, ...] = (),
    cwd: pathlib.Path = REPO,
) -> subprocess.CompletedProcess:
    """``python -m paxlite.main --exp=EXP ARGS`` on ``devices`` CPU devices, in ``cwd``.

    With ``report_imports`` the process prints, at exit, which of TensorFlow, SeqIO and
    TFDS it imported (:data:`NO_INPUT_LIBRARIES` when none). ``unset_env``: variables of
    this process the run does not inherit.
    """
    env = {k: v for k, v in os.environ.items() if k not in unset_env}
    env["XLA_FLAGS"] = cpu_xla_flags(devices)
    env["JAX_PLATFORMS"] = "cpu"
    launch = ["-c", REPORT_IMPORTS] if report_imports else ["-m", "paxlite.main"]
    return subprocess.run(
        [sys.executable, *launch, f"--exp={exp}", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: What a complete run must not print: Python's and the C++ runtime's last words at exit,
#: a background thread's traceback, or paxlite's own error and warning lines.
DIRTY_END = (
    "Traceback",
    "Exception ignored",
    "terminate called",
    "Fatal Python error",
    "FATAL",
    "Error in atexit",
    "paxlite: error",
    "paxlite: warning",
)


def assert_ended_cleanly(proc: subprocess.CompletedProcess) -> None:
    """Exit code 0 and none of :data:`DIRTY_END` on stderr."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    dirty = [marker for marker in DIRTY_END if marker in proc.stderr]
    assert not dirty, (dirty, proc.stderr[-3000:])


def run_until_preempted(
    *args: str, at: str, cwd: pathlib.Path = REPO
) -> subprocess.CompletedProcess:
    """``python -m paxlite.main --exp=EXP ARGS`` on 1 CPU device, sent SIGTERM as soon as
    it prints a step line containing ``at`` (e.g. ``'/200'``: the first summary)."""
    return run_and_act_at(*args, at=at, act=lambda proc: proc.send_signal(signal.SIGTERM), cwd=cwd)


def run_and_act_at(
    *args: str,
    at: str,
    act: Callable[[subprocess.Popen], object],
    exp: str = EXP,
    cwd: pathlib.Path = REPO,
) -> subprocess.CompletedProcess:
    """``python -m paxlite.main --exp=EXP ARGS`` on 1 CPU device; ``act(process)`` runs once,
    as soon as the run prints a step line containing ``at``, while the run goes on."""
    env = dict(
        os.environ,
        XLA_FLAGS=cpu_xla_flags(1),
        JAX_PLATFORMS="cpu",
        PYTHONUNBUFFERED="1",
    )
    command = [sys.executable, "-m", "paxlite.main", f"--exp={exp}", *args]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(command, cwd=cwd, env=env, **pipes)
    try:
        for line in proc.stdout:
            if line.startswith("step") and at in line:
                act(proc)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def main_in_process(*argv: str, exp: str = EXP) -> tuple[int, str]:
    """``paxlite.main.main`` in this process (8 CPU devices): ``(exit code, stderr)``.

    For command lines that must fail before anything runs: much cheaper than a
    subprocess, and an exception other than the clean exit fails the test.
    """
    from paxlite import main

    stderr = io.StringIO()
    try:
        flags.FLAGS(["paxlite", f"--exp={exp}", *argv])
        with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit_info:
            main.main(["paxlite"])
    finally:
        flags.FLAGS.unparse_flags()
    return exit_info.value.code, stderr.getvalue()


def run_main_in_process(*argv: str, exp: str = EXP) -> tuple[int, str, str]:
    """``paxlite.main.main`` in this process: ``(exit code, stdout, stderr)``.

    Unlike :func:`main_in_process`, for runs that may succeed: a run that
    returns without ``sys.exit`` is exit code 0.
    """
    from paxlite import main

    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    try:
        flags.FLAGS(["paxlite", f"--exp={exp}", *argv])
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main.main(["paxlite"])
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
    return code, stdout.getvalue(), stderr.getvalue()


def scalar_series(logdir: pathlib.Path, tag: str) -> list[tuple[int, float]]:
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]


def restore_params(job_dir: pathlib.Path, step: int):
    """The params of the checkpoint at ``step``, on one device of this process, whatever mesh
    (and however many processes) wrote it."""
    import jax

    path = job_dir / "checkpoints" / str(step) / "state"
    checkpointer = ocp.StandardCheckpointer()
    saved = checkpointer.metadata(path).item_metadata
    one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one_device), saved
    )
    return checkpointer.restore(path, target)["params"]


@pytest.mark.slow
def test_train_and_eval_end_to_end(tmp_path):
    job = tmp_path / "job"
    no_mfu = "--peak_tflops=1"  # No MFU read here: no matmul timed to calibrate the peak.
    proc = run_main(
        f"--job_log_dir={job}", "--mode=train_and_eval", *SHORT, no_mfu, report_imports=True
    )
    assert_ended_cleanly(proc)
    assert "step      60/60" in proc.stdout and "tokens/s" in proc.stdout
    assert NO_INPUT_LIBRARIES in proc.stdout  # Synthetic data: no TensorFlow, not even for events.

    losses = scalar_series(job / "summaries" / "train", "train/loss")
    assert [s for s, _ in losses] == [10, 20, 30, 40, 50, 60]
    assert losses[-1][1] < 0.5 * losses[0][1]
    assert losses[-1][1] < np.log(64) / 2
    for tag in (
        "train/accuracy",
        "train/learning_rate",
        "train/grad_norm",
        "train/steps_per_sec",
        "train/tokens_per_sec",
    ):
        assert len(scalar_series(job / "summaries" / "train", tag)) == 6
    evals = scalar_series(job / "summaries" / "eval_test", "eval_test/loss")
    assert [s for s, _ in evals] == [30, 60]

    # max_to_keep=2 of saves at 20, 40, 60 (async, then finalized).
    steps = sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [40, 60]
    assert (job / "config.txt").read_text().count("NUM_TRAIN_STEPS: int = 60") == 1
    assert (
        '"__fn_or_cls__"' in (job / "config.json").read_text()
        or "SingleTask" in (job / "config.json").read_text()
    )

    # Same command again: restores step 60 and has nothing left to train.
    again = run_main(f"--job_log_dir={job}", "--mode=train_and_eval", *SHORT, no_mfu)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restored checkpoint at step 60" in again.stdout

    # --mode=eval restores the latest checkpoint and evaluates it once more.
    evaluated = run_main(f"--job_log_dir={job}", "--mode=eval", *SHORT)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "eval 'test' at step 60" in evaluated.stdout
    assert len(scalar_series(job / "summaries" / "eval_test", "eval_test/loss")) == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set=NUM_LAYERS=two"], "NUM_LAYERS"),
        (["--set=NUM_LAYRES=3"], "NUM_LAYERS"),
        (["--set=NUM_LAYERS"], "KNOB=VALUE"),
        (["--set=ICI_MESH_SHAPE=1,2,1"], "needs 2 devices"),
        (["--fdl_set=task.learner.optimizer.learning_rat=0.1"], "learning_rate"),
    ],
)
def test_bad_command_lines_fail_clearly_and_write_nothing(tmp_path, args, message):
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", *args)
    assert code == 2, stderr[-2000:]
    assert message in stderr and stderr.startswith("paxlite: error: ")
    assert not job.exists()


def test_batch_not_divisible_by_data_shards_fails_clearly(tmp_path):
    job = tmp_path / "job"
    code, stderr = main_in_process(
        f"--job_log_dir={job}", "--set=ICI_MESH_SHAPE=1,8,1", "--fdl_set=datasets[0].batch_size=6"
    )
    assert code == 2, stderr[-2000:]
    assert "global batch 6 is not divisible by the 8 data-parallel shards" in stderr
    assert not job.exists()


@pytest.mark.slow
def test_unknown_experiment_lists_candidates(tmp_path):
    code, stderr = main_in_process(
        f"--job_log_dir={tmp_path / 'job'}", exp="tasks.lm.synthetic.LmSyntheticTnyi"
    )
    assert code == 2
    assert "LmSyntheticTiny" in stderr and "Traceback" not in stderr


def test_print_config_shows_knobs_and_paths():
    code, stdout, stderr = run_main_in_process(
        "--print_config",
        "--set=NUM_LAYERS=3",
        "--set=CHECKPOINT_POLICY=layers.AutodiffCheckpointType.SAVE_DOT_WITH_NO_BATCH_DIM",
        "--fdl_set=task.learner.optimizer.learning_rate=0.5",
    )
    assert code == 0, stderr[-2000:]
    assert "NUM_LAYERS: int = 3" in stdout
    # Pax's knob names, and Pax's spelling of a checkpoint policy parsed from the command line.
    policy = "<AutodiffCheckpointType.SAVE_DOT_WITH_NO_BATCH_DIM"
    assert f"CHECKPOINT_POLICY: AutodiffCheckpointType = {policy}" in stdout
    assert "CHECKPOINT_EVERY_N_STEPS: int = 100" in stdout
    assert "LR_SCHEDULE: LrSchedule = <LrSchedule.LINEAR_RAMPUP_COSINE_DECAY" in stdout
    assert "learner.optimizer.learning_rate: float = 0.5" in stdout
    assert "model.lm_tpl.stacked_transformer_tpl.num_layers" in stdout


@pytest.mark.slow
def test_fiddler_edits_the_task_config():
    code, stdout, stderr = run_main_in_process(
        "--print_config", "--fiddler=tasks.lm.lm_cloud.bfloat16_compute"
    )
    assert code == 0, stderr[-2000:]
    assert "block_tpl.tr_atten_tpl.fprop_dtype" in stdout
    lines = [ln for ln in stdout.splitlines() if "tr_atten_tpl.fprop_dtype" in ln]
    assert lines and all("bfloat16" in ln for ln in lines)
    code, _, stderr = run_main_in_process("--print_config", "--fiddler=no_such_fiddler")
    assert code == 2 and "no_such_fiddler" in stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "exp, params",  # paxml 1.4's own counts (tests/fixtures/pax/param_trees.json)
    [("LmCloudSpmd2B", "2,137,273,856"), ("C4Spmd1BAdam4Replicas", "1,104,619,904")],
)
def test_compile_dry_run_on_fake_devices_needs_no_data(tmp_path, exp, params):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TFDS_DATA_DIR=str(tmp_path / "no_data"))
    env["XLA_FLAGS"] = CPU_CODEGEN_FLAGS  # No device count: main.py sets its own.
    proc = subprocess.run(
        [sys.executable, "-m", "paxlite.main", f"--exp={exp}", "--mode=compile"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "for 4 fake CPU devices, mesh" in proc.stdout
        and f"parameters:             {params}" in proc.stdout
    )
    assert "XLA temp per device" in proc.stdout and "XLA FLOPs per step" in proc.stdout


def test_partial_distributed_flags_fail_clearly(tmp_path):
    code, stderr = main_in_process(f"--job_log_dir={tmp_path / 'job'}", "--num_processes=2")
    assert code == 2
    assert "go together" in stderr and stderr.startswith("paxlite: error: ")


def test_print_config_works_before_the_required_knobs_are_set():
    """A newcomer discovers the knobs with --print_config: a required data path prints as
    <required> inside the whole config; a model that needs its directory prints its knobs."""
    code, out, err = run_main_in_process("--print_config", exp="tasks.lm.text.LmTextTiny")
    assert code == 0, err[-2000:]
    assert "TEXT_DATA_PATH: str = '<required>'" in out.splitlines()
    assert "## Task (Fiddle paths)" in out and "## datasets[0]" in out
    code, out, err = run_main_in_process("--print_config", exp="tasks.lm.hf.HfCausalLm")
    assert code == 0, err[-2000:]
    assert "HF_MODEL: str | None = None" in out.splitlines()
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("## Task and datasets: printed once the experiment can be built")
    assert "(HfCausalLm: HF_MODEL is unset" in last
    # A knob the user gave that the experiment refuses is still an error.
    code, _, err = run_main_in_process(
        "--print_config", "--set=ICI_MESH_SHAPE=1,1", exp="tasks.lm.text.LmTextTiny"
    )
    assert code == 2 and "ICI_MESH_SHAPE" in err and err.count("paxlite: error:") == 1
