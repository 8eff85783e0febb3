"""Storage that fails under a running job, with real faults: a proxy in front of a real GCS
emulator that answers 403 or 503 or holds writes back (``tests/gcs.py``), and a local
checkpoint directory replaced by a file. A checkpoint that cannot be written stops the run
with one line and exit code 5, nothing complete is lost, and the same command resumes; what
a run can do without (summaries, profiles, decoder outputs) is reported and the run goes on.
"""

import pathlib
import re
import subprocess
import sys

import pytest
from etils import epath

from paxlite.checkpoints import input_positions
from tasks.lm.text import TextFormat
from tests import REPO
from tests.gcs import BUCKET
from tests.paxlite.test_main import (
    assert_ended_cleanly,
    run_and_act_at,
    run_main,
    run_main_in_process,
    run_until_preempted,
)
from tests.processes import cpu_env, free_port, run_together
from tests.tasks.lm.test_text import write

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

STORAGE_EXIT_CODE = 5
TEXT = "tasks.lm.text.LmTextTiny"
_NEWEST = re.compile(r"the newest complete checkpoint is step (\d+) \(rerun the same command")


@pytest.fixture(autouse=True)
def local_tmp(tmp_path, monkeypatch):
    """The runs' TMPDIR (where error reports go) inside the test's own directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    return scratch


def the_error(proc: subprocess.CompletedProcess) -> str:
    """The run's one ``paxlite: error:`` line (and no traceback on the console)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("paxlite: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def text_run(tmp_path: pathlib.Path, job: object, *knobs: str) -> list[str]:
    """A command line of the tiny text experiment: each checkpoint has an input position."""
    data = write(
        tmp_path, TextFormat.LINES, [f"document {i} " + "abc " * (i % 9) for i in range(80)]
    )
    return [
        f"--job_log_dir={job}",
        f"--set=TEXT_DATA_PATH={data}",
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--peak_tflops=1",
        *knobs,
    ]


@pytest.mark.slow
def test_a_bucket_refusing_a_checkpoint_stops_the_run_and_the_same_command_resumes(
    faulty_gcs, tmp_path, local_tmp
):
    job = f"gs://{BUCKET}/refused"
    command = text_run(
        tmp_path,
        job,
        "--set=NUM_TRAIN_STEPS=6",
        "--set=CHECKPOINT_EVERY_N_STEPS=2",
        "--set=CHECKPOINT_MAX_TO_KEEP=1",
    )
    faulty_gcs.refuse_writes(403, matching="refused/checkpoints/4/")  # Revoked for step 4 on.
    failed = run_main(*command, exp=TEXT, cwd=tmp_path)
    assert failed.returncode == STORAGE_EXIT_CODE, failed.stderr[-3000:]
    line = the_error(failed)
    assert line.startswith(
        f"paxlite: error: the checkpoint at step 4 could not be written to {job}/checkpoints: "
    )
    assert "does not have storage.objects.create access" in line
    assert "; the newest complete checkpoint is step 2 (rerun the same command once" in line
    report = pathlib.Path(line.split("Details: ")[1].split(",")[0])
    assert report.parent == local_tmp and "Traceback" in report.read_text()
    copy = epath.Path(job) / "logs" / report.name  # The job dir still took this write.
    assert f"copied to {copy}" in line and copy.read_text() == report.read_text()
    # Step 2 and its input position stay, although only one checkpoint is kept.
    checkpoint_dir = epath.Path(job) / "checkpoints"
    assert (checkpoint_dir / "2" / "commit_success.txt").exists()
    assert (input_positions.host_dir(checkpoint_dir, 2) / "position.json").exists()

    refused = faulty_gcs.refused
    faulty_gcs.refuse_writes(503, matching="refused/checkpoints/", times=3)  # Busy a moment.
    resumed = run_main(*command, exp=TEXT, cwd=tmp_path)
    assert_ended_cleanly(resumed)  # The 503s were retried.
    assert faulty_gcs.refused == refused + 3
    assert f"Restored checkpoint at step 2 from {job}/checkpoints" in resumed.stdout
    assert "step       6/6" in resumed.stdout
    assert sorted(p.name for p in checkpoint_dir.iterdir()) == ["6", "input_positions"]
    assert [p.name for p in (checkpoint_dir / input_positions.DIRNAME).iterdir()] == ["6"]


