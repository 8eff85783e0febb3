"""Writes what T5X's standard gin files bind, for the test of paxlite's copies of them.

Runs in paxlite's own venv, by hand, from the repository root, on a fetched T5X source tree
(google-research/t5x; read, never copied into this repository)::

    python tools/t5x_fixtures/make_gin_bindings.py T5X_SOURCE tests/fixtures/t5x/gin_bindings.json

For each gin file paxlite has a copy of (``paxlite.formats.t5x.gin_files.standard_files()``),
T5X's file of the same path is read with gin-config's parser, its includes followed under
``T5X_SOURCE`` (nothing of T5X is imported), and every binding's value is written with its
macros resolved: ``{path: {"scope/selector.parameter": "value"}}``.
``tests/paxlite/formats/t5x/test_gin_files.py`` compares paxlite's copies with it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from paxlite.formats.t5x import gin_files, gin_sources  # noqa: E402


def bindings_of(path: str, search_root: str) -> dict[str, str]:
    """The resolved bindings of ``path`` (an include path) under ``search_root``."""
    sources = gin_sources.read_sources([path], [], [search_root])
    return gin_sources.resolved_bindings(sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("t5x_source", help="a T5X source tree (the folder that holds t5x/)")
    parser.add_argument("out", help="the JSON file to write")
    args = parser.parse_args()
    found = {path: bindings_of(path, args.t5x_source) for path in gin_files.standard_files()}
    pathlib.Path(args.out).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(found)} files, {sum(map(len, found.values()))} bindings")


if __name__ == "__main__":
    main()
