"""Two local processes (DCN [2,1,1] x ICI [1,4,1]) through main.py == one process with 8 devices."""

import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests import REPO
from tests.paxlite.test_main import (
    EXP,
    assert_ended_cleanly,
    restore_params,
    run_main_in_process,
    scalar_series,
)
from tests.processes import cpu_env, free_port, run_together

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

COMMON = [
    "--set=PERCORE_BATCH_SIZE=2",
    "--set=SUMMARY_INTERVAL_STEPS=1",
    "--set=CHECKPOINT_EVERY_N_STEPS=3",
    "--set=EVAL_INTERVAL_STEPS=0",
    "--set=DROPOUT_PROB=0.1",
    "--peak_tflops=1",  # No MFU calibration (a timed matmul in each run): not what these check.
]


def _two_process_command(
    job: pathlib.Path, port: int, i: int, *args: str, pax_flags: bool = False
) -> list[str]:
    """The command of process ``i``; with ``pax_flags``, joining with Pax's GPU multi-host flags."""
    join = (
        [
            "--multiprocess_gpu",
            f"--server_addr=127.0.0.1:{port}",
            "--num_hosts=2",
            f"--host_idx={i}",
        ]
        if pax_flags
        else [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"]
    )
    return [
        sys.executable,
        "-m",
        "paxlite.main",
        f"--exp={EXP}",
        f"--job_log_dir={job}",
        *COMMON,
        "--set=ICI_MESH_SHAPE=1,4,1",
        "--set=DCN_MESH_SHAPE=2,1,1",
        *join,
        "--distributed_timeout_s=120",
        *args,
    ]


@pytest.mark.slow
def test_two_processes_match_one_and_checkpoints_restore_across(tmp_path):
    multi, single = tmp_path / "multi", tmp_path / "single"
    port = free_port()
    commands = [_two_process_command(multi, port, i, "--set=NUM_TRAIN_STEPS=6") for i in range(2)]
    results = run_together(commands, REPO, cpu_env(4), timeout=400)
    for result in results:
        # Both leave the job in order: nothing aborts or prints at exit.
        assert_ended_cleanly(result)
    assert "(2 processes)" in results[0].stdout and "'replica': 2, 'data': 4" in results[0].stdout
    assert "step" not in results[1].stdout  # only process 0 prints progress (gloo talks on both)
    assert (multi / "config.txt").exists()

    # The reference: one process of 8 devices (this one: the point is the 2 processes).
    single_args = [*COMMON, "--set=NUM_TRAIN_STEPS=6", "--set=ICI_MESH_SHAPE=2,4,1"]
    code, _, err = run_main_in_process(f"--job_log_dir={single}", *single_args)
    assert code == 0, err[-3000:]
    multi_losses = scalar_series(multi / "summaries" / "train", "train/loss")
    single_losses = scalar_series(single / "summaries" / "train", "train/loss")
    assert [s for s, _ in multi_losses] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(
        [v for _, v in multi_losses], [v for _, v in single_losses], rtol=1e-5, atol=1e-5
    )
    # Every final parameter, as the two runs' step-6 checkpoints hold them.
    multi_params, single_params = restore_params(multi, 6), restore_params(single, 6)
    assert jax.tree_util.tree_structure(multi_params) == jax.tree_util.tree_structure(single_params)
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(multi_params)[0],
        jax.tree_util.tree_leaves(single_params),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path)
        )

    # The 2-process checkpoint restores in a 1-process, 8-device run (and evaluates).
    code, out, err = run_main_in_process(f"--job_log_dir={multi}", *single_args, "--mode=eval")
    assert code == 0, err[-3000:]
    assert "Restored the parameters of step 6" in out


@pytest.mark.slow
def test_a_dead_peer_stops_the_others_in_bounded_time_naming_it(tmp_path):
    """Process 1 is killed mid-training; process 0 stops within the peer timeout, naming it.

    The processes join with Pax's flags (--multiprocess_gpu --server_addr --num_hosts
    --host_idx): they train together before one dies, so joining works as with ours.
    """
    job, port, timeout_s = tmp_path / "job", free_port(), 3
    logs = [(tmp_path / f"err{i}.txt").open("w") for i in range(2)]
    procs = [
        subprocess.Popen(
            _two_process_command(
                job,
                port,
                i,
                "--set=NUM_TRAIN_STEPS=100000",
                f"--peer_timeout_s={timeout_s}",
                pax_flags=True,
            ),
            cwd=REPO,
            env=cpu_env(4),
            stdout=subprocess.PIPE,
            stderr=logs[i],
            text=True,
        )
        for i in range(2)
    ]
    try:
        for line in procs[0].stdout:  # Wait until both train (process 0 prints each step).
            if line.startswith("step"):
                break
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        procs[0].stdout.close()
        code = procs[0].wait(timeout=120)
        stopped_after = time.monotonic() - killed_at
    finally:
        for p in procs:
            p.kill()
        for f in logs:
            f.close()
    err = (tmp_path / "err0.txt").read_text()
    assert code == 4, err[-3000:]
    assert "paxlite: error: process 1 of 2 (host " in err
    assert f"stopped responding: no heartbeat for {timeout_s} s" in err
    assert "Terminating process" not in err  # Not JAX's anonymous abort.
    print(f"process 0 stopped {stopped_after:.1f} s after process 1 was killed")
    assert stopped_after < timeout_s + 15


@pytest.mark.slow
def test_a_failed_peer_stops_the_others_at_once_naming_it(tmp_path):
    """Process 1 exits with an error (its job dir is a file); process 0 stops, naming it."""
    job, port = tmp_path / "job", free_port()
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("")
    commands = [
        _two_process_command(job if i == 0 else not_a_dir, port, i, "--set=NUM_TRAIN_STEPS=100000")
        for i in range(2)
    ]
    first, second = run_together(commands, REPO, cpu_env(4), timeout=120)
    assert second.returncode == 2 and "is a file, not a directory" in second.stderr
    assert first.returncode == 4, first.stderr[-3000:]
    assert "paxlite: error: process 1 of 2 (host " in first.stderr
    assert "exited with code 2: " in first.stderr and "is a file, not a directory" in first.stderr
