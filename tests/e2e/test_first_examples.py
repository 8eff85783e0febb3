"""A newcomer follows each docs page's first example verbatim on a CPU: every command ends
with exit 0, each training run's loss falls well below its start, each ``generate`` returns
new tokens, and every file written has the process's normal permissions (umask 027: files
0o640, folders 0o750), orbax's own step directories aside.

The pages run in one process on one CPU device (a newcomer's laptop):
tests/e2e/first_examples.py, which reads each page as tests/docs_examples.py does and reports
what each command and expression did (one process for all pages: the imports, TensorFlow's
traced input functions and JAX's compiled programs are paid once, about 12 CPU seconds of 78).
"""

from __future__ import annotations

import json
import pathlib
import re
import stat
from typing import Any

import pytest

from tests.e2e import first_examples
from tests.processes import cpu_env, run_python

pytestmark = pytest.mark.runs_first  # A minute of runs in one test: scheduled first.

#: Each page's first example: (its training commands, its ``generate`` expressions). A
#: training command is one that printed a first-step loss or a ``step N/M | loss`` line.
EXPECTED_RUNS = {"pax": (0, 1), "hugging-face": (1, 1), "lora": (1, 0), "t5": (1, 1), "t5x": (1, 0)}
PAGES = list(EXPECTED_RUNS)
#: A training command's last loss at most this fraction of its first.
LOSS_FALLS_TO = 0.6
#: The folders orbax writes on its own (a paxlite job's ``checkpoints/<step>/``).
_ORBAX_STEP = re.compile(r"/checkpoints/\d+$")
_FILE_MODE, _FOLDER_MODE = 0o640, 0o750


def run_first_examples(pages: list[str], out: pathlib.Path) -> tuple[dict[str, dict], str]:
    """docs/PAGE.md's first example of each page, ``/tmp/`` as ``out/PAGE/``: the helper's
    report of each page it finished (by page), and how it ended (its exit code and the end
    of its stderr; "" when it ended with exit 0)."""
    done = run_python(
        ["-m", "tests.e2e.first_examples", str(out), *[f"docs/{page}.md" for page in pages]],
        env=cpu_env(1),
        timeout=900,
    )
    reports = [
        json.loads(line.removeprefix(first_examples.REPORT))
        for line in done.stdout.splitlines()
        if line.startswith(first_examples.REPORT)
    ]
    ended = "" if done.returncode == 0 else f"exit {done.returncode}:\n{done.stderr[-5000:]}"
    return {pathlib.Path(r["page"]).stem: r for r in reports}, ended


def failed(report: dict[str, Any]) -> list[str]:
    """The commands that did not exit 0 and the statements that raised."""
    commands, expressions = report["commands"], report["expressions"]
    exits = [f"line {c['line']}: exit {c['exit_code']}" for c in commands if c["exit_code"]]
    return exits + [f"line {e['line']}: {e['error']}" for e in expressions if e["error"]]


def trains(command: dict[str, Any]) -> bool:
    """Whether a command trained: it printed a first-step loss or a summary's loss."""
    return bool(command["losses"]) or command["first_step_loss"] is not None


def trained_too_little(command: dict[str, Any]) -> str | None:
    """Why a training command's loss did not fall to LOSS_FALLS_TO of its start, its first
    step's (None: it did, or it trained nothing); both lines must be there."""
    if not trains(command):
        return None
    start, losses = command["first_step_loss"], command["losses"]
    if start is None or not losses:
        return f"line {command['line']}: no first-step loss or no summary loss was printed"
    last = losses[-1]
    if last <= LOSS_FALLS_TO * start:
        return None
    return f"line {command['line']}: loss {start:.4f} -> {last:.4f} (> {LOSS_FALLS_TO} x start)"


def generated_nothing(expression: dict[str, Any]) -> str | None:
    """Why a ``generate`` expression returned no new tokens (None: it did, or it is no
    ``generate``): ids ``[B, n > 0]``, or texts of which at least one is not empty."""
    if ".generate(" not in expression["source"]:
        return None
    value = expression["value"] or {}
    shape, texts = value.get("shape"), value.get("texts")
    if shape is not None and len(shape) == 2 and shape[0] > 0 and shape[1] > 0:
        return None
    if texts and any(texts):
        return None
    return f"line {expression['line']}: no new tokens: {value}"


def wrong_modes(out: pathlib.Path) -> list[str]:
    """Each file (folder) under ``out`` whose mode is not 0o640 (0o750), orbax's step
    folders left out."""
    wrong = []
    for path in sorted(out.rglob("*")):
        if path.is_symlink() or any(_ORBAX_STEP.search(str(p)) for p in [path, *path.parents]):
            continue
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != (_FOLDER_MODE if path.is_dir() else _FILE_MODE):
            wrong.append(f"{path.relative_to(out)}: {oct(mode)}")
    return wrong


def page_problems(page: str, report: dict[str, Any] | None, out: pathlib.Path) -> list[str]:
    """Everything wrong with one page's run (its report None: it was not reported)."""
    if report is None:
        return ["not reported: the run ended before it"]
    runs = (
        sum(trains(c) for c in report["commands"]),
        sum(".generate(" in e["source"] for e in report["expressions"]),
    )
    problems = [] if runs == EXPECTED_RUNS[page] else [f"(trainings, generates) {runs}"]
    problems += failed(report)
    problems += [why for c in report["commands"] if (why := trained_too_little(c))]
    problems += [why for e in report["expressions"] if (why := generated_nothing(e))]
    return problems + [f"mode {wrong}" for wrong in wrong_modes(out)]


@pytest.mark.slow
def test_each_pages_first_example_runs_as_the_page_says(tmp_path):
    reports, ended = run_first_examples(PAGES, tmp_path)
    problems = {page: page_problems(page, reports.get(page), tmp_path / page) for page in PAGES}
    assert {page: p for page, p in problems.items() if p} == {}, ended
