"""``--job_log_dir=gs://bucket/run``: a whole run (train, SIGTERM, resume, decode, eval) in a
bucket served by a real GCS emulator (fake-gcs-server) on loopback, through the same code that
talks to GCS; compared with the same run in a local directory."""

import http.server
import json
import os
import pathlib
import subprocess
import threading

import fsspec
import jax
import numpy as np
import pytest
from etils import epath

from paxlite.checkpoints import train_checkpoints
from paxlite.runtime import storage
from tests.gcs import BUCKET
from tests.paxlite.test_main import (
    REPO,
    assert_ended_cleanly,
    restore_params,
    run_main,
    run_until_preempted,
    scalar_series,
)

RUN = [
    "--set=NUM_TRAIN_STEPS=40",
    "--set=SUMMARY_INTERVAL_STEPS=5",
    "--set=CHECKPOINT_EVERY_N_STEPS=10",
    "--set=EVAL_INTERVAL_STEPS=0",
    "--set=DROPOUT_PROB=0.1",
    "--peak_tflops=1",
]


def run_in(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """The tiny experiment with ``ARGS`` in ``cwd`` (where a stray local ``gs:`` directory
    would appear), with this process's environment (the emulator's address)."""
    return run_main(*args, cwd=cwd)


@pytest.mark.slow
def test_a_run_in_a_bucket_is_preempted_resumes_exactly_decodes_and_evaluates(
    emulator, tmp_path, monkeypatch
):
    scratch = tmp_path / "scratch"  # The runs' TMPDIR: local copies of bucket files go here.
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    local = tmp_path / "local"
    straight = run_main(f"--job_log_dir={local}", *RUN)
    assert straight.returncode == 0, straight.stderr[-2000:]

    job = f"gs://{BUCKET}/runs/tiny"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    preempted = run_until_preempted(f"--job_log_dir={job}", *RUN, at="/40", cwd=cwd)
    assert preempted.returncode == 143, preempted.stderr[-2000:]
    assert "Preempted (SIGTERM) at step" in preempted.stdout
    bucket = epath.Path(job)
    saved = sorted(int(p.name) for p in (bucket / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] < 40
    assert (bucket / "checkpoints" / str(saved[-1]) / "commit_success.txt").exists()

    resumed = run_in(cwd, f"--job_log_dir={job}", *RUN)
    assert_ended_cleanly(resumed)  # gcsfs's and tensorstore's threads and sessions closed.
    assert f"Restored checkpoint at step {saved[-1]} from {job}/checkpoints" in resumed.stdout
    ours = train_checkpoints.Checkpointer(job, max_to_keep=10)
    try:
        assert ours.latest_step() == 40
    finally:
        ours.close()
    a, b = restore_params(local, 40), restore_params(epath.Path(job), 40)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # Bit-identical.

    decoded = run_in(cwd, f"--job_log_dir={job}", "--mode=decode", *RUN)
    assert decoded.returncode == 0, decoded.stderr[-2000:]
    rows = (bucket / "decoder_out" / "progressions_step40.jsonl").read_text().splitlines()
    assert len(rows) == 16 and "decoded_ids" in json.loads(rows[0])
    evaluated = run_in(cwd, f"--job_log_dir={job}", "--mode=eval", *RUN)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]

    assert {p.name for p in bucket.iterdir()} >= {"config.txt", "config.json", "summaries"}
    assert (bucket / "config.txt").read_text() == (local / "config.txt").read_text()
    # TensorBoard reads the bucket's event files (here copied down): losses as the local run's.
    copy = tmp_path / "copy"
    for name in ("train", "eval_test"):
        (copy / name).mkdir(parents=True)
        for event_file in (bucket / "summaries" / name).iterdir():
            (copy / name / event_file.name).write_bytes(event_file.read_bytes())
    remote_losses = dict(scalar_series(copy / "train", "train/loss"))
    local_losses = dict(scalar_series(local / "summaries" / "train", "train/loss"))
    assert remote_losses[40] == local_losses[40] and set(remote_losses) <= set(local_losses)
    assert scalar_series(copy / "eval_test", "eval_test/loss")
    assert not any(p.name.startswith("gs:") for p in [*cwd.iterdir(), *REPO.iterdir()])
    leftovers = [p.name for p in scratch.iterdir() if p.name.startswith("paxlite-")]
    assert not leftovers, leftovers  # The event files' local copies go with their runs.


def test_a_missing_bucket_is_one_line(emulator, tmp_path):
    result = run_in(tmp_path, "--job_log_dir=gs://no-such-bucket/run")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("paxlite: error: --job_log_dir gs://no-such-bucket/run cannot be ")
    assert "the bucket does not exist" in last and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_directory_moves_within_a_bucket_whole(emulator):
    """A bucket has no directories to rename: each file is copied, then the source removed
    (how --restore_fallback moves a damaged step aside)."""
    source = epath.Path(f"gs://{BUCKET}/moves/checkpoints/8")
    files = {"state/d/abc": b"array bytes", "state/manifest.ocdbt": b"m", "_METADATA": b"{}"}
    for relative, data in files.items():
        (source / relative).write_bytes(data)
    target = epath.Path(f"gs://{BUCKET}/moves/damaged_checkpoints/8")
    storage.move_tree(source, target)
    assert not source.exists()
    fs, root = fsspec.core.url_to_fs(str(target))
    moved = {f[len(root) + 1 :]: fs.cat_file(f) for f in fs.find(root)}
    assert moved == files


class _RefusesAnonymousCallers(http.server.BaseHTTPRequestHandler):
    """Answers every request as GCS answers a caller without credentials."""

    def _refuse(self) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": 401,
                    "message": "Anonymous caller does not have storage.objects.create access "
                    "to the Google Cloud Storage object.",
                    "errors": [{"reason": "required", "domain": "global"}],
                }
            }
        ).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _refuse

    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
def test_missing_credentials_are_one_line(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesAnonymousCallers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{server.server_port}")
        for name in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
            monkeypatch.delenv(name, raising=False)
        result = run_in(tmp_path, "--job_log_dir=gs://bucket/run")
    finally:
        server.shutdown()
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("paxlite: error: --job_log_dir gs://bucket/run cannot be written: ")
    assert "no valid credentials (HTTP 401" in last and "gcloud auth" in last
    assert "Traceback" not in result.stderr


def test_local_paths_stay_local(tmp_path):
    assert storage.job_path("relative/run") == epath.Path(os.getcwd()) / "relative/run"
    assert os.fspath(storage.job_path("gs://b/run")) == "gs://b/run"
    assert storage.kvstore(epath.Path("/x/y")) == "file:///x/y"
    assert storage.kvstore(epath.Path("gs://b/x")) == "gs://b/x"
