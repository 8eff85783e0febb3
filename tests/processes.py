"""Processes the tests start: one ``python`` run, or several started together (a multi-process
job's), waited for, and killed if they hang; the environment and the free port they need."""

import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

from tests import REPO, cpu_xla_flags


def cpu_env(devices: int, **extra: str) -> dict[str, str]:
    """This process's environment for a run on ``devices`` fake CPU devices (JAX_PLATFORMS
    cpu, :func:`tests.cpu_xla_flags`), with the ``extra`` variables set too."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=cpu_xla_flags(devices), **extra)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (for a coordinator, a server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_python(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: pathlib.Path = REPO,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``cwd`` with ``env`` (None: this process's), waited for up to
    ``timeout`` seconds; text stdout and stderr captured, the exit code left to the caller."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_together(
    commands: Sequence[Sequence[str]],
    cwd: pathlib.Path,
    env: Mapping[str, str],
    timeout: float,
) -> list[subprocess.CompletedProcess]:
    """Starts every command at once (text stdout and stderr captured), waits for all of
    them up to ``timeout`` seconds each, and kills any still running; their results in
    order."""
    procs = [
        subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err)
        for p, (out, err) in zip(procs, outputs, strict=True)
    ]
