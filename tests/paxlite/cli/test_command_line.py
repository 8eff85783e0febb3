"""The command line as a newcomer types it: mistakes in it are one ``paxlite: error:`` line
and exit 2 (absl's own ends in ``FATAL Flags parsing error``, usage text and exit 1), and
``--help`` / ``--help_knobs`` show paxlite's flags and an experiment's knobs."""

import subprocess
import sys

import pytest
from absl import flags

from paxlite import main
from paxlite.cli import command_line, help_text
from tests import REPO


@pytest.fixture(autouse=True)
def unparsed_flags():
    yield
    flags.FLAGS.unparse_flags()


def _parse(capsys, *args: str) -> tuple[int, str, str]:
    """``command_line.parse`` of ``paxlite ARGS`` as main.py calls it: ``(exit code, stdout,
    stderr)``."""
    with pytest.raises(SystemExit) as end:
        command_line.parse(["paxlite", *args], init_from_reads=main._kinds)
    out, err = capsys.readouterr()
    return end.value.code, out, err


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--job_log_dri=/tmp/job"],
            "unknown flag --job_log_dri (did you mean --job_log_dir?); paxlite --help lists "
            "the flags.",
        ),
        (["--mode=trian"], "--mode=trian is not one of its choices (did you mean train or "),
        (
            ["--set", "NUM_TRAIN_STEPS", "600"],
            "--set NUM_TRAIN_STEPS 600: --set takes KNOB=VALUE as one word, e.g. --set "
            "NUM_TRAIN_STEPS=600.",
        ),
        (["--peak_tflops=fast"], "--peak_tflops=fast: could not convert string to float: "),
        (["train"], "unexpected argument 'train': paxlite takes only flags (--name=value; "),
        (["--help_knobs"], "--help_knobs lists an experiment's knobs: add --exp=NAME."),
        (
            ["--print_config=maybe"],
            "--print_config=maybe: a yes/no flag takes true or false (or --print_config, "
            "--noprint_config).",
        ),
        (["--restore_checkpoint_step=last"], "--restore_checkpoint_step=last: "),
        (["--", "--help"], "unexpected argument '--help': "),  # After --: no flag.
    ],
    ids=[
        "unknown_flag",
        "bad_choice",
        "set_without_equals",
        "wrong_type",
        "a_word",
        "no_exp",
        "not_yes_or_no",
        "repeatable_flag",
        "after_double_dash",
    ],
)
def test_a_command_line_mistake_is_one_line_and_exit_2(capsys, args, line):
    code, _, err = _parse(capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"paxlite: error: {line}"), err


def test_help_lists_paxlites_flags_by_group_one_line_each(capsys):
    code, out, _ = _parse(capsys, "--help")
    assert code == 0
    for also in (["--helpshort"], ["--help=true"], ["--exp=x", "-h"]):
        assert _parse(capsys, *also)[:2] == (0, out)
    assert command_line.parse(["paxlite", "--set", "--help"]) == ["paxlite"]  # A value.
    for title, _ in help_text.GROUPS:
        assert f"\n{title}:\n" in out
    lines = out.splitlines()
    for name in help_text.listed_flags():
        (line,) = [x for x in lines if x.startswith(f"  --{name}=") or x.startswith(f"  --{name} ")]
    assert "  --mode=train  What to run. One of: train|eval|" in out
    assert "--alsologtostderr" not in out and "--jax_" + "platforms" not in out  # absl's, JAX's.
    (init_from,) = [x for x in lines if x.startswith("  --init_from ")]
    for kind in ("paxml step", "hugging face model", "t5x checkpoint", "peft adapter"):
        assert kind in init_from


def test_help_knobs_lists_an_experiments_knobs_with_types_values_and_docs(capsys):
    code, out, _ = _parse(capsys, "--help_knobs", "--exp=tasks.lm.synthetic.LmSyntheticTiny")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "tasks.lm.synthetic.LmSyntheticTiny: its knobs (--set KNOB=VALUE), by group."
    assert "TransformerLmKnobs: Shape and architecture of paxlite's decoder-only Transformer" in out
    assert "    Shape: NUM_LAYERS, MODEL_DIMS, HIDDEN_DIMS, NUM_HEADS, NUM_KV_HEADS (None: " in out
    assert "  NUM_LAYERS: int = 2" in lines  # The tiny experiment's value, not the default.
    at = lines.index("  SEED: int = 1234")  # A knob with its own docstring entry.
    assert lines[at + 1] == "      seed of the model init and training RNG."


@pytest.mark.slow
def test_the_entry_point_parses_with_paxlites_parser():
    proc = subprocess.run(
        [sys.executable, "-m", "paxlite.main", "--job_log_dri=/tmp/job"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if "error" in x.lower()]
    assert errors == [
        "paxlite: error: unknown flag --job_log_dri (did you mean --job_log_dir?); paxlite "
        "--help lists the flags."
    ]
    assert "FATAL" not in proc.stderr


def test_a_knob_typo_names_the_closest_knobs_and_where_the_rest_are_listed():
    from paxlite.experiments.base_experiment import KnobError, apply_knob_overrides
    from tasks.lm.synthetic import LmSyntheticTiny

    with pytest.raises(KnobError) as e:
        apply_knob_overrides(LmSyntheticTiny, ["NUM_TRAIN_STEP=600"])
    assert str(e.value) == (
        "LmSyntheticTiny has no knob 'NUM_TRAIN_STEP' (did you mean NUM_TRAIN_STEPS?); "
        "paxlite --help_knobs --exp=tasks.lm.synthetic.LmSyntheticTiny lists its "
        f"{len(LmSyntheticTiny._knob_types)} knobs."
    )


def test_decoding_a_job_without_a_checkpoint_leaves_no_job_dir(tmp_path):
    from tests.paxlite.test_main import run_main_in_process

    job = tmp_path / "job"
    code, _, err = run_main_in_process(
        f"--job_log_dir={job}", "--mode=decode", "--set=ICI_MESH_SHAPE=1,8,1"
    )
    assert code == 2 and err.count("paxlite: error:") == 1, err[-2000:]
    assert f"--mode=decode needs a checkpoint, but {job}/checkpoints has none" in err
    assert not job.exists()
