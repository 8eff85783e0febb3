"""A user's mistake gets a one-line answer (exit 2, no traceback) and nothing on disk is lost.

Covers knobs that cannot make a model (heads vs dims, splits over the 'mdl' axis), job
directories that cannot be written, and job directories whose checkpoint is from another
model or damaged.
"""

import os
import pathlib
import shutil
import tempfile

import jax
import numpy as np
import pytest

from paxlite.checkpoints import train_checkpoints
from paxlite.cli import flags as cli_flags
from paxlite.cli.flags import Mode, UsageError
from paxlite.experiments.base_experiment import KnobError, with_overrides
from paxlite.runtime.job_config import check_job_dir_writable
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import restore_params, run_main, run_main_in_process

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.


def assert_clean_failure(proc, *phrases: str, one_line: bool = True) -> None:
    """Exit 2, no traceback, and a last ``paxlite: error:`` message naming each phrase."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    message = proc.stderr[proc.stderr.index("paxlite: error:") :].rstrip()
    assert not one_line or "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message


def snapshot(root: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root``: relative path -> (mtime_ns, bytes)."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# 1. Knobs that cannot make a model.


@pytest.mark.parametrize(
    "args, devices, phrases",
    [
        (["--set=MODEL_DIMS=90"], 1, ["MODEL_DIMS=90", "NUM_HEADS=4", "DIMS_PER_HEAD"]),
        (
            ["--set=HIDDEN_DIMS=90", "--set=ICI_MESH_SHAPE=1,1,4"],
            4,
            ["HIDDEN_DIMS=90", "4 devices", "'mdl'", "multiple of 4"],
        ),
    ],
)
def test_model_knobs_that_do_not_divide_fail_before_anything_runs(tmp_path, args, devices, phrases):
    job = tmp_path / "job"
    proc = run_main(f"--job_log_dir={job}", *args, devices=devices)
    assert_clean_failure(proc, *phrases)
    assert not job.exists()


@pytest.mark.parametrize(
    "overrides, phrases",
    [
        ({"MODEL_DIMS": 90}, ["MODEL_DIMS=90 is not divisible by NUM_HEADS=4"]),
        ({"NUM_HEADS": 3}, ["MODEL_DIMS=64 is not divisible by NUM_HEADS=3"]),
        ({"MODEL_DIMS": 100}, ["even number of dims per head", "=25", "USE_ROTARY_POSITION_EMB"]),
        ({"NUM_HEADS": 0}, ["NUM_HEADS = 0", "at least 1"]),
        ({"NUM_KV_HEADS": 3}, ["NUM_HEADS=4 is not a multiple of NUM_KV_HEADS=3"]),
        ({"COMBINE_QKV": True, "NUM_KV_HEADS": 2}, ["COMBINE_QKV", "NUM_KV_HEADS=2"]),
        ({"NUM_HEADS": 1, "ICI_MESH_SHAPE": (1, 1, 2)}, ["NUM_HEADS=1", "'heads'", "('mdl',)"]),
        ({"HIDDEN_DIMS": 90, "ICI_MESH_SHAPE": (1, 1, 4)}, ["HIDDEN_DIMS=90", "'mlp'"]),
        (
            {"NUM_KV_HEADS": 2, "ICI_MESH_SHAPE": (1, 1, 4)},
            ["NUM_KV_HEADS=2", "'kv_heads'", "multiple of 4"],
        ),
        ({"VOCAB_SIZE": 65, "ICI_MESH_SHAPE": (1, 1, 2)}, ["VOCAB_SIZE=65", "'vocab'"]),
        (
            {"ICI_MESH_SHAPE": (2, 2, 2), "DCN_MESH_SHAPE": (1, 1, 3)},
            ["6 devices", "mesh {'replica': 2, 'data': 2, 'mdl': 6}", "DCN_MESH_SHAPE"],
        ),
        ({"ICI_MESH_SHAPE": (1, -1, -1)}, ["ICI_MESH_SHAPE", "at least 1"]),
        ({"CHECKPOINT_EVERY_N_STEPS": 0}, ["CHECKPOINT_EVERY_N_STEPS = 0"]),
        ({"DROPOUT_PROB": 1.0}, ["DROPOUT_PROB", "[0, 1)"]),
        ({"LOGICAL_AXIS_RULES": (("heads", 1),)}, ["LOGICAL_AXIS_RULES maps 'heads' to 1"]),
    ],
)
def test_validate_names_the_knobs_and_the_fix(overrides, phrases):
    with pytest.raises(KnobError) as error:
        with_overrides(LmSyntheticTiny, overrides)()
    for phrase in phrases:
        assert phrase in str(error.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"ICI_MESH_SHAPE": (1, 2, 4)},  # heads 4, hidden 256, vocab 64 all split 4 ways
        {"NUM_HEADS": 8, "NUM_KV_HEADS": 2, "ICI_MESH_SHAPE": (1, 1, 2)},
        {"MODEL_DIMS": 90, "DIMS_PER_HEAD": 16},
        {"MODEL_DIMS": 100, "USE_ROTARY_POSITION_EMB": False},
    ],
)
def test_validate_accepts_shapes_that_split(overrides):
    with_overrides(LmSyntheticTiny, overrides)()


def test_tensor_parallel_check_follows_the_experiments_rules():
    replicated = tuple((name, None) for name, _ in LmSyntheticTiny.LOGICAL_AXIS_RULES)
    # Nothing maps onto 'mdl': 3 heads of 32 dims on a 2-way 'mdl' axis is fine.
    with_overrides(
        LmSyntheticTiny,
        {
            "NUM_HEADS": 3,
            "MODEL_DIMS": 96,
            "ICI_MESH_SHAPE": (1, 1, 2),
            "LOGICAL_AXIS_RULES": replicated,
        },
    )()


# 2. Job directories that cannot be written.


def test_job_dir_that_is_a_file_fails_before_training(tmp_path):
    in_the_way = tmp_path / "job"
    in_the_way.write_text("not a directory")
    proc = run_main(f"--job_log_dir={in_the_way}", "--set=NUM_TRAIN_STEPS=1")
    assert_clean_failure(proc, str(in_the_way), "is a file, not a directory", "another path")
    assert in_the_way.read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def _read_only_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory this process cannot create anything in (skips if there is none)."""
    candidate = tmp_path / "read_only"
    candidate.mkdir()
    candidate.chmod(0o555)
    for directory in (candidate, pathlib.Path("/sys")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=directory))
        except OSError:
            return directory
    pytest.skip("no read-only directory: running as root with a writable /sys")


