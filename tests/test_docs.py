"""Docs that cannot drift: every fenced example of README.md and docs/ is what it says it is
(tests/docs_examples.py checks it without running it), and a broken example fails."""

import textwrap
import tomllib

import pytest

from tests import REPO
from tests.docs_examples import SCRIPTS, check_markdown

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_the_examples_are_what_they_say(page):
    problems = check_markdown(str(page.relative_to(REPO)), page.read_text())
    assert not problems, "\n".join(map(str, problems))


def _fenced(kind: str, body: str, before: str = "") -> str:
    return f"{before}\n\n```{kind}\n{textwrap.dedent(body).strip()}\n```\n"


_TINY = "paxlite --exp=LmSyntheticTiny --job_log_dir=/tmp/tiny"
_HF_ELSEWHERE = "paxlite --exp=HfSyntheticLm --job_log_dir=/tmp/hf --set HF_MODEL=/models/llama"
_HF = "paxlite --exp=HfSyntheticLm --job_log_dir=/tmp/hf --set HF_MODEL=tests/fixtures/hf/llama3"


@pytest.mark.parametrize(
    "page, line, problem",
    [
        (_fenced("bash", f"{_TINY} --job_log_dri=/tmp/x"), 4, "unknown flag --job_log_dri"),
        (_fenced("bash", f"{_TINY} --set NUM_LAYRES=4"), 4, "has no knob 'NUM_LAYRES'"),
        (_fenced("bash", f"{_TINY} --set NUM_LAYERS=four"), 4, "NUM_LAYERS to 'four'"),
        (
            _fenced("bash", "paxlite --exp=LmSyntheticTinny --job_log_dir=/tmp/x"),
            4,
            "LmSyntheticTinny",
        ),
        (
            _fenced("bash", f"{_HF_ELSEWHERE} --fdl_set learner.lr=0.1"),
            4,
            "--fdl_set path 'learner.lr' must start with 'task.'",
        ),
        (
            _fenced("bash", f"{_HF} \\\n  --fdl_set task.learner.optimizer.learning_rat=0.1"),
            4,
            "learning_rat",
        ),
        (
            _fenced("python", "import os\nfrom paxlite.inference import from_pretrainedd"),
            5,
            "from_pretrainedd",
        ),
        (_fenced("text", "step 10: loss 1.0", "What it prints:"), 3, "output without"),
        (
            _fenced("text", "step 10: loss 1.0", "example output (measured 2025-13-01):"),
            3,
            "'2025-13-01' of 'example output (measured ...)' is not a date",
        ),
        (
            _fenced("text", "step 10: loss 1.0", "example output (measured 2999-01-01):"),
            3,
            "is in the future",
        ),
        (_fenced("", "paxlite --help"), 3, "a bare fence"),
        (_fenced("console", "paxlite --help"), 3, "fence kind 'console'"),
        (
            _fenced("bash", f"{_TINY} \\   # a comment\n  --mode=train_and_eval"),
            4,
            "a comment after '\\': bash ends the command there",
        ),
        (_fenced("bash", f"{_TINY} \\  \n  --mode=eval"), 4, "spaces after the closing '\\'"),
        (_fenced("bash", f"{_TINY}\n  --mode=train_and_eval"), 5, "a line starting with '-'"),
        (_fenced("bash", f"{_TINY}\n# step 10: loss 1.0"), 5, "output in a bash fence"),
        (_fenced("bash", "python -m paxlite.no_such_module"), 4, "no such module"),
        (_fenced("bash", "python benchmarks/no_such.py"), 4, "no file of the repository"),
        (_fenced("bash", "paxlite-export --job_log_dir=/tmp/ft"), 4, "needs --job_log_dir"),
        (_fenced("bash", "paxlite-bench --exp=LmSyntheticTiny --stesp=3"), 4, "--stesp"),
        (
            _fenced("bash", "python -m paxlite.bench_sweep --job_log_dir=/tmp/s --exp=Nope"),
            4,
            "Nope",
        ),
        (  # absl's flags are global: T5X's are defined once a T5X command was read.
            _fenced("bash", f"python -m paxlite.t5x.train --help\n{_TINY} --gin_file=a.gin"),
            5,
            "unknown flag --gin_file (a flag of paxlite.t5x.command, not of paxlite.main)",
        ),
        (
            _fenced("bash", "python -m paxlite.t5x.train --gin_fiel=a.gin"),
            4,
            "unknown flag --gin_fiel",
        ),
        (
            _fenced("bash", "paxlite --exp=LmSyntheticTiny --mode=compile --compile_topology=v9-8"),
            4,
            "v9-8",
        ),
    ],
    ids=[
        "unknown_flag",
        "unknown_knob",
        "knob_of_another_type",
        "unknown_exp",
        "fdl_set_syntax",
        "fdl_set_path_with_shipped_files",
        "missing_import",
        "output_without_its_date",
        "malformed_date",
        "future_date",
        "bare_fence",
        "unknown_fence_kind",
        "comment_after_continuation",
        "spaces_after_continuation",
        "line_left_alone",
        "output_in_bash",
        "python_m_no_module",
        "python_no_file",
        "export_without_out",
        "bench_flag",
        "sweep_exp",
        "t5x_flag_given_to_paxlite",
        "t5x_unknown_flag",
        "unknown_tpu_slice",
    ],
)
def test_a_broken_example_fails(page, line, problem):
    problems = check_markdown("snippet.md", page)
    assert len(problems) == 1, "\n".join(map(str, problems))
    assert str(problems[0]).startswith(f"snippet.md:{line}: ")
    assert problem in str(problems[0]) and "\n" not in str(problems[0])


