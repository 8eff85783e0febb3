"""The tiny_reverse SeqIO task: its rows (seeded, reversed words), its tokens (bytes, EOS
appended) and its registration (at import, idempotent)."""

from __future__ import annotations

import seqio

from praxis_lite.inputs import seqio_synthetic


def test_rows_reverse_two_words_and_are_the_same_each_call():
    rows = seqio_synthetic.rows("train")
    assert len(rows) == seqio_synthetic.ROWS["train"]
    assert rows == seqio_synthetic.rows("train")
    for inputs, targets in rows:
        word = inputs.removeprefix(seqio_synthetic.PREFIX)
        assert inputs.startswith(seqio_synthetic.PREFIX) and targets == word[::-1]
    assert len({inputs for inputs, _ in rows}) > 100  # Many of the 144 word pairs.
    assert seqio_synthetic.rows("validation") != rows[: seqio_synthetic.ROWS["validation"]]


def test_the_task_is_registered_at_import_and_once():
    task = seqio.get_mixture_or_task(seqio_synthetic.TASK_NAME)
    assert seqio_synthetic.register() is task


def test_the_task_gives_bytes_with_eos():
    task = seqio_synthetic.register()
    example = next(task.get_dataset(None, split="train", shuffle=False).as_numpy_iterator())
    inputs, targets = seqio_synthetic.rows("train")[0]
    vocabulary = seqio.ByteVocabulary()
    eos = [vocabulary.eos_id]
    assert list(example["inputs"]) == vocabulary.encode(inputs) + eos
    assert list(example["targets"]) == vocabulary.encode(targets) + eos
