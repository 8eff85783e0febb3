"""paxlite's copies of T5X's standard gin files, at T5X's include paths, and paxlite's own.

``GIN_ROOT`` holds ``t5x/configs/runs/{pretrain,finetune,eval,infer}.gin``,
``t5x/examples/t5/t5_1_1/{tiny,small,base,large,xl,xxl}.gin`` and the T5 1.1 example runs,
written here from what T5X's bindings mean. T5X's commands search it after the user's
``--gin_search_paths``, so ``include 't5x/configs/runs/finetune.gin'`` works without a
T5X clone (a clone's own files, on the search paths, come first).

The vocabulary: T5X's ``base.gin`` names T5's SentencePiece model in a gs:// bucket. Ours
names the same model through the macro ``VOCABULARY_FILE`` (that path by default), so an
offline machine sets ``--gin.VOCABULARY_FILE=\\"/data/spm.model\\"`` once; the model's
vocabulary is read only to decode, the tasks' own vocabularies tokenize the data.

paxlite's own files are under ``paxlite/``: ``paxlite/tiny_reverse.gin`` trains T5X's tiny
T5 from scratch on a CPU on a task the package registers (nothing downloaded).
"""

from __future__ import annotations

import pathlib

GIN_ROOT = pathlib.Path(__file__).parent / "gin_configs"
#: Under GIN_ROOT: T5X's files (at T5X's include paths), and paxlite's own.
T5X_FOLDER = "t5x"
OWN_FOLDER = "paxlite"


def _files(folder: str) -> list[str]:
    """The gin files under ``GIN_ROOT / folder``, as include paths (``folder/...``)."""
    return sorted(p.relative_to(GIN_ROOT).as_posix() for p in (GIN_ROOT / folder).rglob("*.gin"))


def standard_files() -> list[str]:
    """paxlite's copies of T5X's gin files, as T5X's include paths
    (``t5x/configs/runs/pretrain.gin``)."""
    return _files(T5X_FOLDER)


def own_files() -> list[str]:
    """paxlite's own gin files, as include paths (``paxlite/tiny_reverse.gin``)."""
    return _files(OWN_FOLDER)
