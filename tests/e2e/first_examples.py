"""``python -m tests.e2e.first_examples OUT PAGE...``: each docs page's first example, run
as a newcomer copies it (tests/e2e/test_first_examples.py checks what it reports).

The fences before a page's first ``## `` heading, read as tests/docs_examples.py reads them
(what the docs test checks is what runs), with ``/tmp/`` written as ``OUT/<page>/`` (the
page's file name without ``.md``), run in this one process under umask 027, from the
repository root:

- a ``bash`` command of a console script (pyproject.toml's ``[project.scripts]``) calls the
  script's entry point with ``sys.argv`` set; ``python -m MODULE`` runs the module as
  ``__main__`` (runpy), ``python FILE`` the file; an environment prefix (``PYTHONPATH=...``)
  holds for its command. Anything else (a pipe, a loop, another program) runs in ``bash``.
  Between commands absl's flags are unparsed and gin's bindings cleared, as a new process
  would find them.
- ``python`` fences run in one namespace a page, each top-level expression's value kept (as a
  REPL shows it); ``python NAME.py`` fences are written to the page's folder and importable as
  ``NAME``.

The pages share the process (its imports, TensorFlow's traced functions, JAX's compiled
programs: tens of CPU seconds less than a process a page). After each page, one JSON line
after :data:`REPORT` on stdout: per command its exit code, the losses of its
``step N/M | loss X`` lines and its first step's loss; per expression a summary of its value
(:func:`summary`); the seconds and CPU seconds of each. The commands' output is echoed to
stderr. A console script that fails may end this process at once (paxlite's do,
``exits.end_process``): then its exit code is this process's, and the pages after it are not
reported.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib
import io
import json
import os
import pathlib
import re
import runpy
import shlex
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

from tests import REPO
from tests.docs_examples import Fence, Kind, _commands, _fences

#: What starts the report's line on stdout.
REPORT = "first_examples: "
#: A summary line of a training run, and the first step's line (paxlite/train/summaries.py,
#: periodic_actions.FirstStepReport).
_STEP_LOSS = re.compile(r"^step +\d+/\d+ \| loss +(\S+) \|", re.MULTILINE)
_FIRST_LOSS = re.compile(r"^First step done .*; loss (\S+);", re.MULTILINE)
_HEADING = re.compile(r"^## ")
_ENV_PREFIX = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.DOTALL)
#: bash's operators, expansions and compound commands: a command holding one runs in bash.
_OPERATOR = re.compile(r"[|&;<>()]+")
_SINGLE_QUOTED = re.compile(r"'[^']*'")
_QUOTED = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"")
_COMPOUND = {"for", "if", "while", "until", "case", "{", "!", "time"}


class Route(enum.Enum):
    """How a ``bash`` command runs."""

    SCRIPT = "console script"  # pyproject.toml's entry point, in this process.
    MODULE = "python -m"  # runpy, in this process.
    FILE = "python FILE"  # runpy, in this process.
    SHELL = "bash"  # A process of its own.


@dataclasses.dataclass
class CommandRun:
    """One ``bash`` command (``/tmp/`` already the page's folder): line, route and outcome.

    Attributes:
      losses: the loss of each ``step N/M | loss X`` line, in order.
      first_step_loss: the loss the first step's line says (None: no such line).
      seconds, cpu_seconds: wall and this process's CPU time (all threads) it took.
    """

    line: int
    command: str
    route: str
    exit_code: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    first_step_loss: float | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclasses.dataclass
class ExpressionRun:
    """One top-level statement of a ``python`` fence: its source, and for an expression its
    value's :func:`summary` (None for other statements); ``error``: the exception it raised."""

    line: int
    source: str
    value: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0
    cpu_seconds: float = 0.0


# --- the page ---------------------------------------------------------------------------


def first_fences(page: pathlib.Path, out: pathlib.Path) -> list[Fence]:
    """The fences of ``page`` (a markdown file) before its first ``## `` heading outside a
    fence, ``/tmp/`` in them written as ``OUT/``."""
    text = page.read_text().replace("/tmp/", f"{out}/")
    fences, problems = _fences(str(page), text)
    if problems:
        raise ValueError("; ".join(map(str, problems)))
    inside = {n for f in fences for n in range(f.line, f.line + len(f.body) + 2)}
    lines = text.splitlines()
    heading = next(
        (n for n, s in enumerate(lines, start=1) if _HEADING.match(s) and n not in inside),
        len(lines) + 1,
    )
    return [fence for fence in fences if fence.line < heading]


def console_scripts() -> dict[str, str]:
    """pyproject.toml's ``[project.scripts]``: script name -> ``module:function``."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["project"]["scripts"])


# --- bash -------------------------------------------------------------------------------


def run_bash(fence: Fence, scripts: Mapping[str, str]) -> list[CommandRun]:
    """Each command of a ``bash`` fence, in order."""
    commands, breaks = _commands(fence)
    if breaks:
        raise ValueError(f"line {fence.line}: a broken command: {breaks}")
    return [run_command(line, text, scripts) for line, text in commands]


def run_command(line: int, text: str, scripts: Mapping[str, str]) -> CommandRun:
    """One command line (continuations joined), its output echoed and read for losses."""
    words = shlex.split(text)
    env = {}
    while words and _ENV_PREFIX.match(words[0]):
        name, value = _ENV_PREFIX.match(words[0]).groups()
        env[name], words = value, words[1:]
    route = _route(text, words, scripts)
    run = CommandRun(line, text, route.value)
    print(f"first_examples: line {line}: {text}", file=sys.stderr, flush=True)
    start, cpu = time.perf_counter(), time.process_time()
    with _echoed() as output:
        if route is Route.SHELL:
            run.exit_code = _shell(text)
        else:
            with _environment(env):
                run.exit_code = _in_process(route, words, scripts)
    run.seconds, run.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    printed = output.getvalue()
    run.losses = [float(x) for x in _STEP_LOSS.findall(printed)]
    first = _FIRST_LOSS.search(printed)
    run.first_step_loss = float(first.group(1)) if first else None
    return run


def _route(text: str, words: list[str], scripts: Mapping[str, str]) -> Route:
    """How the command ``text`` (its words without the environment prefix) runs."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True  # An operator outside quotes is a word of its own.
    if any(_OPERATOR.fullmatch(w) for w in lexer) or _expands(text):
        return Route.SHELL
    if not words or words[0] in _COMPOUND:
        return Route.SHELL
    if words[0] in scripts:
        return Route.SCRIPT
    if re.fullmatch(r"python(3(\.\d+)?)?", words[0]) and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            return Route.MODULE
        if not words[1].startswith("-"):
            return Route.FILE
    return Route.SHELL


def _expands(text: str) -> bool:
    """Whether bash would expand something of ``text``: ``$`` or a backquote outside single
    quotes, a glob outside quotes."""
    unquoted = _QUOTED.sub("", text)
    return bool(re.search(r"[`$]", _SINGLE_QUOTED.sub("", text)) or re.search(r"[*?]", unquoted))


def _in_process(route: Route, words: list[str], scripts: Mapping[str, str]) -> int:
    """A console script's entry point, or ``python -m MODULE`` / ``python FILE`` as runpy
    runs them, with ``sys.argv`` set: the exit code (an exception: 1, its traceback shown)."""
    from absl import flags

    saved_argv, saved_flags = sys.argv, set(flags.FLAGS)
    try:
        if route is Route.SCRIPT:
            sys.argv = list(words)
            _call_entry_point(scripts[words[0]])
        elif route is Route.MODULE:
            sys.argv = [words[2], *words[3:]]
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(words[1:])
            runpy.run_path(words[1], run_name="__main__")
        return 0
    except SystemExit as e:
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except Exception:  # noqa: BLE001  The command failed: its traceback, exit 1 (as python).
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        _fresh_flags_and_gin(saved_flags)


def _call_entry_point(target: str) -> None:
    """Calls ``module:function``. A script that defines its flags as it starts (export's
    ``define_flags(_FLAGS)``) cannot start twice in one process: the second time its module
    is reloaded first, as a new process would load it."""
    from absl import flags

    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        getattr(module, function)()
    except flags.DuplicateFlagError:
        getattr(importlib.reload(module), function)()


def _fresh_flags_and_gin(before: set[str]) -> None:
    """What a command run as ``__main__`` left behind, forgotten, as a new process would not
    have it: absl's flags unparsed, and those its ``__main__`` block defined (absl names their
    module by its file: no module of ``sys.modules``) deleted
    (``python -m tasks.lm.prompt_completion``'s required ``--write_examples`` would refuse
    any later command line); the experiments it registered as ``__main__.Class``; gin's
    bindings."""
    from absl import flags

    from paxlite.experiments import registry

    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - before:
        if flags.FLAGS.find_module_defining_flag(name) not in sys.modules:
            delattr(flags.FLAGS, name)
    for experiment in [e for e in registry._REGISTRY if e.startswith("__main__.")]:
        del registry._REGISTRY[experiment]
    if "gin" in sys.modules:
        sys.modules["gin"].clear_config(clear_constants=True)


def _shell(text: str) -> int:
    """``bash -c TEXT`` with this Python's scripts first on PATH; its output echoed."""
    path = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", text],
        env=dict(os.environ, PATH=path),
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """``NAME=VALUE`` prefixes for one command: set meanwhile; ``PYTHONPATH``'s folders also
    on ``sys.path`` (as a new interpreter would have them)."""
    saved_env, saved_path = dict(os.environ), list(sys.path)
    os.environ.update(env)
    paths = env.get("PYTHONPATH", "")
    sys.path[:0] = [str(pathlib.Path(p).resolve()) for p in paths.split(os.pathsep) if p]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path


class _Echo(io.StringIO):
    """Keeps what is written, and echoes it to this process's stderr."""

    def write(self, text: str) -> int:
        sys.__stderr__.write(text)
        return super().write(text)

    def flush(self) -> None:
        sys.__stderr__.flush()


@contextlib.contextmanager
def _echoed() -> Iterator[io.StringIO]:
    """stdout and stderr kept (into what it yields) and echoed to stderr."""
    output = _Echo()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        yield output


# --- python -----------------------------------------------------------------------------


def run_python(fence: Fence, namespace: dict[str, Any]) -> list[ExpressionRun]:
    """Each top-level statement of a ``python`` fence, in ``namespace``; an expression's
    value summarized."""
    source = "\n".join(fence.body)
    runs = []
    for node in ast.parse(source).body:
        run = ExpressionRun(fence.line + node.lineno, ast.get_source_segment(source, node))
        start, cpu = time.perf_counter(), time.process_time()
        name = f"<{fence.line + node.lineno}>"
        try:
            with _echoed():
                if isinstance(node, ast.Expr):
                    code = compile(ast.Expression(node.value), name, "eval")
                    run.value = summary(eval(code, namespace))  # The page's own code.
                else:
                    exec(compile(ast.Module([node], []), name, "exec"), namespace)
        except Exception as e:  # noqa: BLE001  Kept in the report; the test fails on it.
            run.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        run.seconds, run.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        runs.append(run)
    return runs


def summary(value: Any) -> dict[str, Any]:
    """What a value is: an array's ``shape`` and ``dtype``; a list of texts' ``texts``; and
    its type and (shortened) repr."""
    kind, shown = type(value).__name__, repr(value)[:300]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return {"type": kind, "shape": list(value.shape), "dtype": str(value.dtype), "repr": shown}
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
        return {"type": kind, "texts": list(value), "repr": shown}
    return {"type": kind, "repr": shown}


# --- the run ----------------------------------------------------------------------------


def run_page(page: pathlib.Path, out: pathlib.Path) -> dict[str, Any]:
    """Every fence of the page's first example, in order, ``/tmp/`` as ``out``: the report."""
    scripts, namespace = console_scripts(), {"__name__": "__main__"}
    commands, expressions = [], []
    start, cpu = time.perf_counter(), time.process_time()
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(out))  # The page's ``python NAME.py`` modules.
    written = []
    for fence in first_fences(page, out):
        if fence.kind is Kind.BASH:
            commands += run_bash(fence, scripts)
        elif fence.kind is Kind.PYTHON and fence.module is not None:
            (out / f"{fence.module}.py").write_text("\n".join(fence.body) + "\n")
            written.append(fence.module)
        elif fence.kind is Kind.PYTHON:
            expressions += run_python(fence, namespace)
    sys.path.remove(str(out))
    for module in written:  # The next page may write a module of the same name.
        sys.modules.pop(module, None)
    return {
        "page": str(page),
        "commands": [dataclasses.asdict(c) for c in commands],
        "expressions": [dataclasses.asdict(e) for e in expressions],
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
    }


def main(argv: list[str]) -> None:
    out, pages = pathlib.Path(argv[1]).resolve(), [pathlib.Path(p) for p in argv[2:]]
    os.umask(0o027)
    os.chdir(REPO)  # The pages name the repository's files from its root.
    for page in pages:
        report = run_page(page, out / page.stem)
        print(REPORT + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv)
