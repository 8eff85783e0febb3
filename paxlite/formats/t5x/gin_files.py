"""paxlite's copies of T5X's standard gin files, at T5X's include paths.

``GIN_ROOT`` holds ``t5x/configs/runs/{pretrain,finetune,eval,infer}.gin``,
``t5x/examples/t5/t5_1_1/{tiny,small,base,large,xl,xxl}.gin`` and the T5 1.1 example runs,
written here from what T5X's bindings mean. T5X's commands search it after the user's
``--gin_search_paths``, so ``include 't5x/configs/runs/finetune.gin'`` works without a
T5X clone (a clone's own files, on the search paths, come first).

The vocabulary: T5X's ``base.gin`` names T5's SentencePiece model in a gs:// bucket. Ours
names the same model through the macro ``VOCABULARY_FILE`` (that path by default), so an
offline machine sets ``--gin.VOCABULARY_FILE=\\"/data/spm.model\\"`` once; the model's
vocabulary is read only to decode, the tasks' own vocabularies tokenize the data.
"""

from __future__ import annotations

import pathlib

GIN_ROOT = pathlib.Path(__file__).parent / "gin_configs"


def standard_files() -> list[str]:
    """Every gin file paxlite has, as its include path (``t5x/configs/runs/pretrain.gin``)."""
    return sorted(p.relative_to(GIN_ROOT).as_posix() for p in GIN_ROOT.rglob("*.gin"))
