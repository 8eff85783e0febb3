"""The XLA flags the trainer adds on NVIDIA GPUs: XLA parses every one (on any platform, as
it does its GPU flags; an unknown flag aborts the process), the user's own XLA_FLAGS win,
and --xla_gpu_defaults=false or a host without an NVIDIA GPU adds none."""

import os
import subprocess
import sys

from paxlite.runtime import gpu_flags


def _jax_starts_with(xla_flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    code = "import jax; print(len(jax.devices()))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_jax_starts_with_every_flag_and_refuses_an_unknown_one():
    flags, added = gpu_flags.merged("")
    assert len(added) == len(gpu_flags.GPU_XLA_FLAGS)
    started = _jax_starts_with(flags)
    assert started.returncode == 0, started.stderr[-2000:]
    refused = _jax_starts_with(flags + " --xla_gpu_enable_no_such_thing=true")
    assert refused.returncode != 0 and "Unknown flag" in refused.stderr


def test_the_users_flags_win_and_the_rest_are_added():
    mine = "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/x"
    flags, added = gpu_flags.merged(mine)
    assert flags.startswith(mine)
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert len(added) == len(gpu_flags.GPU_XLA_FLAGS) - 1
    assert gpu_flags.set_in(flags) >= {name for name, _ in gpu_flags.GPU_XLA_FLAGS}


def test_added_only_on_an_nvidia_gpu_and_when_enabled(monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    assert gpu_flags.apply(enabled=False, on_gpu=True) == []
    assert gpu_flags.apply(enabled=True, on_gpu=False) == []
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    added = gpu_flags.apply(enabled=True, on_gpu=True)
    assert added and os.environ["XLA_FLAGS"].split()[1:] == added
    assert "XLA flags for NVIDIA GPUs" in capsys.readouterr().out
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert not gpu_flags.nvidia_gpu_present()  # (also false on this CPU host without it)
