"""A newcomer's first run prints no start-up noise: with libtpu installed (the ``[tpu]``
extra) on a host without a TPU, JAX would have libtpu probe for one and print a block of
errors; paxlite names the platforms present instead, and says so in its first line."""

import importlib.util
import os
import re
import subprocess

import pytest

from tests import FIXTURES, REPO
from tests.processes import run_python

#: Lines of libtpu's, TensorFlow's and CUDA's probing (and absl's C++ log preamble).
_PROBING = re.compile(
    r"libtpu|TPU|InitGoogle|Source Location Trace|cudart|cuInit|cuda|oneDNN|"
    r"absl::InitializeLog|^[IWE]\d{4} ",
    re.MULTILINE,
)


def _as_a_newcomer_runs(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` with the environment a newcomer's shell has: none of the variables
    the suite sets to keep JAX and TensorFlow quiet."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")
    }
    env["XLA_FLAGS"] = ""  # The suite's fake device count, too.
    return run_python(args, env, cwd=tmp_path)


@pytest.mark.slow
def test_the_first_command_and_from_pretrained_start_quietly_on_a_host_without_a_tpu(tmp_path):
    assert importlib.util.find_spec("libtpu") is not None, "the [tpu] extra: what makes noise"
    assert not any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio"))  # No TPU here.
    run = _as_a_newcomer_runs(
        tmp_path,
        "-m",
        "paxlite.main",
        "--exp=tasks.lm.synthetic.LmSyntheticTiny",
        f"--job_log_dir={tmp_path / 'tiny'}",
        "--mode=train_and_eval",
        "--set=NUM_TRAIN_STEPS=2",
        "--peak_tflops=1",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[0] == (
        "Platform: cpu (no TPU attached: no /dev/accel* or /dev/vfio device; set JAX_PLATFORMS "
        "to choose)."
    )
    assert not _PROBING.search(run.stderr), run.stderr[-3000:]
    loaded = _as_a_newcomer_runs(
        tmp_path,
        "-c",
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from paxlite.inference import from_pretrained; "
        f"print(type(from_pretrained({str(FIXTURES / 'hf' / 'llama3')!r})).__name__)",
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "PretrainedLm", loaded.stderr
    assert not _PROBING.search(loaded.stderr), loaded.stderr[-3000:]
