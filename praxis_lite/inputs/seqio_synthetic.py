"""A tiny SeqIO task the package registers, for a run with nothing downloaded (no TFDS).

``tiny_reverse``: ``"reverse: catdog"`` -> ``"godtac"``, two words of a small in-memory word
list, drawn by a fixed seed, tokenized in bytes (``seqio.ByteVocabulary``) with EOS appended.
It is the task of paxlite's ``paxlite/tiny_reverse.gin`` (T5X's tiny T5 from scratch on a
CPU), named there as T5X names a user's task: ``MIXTURE_OR_TASK_MODULE`` (this module,
which registers the task on import) and ``MIXTURE_OR_TASK_NAME``. No metrics: a pretraining
run evaluates the loss only.
"""

from __future__ import annotations

import types

import numpy as np
import seqio
import tensorflow as tf

from praxis_lite.inputs import seqio_tasks

TASK_NAME = "tiny_reverse"
#: The words the rows are made of (3-4 letters: a row's input is at most 18 bytes with EOS).
WORDS = ("cat", "dog", "bird", "fish", "cow", "hen", "fox", "owl", "bee", "ant", "yak", "emu")
PREFIX = "reverse: "
#: Rows per split, each split drawn by its own seeded generator.
ROWS = types.MappingProxyType({"train": 1024, "validation": 64})
SEED = 0


def rows(split: str) -> list[tuple[str, str]]:
    """The split's ``(input, target)`` texts, the same on every call: ``ROWS[split]`` rows,
    each ``("reverse: " + w1 + w2, (w1 + w2) reversed)``."""
    rng = np.random.default_rng([SEED, list(ROWS).index(split)])
    picks = rng.integers(0, len(WORDS), size=(ROWS[split], 2))
    words = [WORDS[a] + WORDS[b] for a, b in picks]
    return [(PREFIX + word, word[::-1]) for word in words]


def _dataset(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """SeqIO's dataset function: the split's rows as ``{"inputs", "targets"}`` strings."""
    del shuffle_files, seed  # One in-memory shard; the task's shuffle does the rest.
    pairs = rows(split)
    return tf.data.Dataset.from_tensor_slices(
        {"inputs": [row[0] for row in pairs], "targets": [row[1] for row in pairs]}
    )


def _make_task(name: str) -> seqio.Task:
    vocabulary = seqio.ByteVocabulary()
    return seqio.Task(
        name,
        source=seqio.FunctionDataSource(_dataset, splits=list(ROWS)),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={
            "inputs": seqio.Feature(vocabulary, add_eos=True),
            "targets": seqio.Feature(vocabulary, add_eos=True),
        },
        metric_fns=[],
    )


def register() -> seqio.Task:
    """Registers ``tiny_reverse`` (idempotent: a second call returns the registered task)."""
    return seqio_tasks.register_task_once(TASK_NAME, {"seed": SEED}, _make_task)


register()