def test_job_dir_under_a_read_only_dir_fails_before_training(tmp_path):
    read_only = _read_only_dir(tmp_path)
    before = sorted(os.listdir(read_only))
    job = read_only / "paxlite_job"
    proc = run_main(f"--job_log_dir={job}", "--set=NUM_TRAIN_STEPS=1")
    assert_clean_failure(proc, str(job), "is not writable", str(read_only))
    assert sorted(os.listdir(read_only)) == before


@pytest.mark.parametrize(
    "file_at, job_at, phrase",
    [
        ("job", "job", "job is a file"),
        ("parent", "parent/job", "cannot be used: "),
        ("job/checkpoints", "job", "cannot be used: "),
    ],
)
def test_check_job_dir_writable_rejects_files_in_the_way(tmp_path, file_at, job_at, phrase):
    (tmp_path / file_at).parent.mkdir(exist_ok=True)
    (tmp_path / file_at).write_text("x")
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="a file, not a directory") as error:
        check_job_dir_writable(tmp_path / job_at)
    assert phrase in str(error.value)
    assert snapshot(tmp_path) == before


def test_check_job_dir_writable_accepts_new_and_existing_dirs_and_creates_nothing(tmp_path):
    check_job_dir_writable(tmp_path / "a" / "b" / "c")
    check_job_dir_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []


# 3 and 4. A job directory holding another model's checkpoint, or a damaged one.


#: trained_job's training: 2 steps, a checkpoint after each.
TWO_STEPS = ["--set=NUM_TRAIN_STEPS=2", "--set=CHECKPOINT_EVERY_N_STEPS=1"]