def test_examples_that_hold_pass():
    """What the conventions allow: placeholders, loops, environment prefixes, optional
    flags, a command inside gcloud's, an ``--fdl_set`` path built on shipped files, marked
    output, Pax's code beside ours."""
    page = (
        _fenced(
            "bash",
            f"""
            # Train (a comment, not output):
            {_TINY} \\
                --set NUM_LAYERS=2 --fdl_set task.learner.optimizer.learning_rate=0.01
            for i in 0 1; do
              XLA_FLAGS=--xla_force_host_platform_device_count=4 {_TINY} \\
                --coordinator_address=127.0.0.1:1234 --num_processes=2 --process_id=$i &
            done; wait
            {_HF} --set ICI_MESH_SHAPE=1,1,1 --fdl_set 'task.learner.optimizer.learning_rate=0.1'
            paxlite --exp=LmSyntheticTiny --job_log_dir=<DIR> --set NUM_LAYERS=<N> 2>&1 | tee log
            paxlite-export --job_log_dir=/tmp/ft --out=$OUT [--step=<N>] [--dtype=bfloat16]
            gcloud compute tpus tpu-vm ssh my-tpu --worker=all --command="paxlite \\
                --exp=LmSyntheticTiny --job_log_dir=gs://bucket/tiny"
            paxlite --help_knobs --exp=LmSyntheticTiny
            pip install -e . && python -m pytest -q tests/test_docs.py
            """,
        )
        + _fenced("python", "from paxlite.inference import from_pretrained")
        + _fenced("python paxml", "from paxml import experiment_registry")
        + _fenced("text", "step 10: loss 1.0", "example output (measured 2025-01-31):")
        + _fenced("tree", "docs/\n  index.md")
    )
    problems = check_markdown("snippet.md", page)
    assert not problems, "\n".join(map(str, problems))


_PAGE_MODULE = """
from paxlite import experiment_registry
from tasks.lm.synthetic import LmSyntheticTiny


@experiment_registry.register
class PageTinyLm(LmSyntheticTiny):
    EVAL_BATCHES: int = 8
"""


def test_a_module_the_page_writes_is_checked_with_its_commands():
    """A ``python NAME.py`` fence is importable as NAME while the page's commands are read:
    its experiment resolves and its own knobs are checked; afterwards it is forgotten."""
    run = "paxlite --exp=page_experiments.PageTinyLm --job_log_dir=/tmp/page"
    module = _fenced("python page_experiments.py", _PAGE_MODULE)
    assert not check_markdown("page.md", module + _fenced("bash", f"{run} --set EVAL_BATCHES=2"))
    problems = check_markdown("page.md", module + _fenced("bash", f"{run} --set EVAL_BATHCES=2"))
    assert len(problems) == 1 and "has no knob 'EVAL_BATHCES'" in str(problems[0])
    problems = check_markdown("page.md", _fenced("bash", f"{run} --set EVAL_BATCHES=2"))
    assert len(problems) == 1 and "page_experiments" in str(problems[0])  # Not left behind.


def test_every_console_script_is_checked():
    """A new console script in pyproject.toml needs its checker in tests/docs_examples.py."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(SCRIPTS)
