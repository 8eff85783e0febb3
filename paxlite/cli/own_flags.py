"""A console command with its own absl ``FlagValues`` (``paxlite-export``,
``paxlite-tiny-model``): its command line parsed, ``--help`` printed, and every mistake one
``paxlite: error:`` line (``exits.fail``: exit 2) that names the command's ``--help``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags

from paxlite.cli import exits


def parse(
    flag_values: flags.FlagValues, argv: Sequence[str], program: str, help_text: str
) -> list[str]:
    """``argv`` (the program first) parsed into ``flag_values``: the words that are no flag
    (the program first). ``--help`` prints ``help_text`` and exits 0; a flag error is one line."""
    if any(arg in ("--help", "-h", "--helpfull") for arg in argv[1:]):
        print(help_text)
        sys.exit(0)
    try:
        return flag_values(list(argv))
    except flags.Error as e:
        exits.fail(f"{e}; see {program} --help.")


def refuse_extra_words(rest: Sequence[str], program: str) -> None:
    """One line when ``rest`` (what :func:`parse` left, the program first) holds more."""
    if len(rest) > 1:
        exits.fail(f"unexpected arguments {' '.join(rest[1:])}; see {program} --help.")
