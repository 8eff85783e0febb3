"""Processes started together (a multi-process job's), waited for, and killed if they hang."""

import pathlib
import subprocess
from collections.abc import Mapping, Sequence


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
