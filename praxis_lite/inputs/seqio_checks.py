"""Checks of a SeqIO Task's data and vocabularies, with one-line errors that name the fix.

Before an input reads anything: the Task exists, its split exists, its files (or the
prepared TFDS split) exist, are non-empty and start well (TFRecord framing included),
and its SentencePiece model loads. For damage found while reading: which file and
record of a split is bad. Every error names the file and the knob or flag to fix.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

import seqio
import tensorflow as tf

from praxis_lite.inputs.base_input import InputConfigError, InputDataError


class InputDataNotFoundError(InputDataError, FileNotFoundError):
    """Data or a vocabulary file that an input needs is not where it was looked for."""


def get_provider(name: str, where: str = "SeqIO") -> seqio.Task | seqio.Mixture:
    """The registered Task or Mixture ``name``; an error naming the closest ones if none."""
    tasks, mixtures = set(seqio.TaskRegistry.names()), set(seqio.MixtureRegistry.names())
    if name in tasks or name in mixtures:
        return seqio.get_mixture_or_task(name)
    known = sorted(tasks | mixtures)
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if close:
        listed = f"Closest registered names: {', '.join(close)}."
    elif known:
        more = " ..." if len(known) > 20 else ""
        listed = f"Registered ({len(known)}): {', '.join(known[:20])}{more}."
    else:
        listed = "No Task or Mixture is registered."
    raise InputConfigError(
        f"{where}: no SeqIO Task or Mixture named {name!r}. {listed} Register it before "
        "the input is built (experiments do so in datasets(); otherwise import the module "
        "that registers it)."
    )


def check_split(task: seqio.Task, split: str, where: str) -> None:
    splits = list(task.source.splits)
    if split not in splits:
        raise InputConfigError(
            f"{where}: task {task.name!r} has no split {split!r}; it has {splits}. "
            "Set split_name to one of them, or register the task with that split."
        )


def check_files(task: seqio.Task, split: str, where: str, fix: str) -> None:
    """Raises unless a file source's files for ``split`` exist, hold data and start well.

    Each file must be non-empty; a source with a ``check_file(path, fix)`` method
    (the text tasks' sources) also has it look at the start of each file.
    """
    source = task.source
    if not isinstance(source, seqio.FileDataSource):
        return
    files = source.list_shards(split)
    if not files:
        pattern = getattr(source, "_split_to_filepattern", {}).get(split, source)
        raise InputDataNotFoundError(
            f"{where}: no file matches {pattern!r} (split {split!r} of task {task.name!r}); "
            f"point {fix} at existing files."
        )
    check_file = getattr(source, "check_file", None)
    for path in files:
        what = f"split {split!r} of task {task.name!r}"
        _check_not_empty(path, what, where, f"point {fix} at files with data")
        if check_file is not None:
            try:
                check_file(path, fix)
            except InputDataError as e:
                raise InputDataError(f"{where}: {e}") from None


def _check_not_empty(path: str, what: str, where: str, fix: str) -> None:
    """Raises if ``path`` (a file of ``what``) is missing or has 0 bytes; ``fix`` ends it."""
    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError:
        raise InputDataNotFoundError(f"{where}: {path} ({what}) does not exist; {fix}.") from None
    if size == 0:
        raise InputDataError(f"{where}: {path} ({what}) is empty (0 bytes); {fix}.")


def tf_error_message(e: tf.errors.OpError) -> str:
    """``e``'s message without TensorFlow's function-node prefix and op suffix."""
    message = e.message
    if message.startswith("{{function_node"):
        message = message.split("}} ", 1)[-1]
    return message.split(" [Op:", 1)[0].strip()


def check_tfrecord(path: str, fix: str, *, walk: bool = True) -> None:
    """Raises :class:`InputDataError` (ending with ``fix``) if ``path`` is a bad TFRecord file.

    The first record must read; with ``walk``, the record lengths must also add up
    to the file's size (TensorFlow reads a file cut inside a record header as if it
    ended there, silently dropping the rest).
    """
    try:
        for _ in tf.data.TFRecordDataset(path).take(1):
            pass
    except tf.errors.OpError as e:
        raise InputDataError(
            f"{path}: record 1 cannot be read ({tf_error_message(e)}): the file is "
            f"truncated or not a TFRecord file; {fix}."
        ) from None
    problem = tfrecord_framing_problem(path) if walk else None
    if problem:
        raise InputDataError(f"{problem}; {fix}.")


_TFRECORD_FRAMING = 16  # Bytes around each record: length (8), its CRC (4), data CRC (4).


def tfrecord_framing_problem(path: str) -> str | None:
    """``'<path>: record <n> is cut off ...'`` if the record lengths overrun the file, or None.

    Reads the 8-byte length of each record and skips its data: cheap next to
    reading the records, but one seek per record.
    """
    size = tf.io.gfile.stat(path).length
    opener = tf.io.gfile.GFile if "://" in path else open
    offset, number = 0, 0
    with opener(path, "rb") as f:
        while offset < size:
            number += 1
            f.seek(offset)
            header = f.read(8)
            end = offset + _TFRECORD_FRAMING
            if len(header) == 8:
                end += int.from_bytes(header, "little")
            if end > size:
                return (
                    f"{path}: record {number} is cut off (it ends at byte {end}, the file at "
                    f"{size}): the file is truncated"
                )
            offset = end
    return None


def find_bad_tfrecord(files: Sequence[str]) -> str | None:
    """``'<file>: record <n> is ...'`` for the first cut-off or unreadable record, or None.

    Reads every record of every file: for after TensorFlow reported damage at a
    byte offset without naming the file, or sizes did not add up.
    """
    for path in files:
        problem = tfrecord_framing_problem(path)
        if problem:
            return problem
        count = 0
        try:
            for _ in tf.data.TFRecordDataset(path):
                count += 1
        except tf.errors.OpError as e:
            return (
                f"{path}: record {count + 1} is damaged ({tf_error_message(e)}; "
                f"the {count} records before it read)"
            )
    return None


def split_files(task: seqio.Task, split: str) -> list[str]:
    """The files ``task`` reads for ``split`` (a file source's shards or a TFDS split's)."""
    source = task.source
    if isinstance(source, seqio.FileDataSource):
        return list(source.list_shards(split))
    if isinstance(source, seqio.TfdsDataSource) and not source.tfds_dataset.tfds_splits:
        info = source.tfds_dataset.builder.info
        if split in info.splits:
            return [os.fspath(p) for p in info.splits[split].filepaths]
    return []


_VOCAB_FIX = (
    "point the task at a SentencePiece .model file or a Hugging Face model directory; the LM "
    "experiments take it from their VOCAB_PATH knob (--set VOCAB_PATH=/path/to/spm.model), "
    "T5's tasks under python -m paxlite.t5x.train from --t5_spm_path=/path/to/spm.model"
)


def check_vocabularies(task: seqio.Task, where: str) -> None:
    """Raises if a SentencePiece model file of the task is missing, empty or unreadable."""
    for feature_name, feature in task.output_features.items():
        path = getattr(feature.vocabulary, "sentencepiece_model_file", None)
        if not path:
            continue
        what = (
            f"the SentencePiece vocabulary {path!r} (feature {feature_name!r} of task "
            f"{task.name!r})"
        )
        try:
            found, why = tf.io.gfile.exists(path), "does not exist"
        except tf.errors.OpError as e:
            found, why = False, f"cannot be read ({e.message.splitlines()[0]})"
        if not found:
            raise InputDataNotFoundError(f"{where}: {what} {why}; {_VOCAB_FIX}.")
        problem = _sentencepiece_problem(path)
        if problem:
            raise InputDataError(f"{where}: {what} {problem}; {_VOCAB_FIX}.")


def _sentencepiece_problem(path: str) -> str | None:
    """Why ``path`` is not a usable SentencePiece model (empty, truncated, ...), or None."""
    import sentencepiece  # seqio's own dependency.

    with tf.io.gfile.GFile(path, "rb") as f:
        proto = f.read()
    if not proto:
        return "is empty (0 bytes)"
    try:
        sentencepiece.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        why = "its protobuf does not parse" if "ParseFromArray" in why else why[:200]
        return f"is not a SentencePiece model ({why}: truncated, or another kind of file)"
    return None


def _default_tfds_data_dir() -> str:
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def check_tfds_data(task: seqio.Task, split: str, where: str) -> None:
    """Raises if a TFDS source's prepared data (or the split) is not in its data dir.

    Checked before reading, because TFDS would otherwise try to download and
    prepare the dataset (for C4: terabytes, or a hang without network).
    """
    source = task.source
    if not isinstance(source, seqio.TfdsDataSource) or source.tfds_dataset.tfds_splits:
        return
    loader = source.tfds_dataset
    name, data_dir = loader.get_split_params(split)
    data_dir = data_dir or _default_tfds_data_dir()
    fix = (
        f"Put the prepared dataset under DIR/{name.replace(':', '/')} (e.g. with "
        "`tfds build`, or copy it) and pass --tfds_data_dir=DIR (seqio's data dir "
        "override), or set TFDS_DATA_DIR=DIR."
    )
    try:
        builder = loader.builder
    except Exception as e:  # TFDS raises many kinds; all mean "not there".  # noqa: BLE001
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputDataNotFoundError(
            f"{where}: TFDS dataset {name!r} of task {task.name!r} was not found in data dir "
            f"{data_dir!r} ({type(e).__name__}: {first_line[:300]}). {fix}"
        ) from None
    info_file = os.path.join(os.fspath(builder.data_dir), "dataset_info.json")
    if not tf.io.gfile.exists(info_file):
        raise InputDataNotFoundError(
            f"{where}: TFDS dataset {name!r} of task {task.name!r} is not prepared in data dir "
            f"{data_dir!r}: {info_file} does not exist. {fix}"
        )


def check_tfds_files(task: seqio.Task, split: str, where: str, fix: str) -> None:
    """Raises if a prepared TFDS split has no examples, or files missing, empty or damaged.

    The first record of each file is read, and local files must add up to the size
    dataset_info.json implies (its bytes of serialized examples, plus 16 bytes of
    TFRecord framing per example, or without them).
    """
    source = task.source
    if not isinstance(source, seqio.TfdsDataSource) or source.tfds_dataset.tfds_splits:
        return
    info = source.tfds_dataset.builder.info.splits[split]
    files = split_files(task, split)
    what = f"split {split!r} of TFDS dataset {source.tfds_dataset.name!r}"
    fix = f"re-create the prepared dataset (e.g. with `tfds build`), or pass {fix} of a good copy"
    if info.num_examples == 0 or not files:
        raise InputDataError(f"{where}: {what} has no examples in its dataset_info.json; {fix}.")
    for path in files:
        _check_not_empty(path, what, where, fix)
        try:
            check_tfrecord(path, fix, walk=False)  # Sizes are checked below.
        except InputDataError as e:
            raise InputDataError(f"{where}: {e}") from None
    if any("://" in path for path in files):
        return  # A remote stat per shard is slow; damage is then found while reading.
    size = sum(os.path.getsize(path) for path in files)
    framed = info.num_bytes + 16 * info.num_examples
    if info.num_bytes and size not in (info.num_bytes, framed):
        bad = find_bad_tfrecord(files) or (
            f"its {len(files)} files hold {size} bytes, but dataset_info.json implies {framed}"
        )
        raise InputDataError(f"{where}: {what}: {bad}; {fix}.")
