"""Parsing ``paxlite``'s command line: every mistake in it is one ``paxlite: error:`` line.

absl parses the flags; what it would end in its own ``FATAL Flags parsing error`` (exit 1)
or usage text (an unknown flag, a value that is not of the flag's type or not one of its
choices, a word that is no flag) ends here in one line, exit 2, with a did-you-mean. The
help flags print paxlite's own help (``paxlite.cli.help_text``) before absl sees them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence

from absl import flags

from paxlite.cli import help_text
from paxlite.cli.exits import fail
from paxlite.cli.flags import FLAGS, UsageError
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
