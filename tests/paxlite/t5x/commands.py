"""A T5X command (``paxlite.t5x.train``, ``.eval``, ``.infer``, ``.convert_tf_checkpoint``)
run in this process as its ``python -m`` would: flags parsed (``--gin.NAME=VALUE`` rewritten as
T5X does), ``main`` called, its output and exit code kept, flags and gin put back; and the one
error line of a command refused."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Sequence

import gin
from absl import flags

from paxlite.formats.t5x import gin_run


def run_in_process(
    main: Callable[[Sequence[str]], None], prog: str, argv: Sequence[str]
) -> tuple[int, str, str]:
    """``prog ARGV`` through ``main``: ``(exit code, stdout, stderr)``."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            flags.FLAGS(gin_run.rewrite_gin_args([prog, *argv]))
            main([prog])
    except SystemExit as e:
        code = e.code
    finally:
        flags.FLAGS.unparse_flags()
        gin.clear_config(clear_constants=True)
    return code, stdout.getvalue(), stderr.getvalue()


def refusal(code: int, err: str) -> str:
    """The one ``paxlite: error:`` line of a refused command, checked: exit code 2, that line
    alone, no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("paxlite: error:")]
    assert code == 2 and len(lines) == 1, err[-3000:]
    assert "Traceback" not in err
    return lines[0]