def run_two_processes(command: list[str]) -> list[subprocess.CompletedProcess]:
    """``command`` (main.py's flags after ``--exp``) as processes 0 and 1 of one job, on 2
    CPU devices each, with the model axis across the two (each process writes its own
    shards of the state: with the data axis across them only process 0 writes)."""
    port = free_port()
    env = cpu_env(2, JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    join = ["--set=ICI_MESH_SHAPE=1,2,1", "--set=DCN_MESH_SHAPE=1,1,2", "--num_processes=2"]
    join += [f"--coordinator_address=127.0.0.1:{port}", "--distributed_timeout_s=120"]
    commands = [
        [sys.executable, "-m", "paxlite.main", f"--exp={TEXT}", *command, *join]
        + [f"--process_id={i}"]
        for i in range(2)
    ]
    return run_together(commands, REPO, env, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize(
    "what, failing, written_there",
    [
        ("state", 1, r"checkpoints(/|%2F)4(/|%2F)state(/|%2F)ocdbt\.process_1"),
        ("input position", 1, r"input_positions(/|%2F)4(/|%2F)host_1_of_2"),
        ("state", 0, r"checkpoints(/|%2F)4(/|%2F)state(/|%2F)ocdbt\.process_0"),
    ],
    ids=["state_on_1", "input_position_on_1", "state_on_0"],
)
def test_a_write_failing_on_one_process_stops_every_process_with_5_and_one_line_from_0(
    faulty_gcs, tmp_path, what, failing, written_there
):
    """Process 0 hosts the job's coordination service: failing, it waits for the others to
    learn why before it exits (else JAX aborts them: "the leader task died")."""
    job = f"gs://{BUCKET}/process_{failing}_{what.replace(' ', '_')}"
    command = text_run(tmp_path, job, "--set=NUM_TRAIN_STEPS=4", "--set=CHECKPOINT_EVERY_N_STEPS=2")
    faulty_gcs.refuse_writes(403, matching=written_there)
    procs = run_two_processes(command)
    assert faulty_gcs.refused > 0  # The failing process did try to write there.
    for proc in procs:
        assert proc.returncode == STORAGE_EXIT_CODE, proc.stderr[-3000:]
    own = f"paxlite: error: the checkpoint at step 4 could not be written to {job}/checkpoints: "
    assert the_error(procs[failing]).startswith(own)
    line = the_error(procs[0])  # Process 0's log is the job's: it names the failure.
    if failing == 1:
        assert line.startswith("paxlite: error: process 1 of 2 (host ")
        assert own.removeprefix("paxlite: error:") in line
    assert "does not have storage.objects.create access" in line
    assert "the newest complete checkpoint is step 2" in line
    checkpoint_dir = epath.Path(job) / "checkpoints"
    assert (checkpoint_dir / "2" / "commit_success.txt").exists()
    assert not (checkpoint_dir / "4" / "commit_success.txt").exists()


@pytest.mark.slow
def test_a_local_checkpoint_directory_replaced_by_a_file_stops_the_run(tmp_path):
    job = tmp_path / "job"
    command = text_run(
        tmp_path,
        job,
        "--set=NUM_TRAIN_STEPS=50",
        "--set=SUMMARY_INTERVAL_STEPS=10",
        "--set=CHECKPOINT_EVERY_N_STEPS=10",
    )
    checkpoint_dir, aside = job / "checkpoints", tmp_path / "aside"

    def replace_checkpoint_dir(_) -> None:
        checkpoint_dir.rename(aside)
        checkpoint_dir.write_text("not a directory")

    # By this line the save at step 20 has waited for step 10 to be complete; the saves at
    # steps 40 and 50 come after it.
    failed = run_and_act_at(*command, at=" 30/50", act=replace_checkpoint_dir, exp=TEXT)
    assert failed.returncode == STORAGE_EXIT_CODE, failed.stderr[-3000:]
    line = the_error(failed)
    assert f"could not be written to {checkpoint_dir}: " in line
    newest = int(_NEWEST.search(line).group(1))
    assert newest >= 10 and (aside / str(newest) / "commit_success.txt").exists()
    assert (input_positions.host_dir(epath.Path(aside), newest) / "position.json").exists()

    checkpoint_dir.unlink()  # The fault is gone; the same command resumes.
    aside.rename(checkpoint_dir)
    again = run_main(*command, exp=TEXT)
    assert_ended_cleanly(again)
    assert f"Restored checkpoint at step {newest} from {checkpoint_dir}" in again.stdout
    assert "step      50/50" in again.stdout


@pytest.mark.slow
def test_a_preemption_save_that_hangs_past_the_timeout_exits_5_not_143(faulty_gcs, tmp_path):
    faulty_gcs.stall_writes(8, matching=r"stalled/checkpoints/\d+/.*ocdbt")  # The arrays.
    stopped = run_until_preempted(
        f"--job_log_dir=gs://{BUCKET}/stalled",
        "--set=NUM_TRAIN_STEPS=300",
        "--set=SUMMARY_INTERVAL_STEPS=10",
        "--set=CHECKPOINT_EVERY_N_STEPS=1000",  # The only save is SIGTERM's.
        "--set=CHECKPOINT_ASYNC_TIMEOUT_SECS=2",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--peak_tflops=1",
        at="/300",
        cwd=tmp_path,
    )
    assert stopped.returncode == STORAGE_EXIT_CODE, stopped.stderr[-3000:]
    line = the_error(stopped)
    assert "the save did not finish within 2 s (raise CHECKPOINT_ASYNC_TIMEOUT_SECS" in line
    assert "no checkpoint is complete yet" in line
    assert "Preempted" not in stopped.stdout  # Exit 143 would promise a resumable checkpoint.


@pytest.mark.slow
def test_summaries_profiles_and_decoder_outputs_that_cannot_be_written_leave_the_run_going(
    faulty_gcs, tmp_path
):
    job = f"gs://{BUCKET}/unsummarized"
    faulty_gcs.refuse_writes(403, matching="unsummarized/(summaries|decoder_out)/")
    proc = run_main(
        f"--job_log_dir={job}",
        "--mode=train_and_eval",
        "--set=NUM_TRAIN_STEPS=10",
        "--set=SUMMARY_INTERVAL_STEPS=10",
        "--set=CHECKPOINT_EVERY_N_STEPS=10",
        "--set=EVAL_INTERVAL_STEPS=0",
        "--set=PROFILER_CAPTURE_STEP=1",
        "--fdl_set=task.decode_interval_steps=10",
        "--peak_tflops=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "paxlite: error" not in proc.stderr and "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("paxlite: warning")]
    for kind, where in [
        ("summaries", "summaries/train/events.out.tfevents"),
        ("profile", "summaries/train/plugins/profile"),
        ("decoder outputs", "decoder_out/progressions_step10.jsonl"),
    ]:
        said = [w for w in warnings if w.startswith(f"paxlite: warning: cannot write {kind} to")]
        assert len(said) == 1 and f"{job}/{where}" in said[0], warnings
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("paxlite: warning: not written (storage errors above): summaries: ")
    assert "; profile: " in last and "; decoder outputs: " in last
    assert (epath.Path(job) / "checkpoints" / "10" / "commit_success.txt").exists()


@pytest.mark.slow
def test_a_benchmark_whose_report_cannot_be_written_exits_5(tmp_path):
    job = tmp_path / "job"
    (job / "benchmark.json").mkdir(parents=True)  # Where the report's file would go.
    code, out, err = run_main_in_process(
        f"--job_log_dir={job}",
        "--mode=benchmark",
        "--bench_steps=2",
        "--bench_warmup=1",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=1",
    )
    assert code == STORAGE_EXIT_CODE, err
    assert "Benchmark:" in out  # The figures are printed before the report fails.
    errors = [line for line in err.splitlines() if line.startswith("paxlite: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"paxlite: error: the benchmark report could not be written to {job}: IsADirectoryError"
    )
