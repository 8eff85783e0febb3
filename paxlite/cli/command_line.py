"""Parsing ``paxlite``'s command line: every mistake in it is one ``paxlite: error:`` line.

absl parses the flags; what it would end in its own ``FATAL Flags parsing error`` (exit 1)
or usage text (an unknown flag, a value that is not of the flag's type or not one of its
choices, a word that is no flag) ends here in one line, exit 2, with a did-you-mean. The
help flags print paxlite's own help (``paxlite.cli.help_text``) before absl sees them.
:func:`checked_command` then checks what the flags ask for (the mode, the experiment and its
knobs) before anything runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Sequence

from absl import flags

from paxlite.cli import flags as cli_flags
from paxlite.cli import help_text, overrides, pax_flags
from paxlite.cli.exits import fail
from paxlite.cli.flags import FLAGS, Mode, UsageError
from paxlite.experiments import registry
from paxlite.experiments.base_experiment import BaseExperiment
from paxlite.experiments.registry import ExperimentRegistryError

_BAD_VALUE = re.compile(r"flag --(\w+)=(.*?): (.*)", re.DOTALL)
_HELP = ("--help", "-h", "-help", "--h", "-?", "--helpshort", "-helpshort")
_HELP_TRUE = ("--help=true", "--help=1", "-help=true", "--helpshort=true")


def parse(argv: Sequence[str], init_from_reads: Callable[[], str] = str) -> list[str]:
    """absl's ``flags_parser`` for ``app.run``: the parsed flags, or one line and exit 2.

    ``--help`` prints paxlite's flags by group (``init_from_reads()``: the checkpoint kinds
    --init_from reads) and ``--help_knobs`` an experiment's knobs (both exit 0);
    ``--helpfull`` is absl's, every flag of every library.
    """
    args = list(argv)
    if _asks_for_help(args[1:]):
        print(help_text.flags_help(init_from_reads()))
        raise SystemExit(0)
    try:
        remaining = FLAGS(args)
    except flags.UnrecognizedFlagError as e:
        fail(_unknown_flag(e.flagname))
    except flags.Error as e:
        fail(_bad_value(str(e)))
    if FLAGS.help_knobs:
        try:
            print(help_text.knobs_help(FLAGS.exp, FLAGS.exp_search_packages))
        except (UsageError, ExperimentRegistryError) as e:
            fail(e)
        raise SystemExit(0)
    if len(remaining) > 1:
        fail(_stray_words(remaining[1:]))
    return remaining


@dataclasses.dataclass(frozen=True)
class Command:
    """What a parsed ``paxlite`` command line runs, checked; nothing built or run yet."""

    mode: Mode
    #: The ``--exp`` class with the knob overrides applied (not instantiated).
    experiment_cls: type[BaseExperiment]
    #: ``KNOB=VALUE``: ``--set``, with ``--init_from``/``--init_from_exp`` as their knobs.
    knobs: list[str]
    #: ``(--compile_topology, --compile_topology_num_slices)``.
    topology: tuple[str | None, int | None]


def checked_command(builds: bool = True) -> Command:
    """The parsed flags checked before anything runs: ``--exp`` given and found, the mode
    one paxlite runs, no flag it refuses, each knob declared and of its type, the
    compile and restore flags where they apply, a job directory for a run.

    ``builds``: also refuse an ``--fdl_set`` path that a ``--set`` knob changes too; this
    builds the experiment's configs (reading the files its knobs name, HF_MODEL's say).

    Raises:
      UsageError, KnobError, ExperimentRegistryError (``refusals.SETUP_ERRORS``).
    """
    if not FLAGS.exp:
        example = registry.EXAMPLE_EXPERIMENT
        raise UsageError(f"--exp is required (e.g. --exp={example}); paxlite --help.")
    mode = cli_flags.resolved_mode()
    cli_flags.reject_unsupported_flags()
    search = FLAGS.exp_search_packages
    knob_settings = cli_flags.knob_settings()
    experiment_cls = overrides.resolve_experiment_class(FLAGS.exp, knob_settings, search)
    if builds:
        overrides.check_one_source(FLAGS.exp, knob_settings, FLAGS.fdl_set, search)
    topology = cli_flags.compile_topology()
    cli_flags.restore_fallback(mode)  # Refused outside training before anything runs.
    if mode is not Mode.COMPILE and not FLAGS.print_config:  # A run, in a job directory.
        if not FLAGS.job_log_dir:
            raise UsageError("--job_log_dir is required (where checkpoints and summaries go).")
        pax_flags.restore_checkpoint(mode in (Mode.EVAL, Mode.DECODE))
    return Command(mode, experiment_cls, knob_settings, topology)


def _asks_for_help(words: Sequence[str]) -> bool:
    """Whether a word of the command line is a help flag (``--help``, ``--helpshort``,
    ``--help=true``): not a flag's value (``--set --help``), not after ``--``."""
    value_next = False
    for word in words:
        if word == "--":
            return False
        if not value_next and (word in _HELP or word.lower() in _HELP_TRUE):
            return True
        name = word.lstrip("-")
        value_next = (
            word.startswith("-") and "=" not in word and name in FLAGS and not FLAGS[name].boolean
        )
    return False


def _unknown_flag(name: str) -> str:
    close = difflib.get_close_matches(name, help_text.listed_flags(), n=3, cutoff=0.6)
    close = close or difflib.get_close_matches(name, _other_flag_names(), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join('--' + c for c in close)}?)" if close else ""
    return f"unknown flag --{name}{hint}; paxlite --help lists the flags."


def _bad_value(message: str) -> str:
    """absl's message for a value a flag cannot take, as one line with a did-you-mean for
    a flag that has choices."""
    found = _BAD_VALUE.match(message)
    if found is None:
        return " ".join(message.split())
    name, value, why = found.groups()
    flag = FLAGS[name] if name in FLAGS else None
    choices = _choices(flag)
    if choices:
        close = difflib.get_close_matches(value.lower(), choices, n=3, cutoff=0.5)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"--{name}={value} is not one of its choices{hint}: {', '.join(choices)}."
    if flag is not None and flag.boolean:
        return f"--{name}={value}: a yes/no flag takes true or false (or --{name}, --no{name})."
    about = help_text.first_sentence(" ".join(flag.help.split())) if flag is not None else "--help"
    return f"--{name}={value}: {' '.join(why.split())} ({about.rstrip('.')})."


def _choices(flag: flags.Flag | None) -> list[str]:
    """The values an enum flag takes (lower case), or [] for any other flag."""
    if flag is None:
        return []
    parser = flag.parser
    if isinstance(parser, flags.EnumClassParser):
        return [m.lower() for m in parser.member_names]
    if isinstance(parser, flags.EnumParser):
        return list(parser.enum_values)
    return []


def _stray_words(words: Sequence[str]) -> str:
    """A word on the command line that is no flag: most often ``--set KNOB VALUE``."""
    knobs_given = [s for s in FLAGS.set if "=" not in s]
    if knobs_given:
        return (
            f"--set {knobs_given[0]} {words[0]}: --set takes KNOB=VALUE as one word, e.g. "
            f"--set {knobs_given[0]}={words[0]}."
        )
    return (
        f"unexpected argument {words[0]!r}: paxlite takes only flags (--name=value; knobs "
        "as --set KNOB=VALUE); paxlite --help lists them."
    )


def _other_flag_names() -> list[str]:
    """The flags --help does not list (absl's, JAX's, Fiddle's, Pax's refused ones)."""
    ours = set(help_text.listed_flags())
    return [name for name in FLAGS if name not in ours and len(name) > 1]