@pytest.fixture(scope="module")
def trained_job(tmp_path_factory) -> pathlib.Path:
    """LmSyntheticTiny trained 2 steps, checkpoints at steps 1 and 2."""
    job = tmp_path_factory.mktemp("trained") / "job"
    proc = run_main(f"--job_log_dir={job}", *TWO_STEPS, "--set=SUMMARY_INTERVAL_STEPS=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["1", "2"]
    return job


def _copy(job: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    copy = tmp_path / "job"
    shutil.copytree(job, copy)  # copy2: mtimes kept
    return copy


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, lines",
    [
        (
            ["--set=MODEL_DIMS=32", "--set=NUM_HEADS=2"],
            [
                "params/lm/softmax/emb_var: saved (64, 64), expected (64, 32)",
                "params/lm/transformer/repeat/block/self_attention/w_q: "
                "saved (2, 64, 4, 16), expected (2, 32, 2, 16)",
            ],
        ),
        (
            ["--set=NUM_LAYERS=3"],
            [
                "params/lm/transformer/repeat/block/ff_layer/ffn_layer1/w: saved (2, 64, 256), "
                "expected (3, 64, 256)"
            ],
        ),
    ],
)
def test_checkpoint_of_another_model_lists_the_differences_and_keeps_the_files(
    trained_job, tmp_path, args, lines
):
    job = _copy(trained_job, tmp_path)
    before = snapshot(job)
    proc = run_main(f"--job_log_dir={job}", "--set=NUM_TRAIN_STEPS=4", *args)
    assert_clean_failure(
        proc, "checkpoint at step 2", "different model", "new --job_log_dir", *lines, one_line=False
    )
    after = snapshot(job)
    assert after.keys() == before.keys()
    for name, (mtime, data) in before.items():
        assert after[name][1] == data, name  # the config of the checkpoints is put back
        if not name.startswith("config."):
            assert after[name][0] == mtime, name


@pytest.mark.slow
def test_damaged_checkpoint_names_the_step_dir_and_deletes_nothing(trained_job, tmp_path):
    job = _copy(trained_job, tmp_path)
    _cut_data_files_in_half(job / "checkpoints" / "2")
    before = snapshot(job)
    proc = run_main(f"--job_log_dir={job}", "--set=NUM_TRAIN_STEPS=4")
    step_dir = job.absolute() / "checkpoints" / "2"
    assert_clean_failure(
        proc,
        "cannot read the checkpoint at step 2",
        f"Move or delete {step_dir} to resume from step 1 (or rerun with --restore_fallback",
        "--job_log_dir",
    )
    after = snapshot(job)
    assert after.keys() == before.keys()
    assert all(after[n][1] == before[n][1] for n in before)


@pytest.mark.slow
def test_restore_fallback_moves_a_damaged_newest_step_aside_and_resumes_from_the_one_before(
    trained_job, tmp_path
):
    job = _copy(trained_job, tmp_path)
    damaged = job / "checkpoints" / "2"
    _cut_data_files_in_half(damaged)
    damaged_files = snapshot(damaged)
    proc = run_main(f"--job_log_dir={job}", *TWO_STEPS, "--restore_fallback")
    assert proc.returncode == 0, proc.stderr[-3000:]
    aside = job.absolute() / "damaged_checkpoints" / "2"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("paxlite: warning:")]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert warnings[0].startswith(
        f"paxlite: warning: the checkpoint at step 2 in {job.absolute() / 'checkpoints'} "
        "cannot be read ("
    )
    assert f"moved it to {aside} and resuming from step 1, the newest that reads" in warnings[0]
    assert "Restored checkpoint at step 1 from" in proc.stdout
    assert snapshot(aside) == damaged_files  # Kept as it was, only renamed.
    # Step 2 trained again from step 1 is the step 2 the damaged files held.
    again, original = restore_params(job, 2), restore_params(trained_job, 2)
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, original)


@pytest.mark.slow
def test_restore_fallback_with_every_checkpoint_damaged_moves_nothing(trained_job, tmp_path):
    job = _copy(trained_job, tmp_path)
    for step in ("1", "2"):
        _cut_data_files_in_half(job / "checkpoints" / step)
    before = snapshot(job)
    code, _, err = run_main_in_process(
        f"--job_log_dir={job}",
        "--set=NUM_TRAIN_STEPS=3",
        "--set=ICI_MESH_SHAPE=1,8,1",  # This process has 8 devices.
        "--restore_fallback",
    )
    assert code == 2, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("paxlite: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"paxlite: error: cannot read any checkpoint in {job.absolute() / 'checkpoints'}: the "
        "files of steps 2, 1 look damaged"
    )
    after = snapshot(job)
    assert after.keys() == before.keys()
    assert all(after[n][1] == before[n][1] for n in before)


def test_restore_fallback_outside_training_is_refused_in_one_line(tmp_path):
    code, _, err = run_main_in_process(
        f"--job_log_dir={tmp_path / 'job'}", "--mode=eval", "--restore_fallback"
    )
    assert code == 2 and err.strip().splitlines()[-1] == (
        "paxlite: error: --restore_fallback applies to training, which resumes from its "
        "checkpoints; --mode=eval does not (restore a step with --restore_checkpoint_step)."
    )
    assert not (tmp_path / "job").exists()
    # Nor in a job of several processes, which could see a step's damage differently
    # (main.py asks once they have joined).
    cli_flags.FLAGS(["paxlite", "--restore_fallback"])
    try:
        assert cli_flags.restore_fallback(Mode.TRAIN, processes=1)
        with pytest.raises(UsageError, match="is for one-process runs; this job has 2 processes"):
            cli_flags.restore_fallback(Mode.TRAIN, processes=2)
    finally:
        cli_flags.FLAGS.unparse_flags()


def _cut_data_files_in_half(step_dir: pathlib.Path) -> None:
    """Damages a checkpoint as a disk that filled up mid-copy would: its array files cut."""
    data_files = [p for p in (step_dir / "state").rglob("d/*") if p.is_file()]
    assert data_files
    for path in data_files:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_shape_mismatches_lists_missing_extra_and_reshaped_arrays():
    saved = {"params": {"a": np.zeros((2, 3)), "b": np.zeros(4)}, "step": np.zeros(())}
    expected = {
        "params": {"a": jax.ShapeDtypeStruct((3, 3), np.float32), "c": np.zeros(1)},
        "step": np.zeros(()),
    }
    assert train_checkpoints.shape_mismatches(saved, expected) == [
        "params/a: saved (2, 3), expected (3, 3)",
        "params/b: saved (4,), expected (absent)",
        "params/c: saved (absent), expected (1,)",
    ]
    assert train_checkpoints.shape_mismatches(saved, saved) == []
