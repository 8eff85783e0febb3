"""Profiler traces of chosen train steps with Pax's PROFILER_* knobs, readable by
``jax.profiler.ProfileData`` where TensorBoard's profile plugin looks; ``--jax_profiler_port``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import jax  # noqa: E402  (after the test helpers set up the platform)
import pytest
from etils import epath

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.perf import profiling
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from tasks.lm.synthetic import LmSyntheticTiny
from tests import cpu_xla_flags
from tests.gcs import BUCKET
from tests.paxlite.test_main import EXP, REPO

SHORT = {
    "ICI_MESH_SHAPE": (1, 8, 1),  # The 8 fake CPU devices of the test process.
    "PERCORE_BATCH_SIZE": 2,
    "NUM_TRAIN_STEPS": 6,
    "CHECKPOINT_EVERY_N_STEPS": 4,
    "SUMMARY_INTERVAL_STEPS": 100,
    "EVAL_INTERVAL_STEPS": 0,
    "PROFILER_NUM_STEPS": 2,
    "PROFILER_MIN_DURATION_SEC": 0.0,
}


def _train(job_dir, capsys=None, **knobs) -> str:
    exp = base_experiment.with_overrides(LmSyntheticTiny, {**SHORT, **knobs})()
    job = build_job(exp, exp.task(), exp.datasets(), job_dir)
    train_loop.run(job, peak_tflops=1.0)
    return capsys.readouterr().out if capsys else ""


def _traces(job_dir) -> list[epath.Path]:
    profile = profiling.trace_dir(job_dir) / "plugins" / "profile"
    return sorted(p for run in profile.iterdir() for p in run.iterdir())


def _train_step_events(xplane: bytes) -> list[str]:
    """Names of the trace's events that belong to the jitted train step."""
    data = jax.profiler.ProfileData.from_serialized_xspace(xplane)
    names = []
    for plane in data.planes:
        for line in plane.lines:
            names += [e.name for e in line.events if "train_step" in e.name]
    return names


@pytest.mark.slow
def test_the_chosen_steps_are_traced_into_the_job_dir(tmp_path, capsys):
    out = _train(tmp_path / "job", capsys, PROFILER_CAPTURE_STEP=2)
    assert "Profile of train steps 3-4" in out  # Steps 3 and 4 of this run (Pax counts from 0).
    files = _traces(tmp_path / "job")
    xplanes = [f for f in files if f.name.endswith(".xplane.pb")]
    assert len(xplanes) == 1 and any(f.name.endswith(".trace.json.gz") for f in files)
    assert _train_step_events(xplanes[0].read_bytes())


@pytest.mark.slow
def test_the_capture_step_counts_from_where_a_resumed_run_started(tmp_path, capsys):
    _train(tmp_path / "job", NUM_TRAIN_STEPS=4)
    out = _train(tmp_path / "job", capsys, NUM_TRAIN_STEPS=10, PROFILER_CAPTURE_STEP=1)
    assert "Restored checkpoint at step 4" in out
    assert "Profile of train steps 6-7" in out


@pytest.mark.slow
def test_no_trace_without_a_capture_step_and_process_0_traces_below_max_hosts(tmp_path):
    _train(tmp_path / "none")
    _train(tmp_path / "hosts", PROFILER_CAPTURE_STEP=0, PROFILER_MAX_NUM_HOSTS=1)
    assert not (profiling.trace_dir(tmp_path / "none") / "plugins").exists()
    assert [f for f in _traces(tmp_path / "hosts") if f.name.endswith(".xplane.pb")]


@pytest.mark.parametrize("knob, value", [("PROFILER_CAPTURE_STEP", -1), ("PROFILER_NUM_STEPS", 0)])
def test_bad_profiler_knobs_are_one_line(knob, value):
    with pytest.raises(KnobError, match=knob) as e:
        base_experiment.with_overrides(LmSyntheticTiny, {**SHORT, knob: value})()
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_trace_is_copied_into_a_bucket_job_dir(emulator, capsys):
    job_dir = epath.Path(f"gs://{BUCKET}/profiled")
    out = _train(job_dir, capsys, PROFILER_CAPTURE_STEP=0)
    assert "Profile of train steps 1-2" in out
    xplanes = [f for f in _traces(job_dir) if f.name.endswith(".xplane.pb")]
    assert len(xplanes) == 1 and _train_step_events(xplanes[0].read_bytes())


def test_jax_profiler_port_starts_the_profiler_server(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_xla_flags(1))
    command = [sys.executable, "-m", "paxlite.main", f"--exp={EXP}", f"--job_log_dir={tmp_path}"]
    command += [f"--jax_profiler_port={port}", "--set=NUM_TRAIN_STEPS=300", "--peak_tflops=1"]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    listening = False
    try:
        while proc.poll() is None and not listening:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                listening = True
            except OSError:
                time.sleep(0.2)
    finally:
        proc.kill()
        proc.communicate()
    assert listening
