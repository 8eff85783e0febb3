"""Language modelling on your own text files: a SeqIO task and a tiny CPU experiment.

Formats (TEXT_FORMAT): LINES (one document per line), JSONL (one JSON object per
line, the document in TEXT_FIELD) or TFRECORD (``tf.train.Example`` records, the
document in the bytes feature TEXT_FIELD). Tokens are bytes (``seqio.ByteVocabulary``)
unless VOCAB_PATH names a SentencePiece model or a Hugging Face model directory (its
tokenizer). Documents go through Pax's C4
recipe (concatenate, split to the sequence length, append EOS)::

    paxlite --exp=LmTextTiny --job_log_dir=/tmp/text \\
        --set TEXT_DATA_PATH='/data/train-*.txt' --set TEXT_EVAL_DATA_PATH=/data/valid.txt

With TEXT_EVAL_DATA_PATH, ``decoder_datasets()`` prompts the model with the first
DECODE_PROMPT_LEN tokens of each held-out document and scores the decoded rest of
it (``--mode=decode``, same flags)::

    <job_log_dir>/decoder_out/prompts_step<N>.jsonl    exact_match, char_accuracy
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import seqio
import tensorflow as tf

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import InputDataError
from praxis_lite.inputs.seqio_checks import check_tfrecord
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from praxis_lite.inputs.seqio_tasks import lm_preprocessors, make_vocabulary, register_task_once
from tasks.lm.knob_groups import knob_group
from tasks.lm.synthetic import LmSyntheticTiny, SyntheticLmData

_AUTOTUNE = tf.data.AUTOTUNE
_EVAL_DATA_FLAG = "--set=TEXT_EVAL_DATA_PATH=PATH"


class TextFormat(enum.Enum):
    """How documents are stored in the text files."""

    LINES = "lines"
    JSONL = "jsonl"
    TFRECORD = "tfrecord"


# (a JSONL line or TFRecord record, where it is: 'FILE: line N') -> its texts; a bad one
# raises InputDataError naming ``where``.
RecordParser = Callable[[bytes, str], tuple[bytes, ...]]


class TextFileSource(seqio.FileDataSource):
    """Files of documents in a TextFormat; each example says where it came from.

    Examples are ``{'data': line or record, 'file': path, 'number': n}`` (n counts
    lines or records from 1), so a bad one is reported by file and number;
    :meth:`check_file` looks at the start and end of a file before any reading,
    parsing a JSONL line or TFRecord record with ``parse`` (None for LINES).
    """

    def __init__(
        self, patterns: dict[str, str], text_format: TextFormat, parse: RecordParser | None
    ):
        self.text_format, self.parse = text_format, parse
        read = tf.data.TFRecordDataset if text_format is TextFormat.TFRECORD else _lines
        super().__init__(
            read_file_fn=lambda path: _numbered(read(path), path),
            split_to_filepattern=patterns,
        )

    def check_file(self, path: str, fix: str) -> None:
        """Raises :class:`InputDataError` if ``path`` does not start (or end) as its format.

        ``fix`` names what points the input at other files (``SeqIOInput.data_flag``).
        """
        if self.text_format is TextFormat.TFRECORD:
            check_tfrecord(
                path,
                "re-create it, set --set=TEXT_FORMAT= to its format (LINES, JSONL), or "
                f"point {fix} at other files",
            )
            record = next(iter(tf.data.TFRecordDataset(path).take(1))).numpy()
            self.parse(record, f"{path}: record 1")
            return
        with tf.io.gfile.GFile(path, "rb") as f:
            head, size = f.read(_PEEK_BYTES), f.size()
            f.seek(max(size - _PEEK_BYTES, 0))
            tail = f.read()
        if b"\0" in head:
            raise InputDataError(
                f"{path}: byte {head.index(bytes(1)) + 1} is a NUL: a binary file, not "
                f"{self.text_format.name} text; set --set=TEXT_FORMAT=TFRECORD if it holds "
                f"tf.train.Example records, or point {fix} at text files."
            )
        whole = size <= len(head)
        if whole and not head.strip():
            raise InputDataError(
                f"{path} holds only blank lines, no documents; point {fix} at files with text."
            )
        if self.text_format is TextFormat.JSONL:
            self._check_jsonl_line(path, head.split(b"\n"), first=True, numbered=True)
            self._check_jsonl_line(path, tail.split(b"\n"), first=False, numbered=whole)

    def _check_jsonl_line(
        self, path: str, lines: list[bytes], *, first: bool, numbered: bool
    ) -> None:
        """Parses the first (or last) non-blank line of ``lines``, cut from a JSONL file."""
        if first:
            lines = lines[:-1] if len(lines) > 1 else lines  # The last may be cut by the peek.
        order = range(len(lines)) if first else range(len(lines) - 1, -1, -1)
        index = next((i for i in order if lines[i].strip()), None)
        if index is not None:
            where = f"{path}: line {index + 1}" if numbered else f"{path}: the last line"
            self.parse(lines[index], where)


_PEEK_BYTES = 1 << 16


def _lines(path: tf.Tensor) -> tf.data.Dataset:
    return tf.data.TextLineDataset(path)


def _numbered(ds: tf.data.Dataset, path: tf.Tensor) -> tf.data.Dataset:
    """``{'data', 'file', 'number'}`` examples of one file's lines or records."""
    return ds.enumerate(start=1).map(lambda n, x: {"data": x, "file": path, "number": n})


def jsonl_fields(
    line: bytes, where: str, knobs: Mapping[str, str], not_json_fix: str = ""
) -> tuple[bytes, ...]:
    """The UTF-8 texts of fields of one JSON line (at ``where``: 'FILE: line N').

    ``knobs`` maps each field to read to the knob that names it (in its error);
    ``not_json_fix`` ends the error of a line that is not JSON (', or set ...').
    """
    try:
        record = json.loads(line)
    except ValueError as e:
        why = f"{e.msg}: column {e.colno}" if isinstance(e, json.JSONDecodeError) else e
        raise InputDataError(
            f"{where} is not JSON ({why}); fix or remove that line (a cut-off last line "
            f"means a truncated file){not_json_fix}."
        ) from None
    for field, knob in knobs.items():
        if not isinstance(record, dict) or field not in record:
            has = f"it has {sorted(record)}" if isinstance(record, dict) else "it is no object"
            raise InputDataError(
                f"{where} has no field {field!r} ({has}); set --set={knob}= to the field "
                "that holds the text."
            )
    return tuple(str(record[field]).encode("utf-8") for field in knobs)


def jsonl_text(line: bytes, where: str, text_field: str) -> bytes:
    """The UTF-8 text in ``text_field`` of one JSON line (at ``where``: 'FILE: line N')."""
    fix = ", or set --set=TEXT_FORMAT=LINES for plain text"
    return jsonl_fields(line, where, {text_field: "TEXT_FIELD"}, fix)[0]


def example_text(record: bytes, where: str, text_field: str) -> bytes:
    """The bytes feature ``text_field`` of one tf.train.Example (at ``where``: 'FILE: record N')."""
    try:
        example = tf.train.Example.FromString(record)
    except Exception:  # protobuf's DecodeError  # noqa: BLE001
        raise InputDataError(
            f"{where} is not a tf.train.Example; set --set=TEXT_FORMAT= to the file's format, "
            "or re-create the file."
        ) from None
    features = example.features.feature
    if text_field not in features or features[text_field].WhichOneof("kind") != "bytes_list":
        has = {k: v.WhichOneof("kind") for k, v in sorted(features.items())}
        raise InputDataError(
            f"{where} has no bytes feature {text_field!r} (it has {has}); set "
            "--set=TEXT_FIELD= to the feature that holds the text."
        )
    return b"".join(features[text_field].bytes_list.value)


def _text_parser(text_format: TextFormat, text_field: str) -> RecordParser | None:
    """How a JSONL line or TFRecord record gives its text (``text_field``); None for LINES."""
    if text_format is TextFormat.LINES:
        return None
    parse = jsonl_text if text_format is TextFormat.JSONL else example_text
    return lambda data, where: (parse(data, where, text_field),)


def parse_records(
    text_format: TextFormat, parse: RecordParser, features: Sequence[str]
) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """Preprocessor: TextFileSource examples -> ``{feature: text}``, ``parse``'s texts in order.

    JSONL skips blank lines and parses the rest; TFRECORD parses each record. A bad
    line or record raises InputDataError naming it ('FILE: line N').
    """
    unit = "line" if text_format is TextFormat.JSONL else "record"

    def parse_one(data: bytes, path: bytes, number: int) -> tuple[bytes, ...]:
        return parse(data, f"{path.decode()}: {unit} {int(number)}")

    def to_features(x: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        args = [x["data"], x["file"], x["number"]]
        texts = tf.numpy_function(parse_one, args, [tf.string] * len(features), stateful=False)
        for text in texts:
            text.set_shape([])
        return dict(zip(features, texts, strict=True))

    def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
        if text_format is TextFormat.JSONL:
            ds = ds.filter(lambda x: tf.strings.length(tf.strings.strip(x["data"])) > 0)
        return ds.map(to_features, num_parallel_calls=_AUTOTUNE)

    return preprocess


def _source_and_text(
    patterns: dict[str, str], text_format: TextFormat, text_field: str
) -> tuple[seqio.DataSource, list, str]:
    """``(source, preprocessors to a 'text' feature, 'text')`` for files in ``text_format``.

    LINES keeps every line; JSONL and TFRECORD read ``text_field`` of each line or record.
    """
    parse = _text_parser(text_format, text_field)
    source = TextFileSource(patterns, text_format, parse)
    to_text = _line_to_text if parse is None else parse_records(text_format, parse, ["text"])
    return source, [to_text], "text"


def _line_to_text(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda x: {"text": x["data"]}, num_parallel_calls=_AUTOTUNE)


def continuation_metrics(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """A SeqIO predict metric fn: how much of each document's rest the model reproduced.

    Returns ``exact_match`` (fraction of predictions equal to their target) and
    ``char_accuracy`` (fraction of target characters predicted at their position).
    """
    if len(targets) != len(predictions) or not targets:
        raise ValueError(f"{len(targets)} targets vs. {len(predictions)} predictions.")
    exact = sum(t == p for t, p in zip(targets, predictions, strict=True))
    right = sum(
        sum(a == b for a, b in zip(t, p, strict=False))
        for t, p in zip(targets, predictions, strict=True)
    )
    total = sum(len(t) for t in targets)
    return {"exact_match": exact / len(targets), "char_accuracy": right / max(total, 1)}


def register_text_prompt_task(
    name: str,
    *,
    eval_path: str,
    text_format: TextFormat = TextFormat.LINES,
    text_field: str = "text",
    vocab_path: str | None = None,
) -> seqio.Task:
    """Registers a task of whole held-out documents (split 'validation') for decoding.

    One example per document: its tokens, trimmed to the sequence length, then EOS
    (no concatenation), scored by :func:`continuation_metrics`. Idempotent, like
    :func:`register_text_task`.
    """
    settings = dict(
        eval_path=eval_path, text_format=text_format, text_field=text_field, vocab_path=vocab_path
    )

    def make_task(task_name: str) -> seqio.Task:
        source, to_text, text_key = _source_and_text(
            {"validation": eval_path}, text_format, text_field
        )
        return seqio.Task(
            task_name,
            source=source,
            preprocessors=[
                *to_text,
                lambda ds: ds.map(lambda x: {"targets": x[text_key]}),
                seqio.preprocessors.tokenize,
                seqio.preprocessors.append_eos_after_trim,
            ],
            output_features={
                "targets": seqio.Feature(vocabulary=make_vocabulary(vocab_path), add_eos=True)
            },
            metric_fns=[continuation_metrics],
        )

    return register_task_once(name, settings, make_task)


def split_patterns(train_path: str, eval_path: str | None) -> dict[str, str]:
    """A task's files by split: 'train', and 'validation' where ``eval_path`` is given."""
    if eval_path is None:
        return {"train": train_path}
    return {"train": train_path, "validation": eval_path}


def register_text_task(
    name: str,
    *,
    train_path: str,
    eval_path: str | None = None,
    text_format: TextFormat = TextFormat.LINES,
    text_field: str = "text",
    vocab_path: str | None = None,
    shuffle_buffer_size: int = 1000,
    concat_batch_size: int = 128,
) -> seqio.Task:
    """Registers an LM task over local files: split 'train' and, if given, 'validation'.

    Idempotent; different settings replace the earlier registration. Paths may
    be glob patterns. Registering reads no file.
    """
    settings = dict(
        train_path=train_path,
        eval_path=eval_path,
        text_format=text_format,
        text_field=text_field,
        vocab_path=vocab_path,
        shuffle_buffer_size=shuffle_buffer_size,
        concat_batch_size=concat_batch_size,
    )
    patterns = split_patterns(train_path, eval_path)

    def make_task(task_name: str) -> seqio.Task:
        source, to_text, text_key = _source_and_text(patterns, text_format, text_field)
        vocabulary = make_vocabulary(vocab_path)
        return seqio.Task(
            task_name,
            source=source,
            preprocessors=to_text + lm_preprocessors(text_key, concat_batch_size),
            output_features={"targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)},
            metric_fns=[],
            shuffle_buffer_size=shuffle_buffer_size,
        )

    return register_task_once(name, settings, make_task)


@knob_group
class TextFileKnobs(BaseExperiment):
    """Text files registered as a SeqIO task, for any model.

    Attributes (knobs):
      TEXT_DATA_PATH: training files (a path or glob pattern); required.
      TEXT_EVAL_DATA_PATH: files read once per eval; None: no eval input.
      VOCAB_PATH: a SentencePiece model, or a Hugging Face model directory (its
        tokenizer.json or tokenizer.model); None: bytes (259 ids). The model's
        vocabulary must be at least as large (checked when the inputs are built).
      TEXT_TASK_NAME: the SeqIO task name the files are registered under.
      PACKED_INPUT: pack several pieces into each training row.
    """

    TEXT_DATA_PATH: str
    TEXT_EVAL_DATA_PATH: str | None = None
    VOCAB_PATH: str | None = None
    TEXT_TASK_NAME: str = "text_lm"
    PACKED_INPUT: bool = True


@knob_group
class TextLmData(TextFileKnobs, SyntheticLmData):
    """Text files (``TextFileKnobs``) as a decoder-only LM's data, with
    ``SyntheticLmData``'s short CPU run.

    Attributes (knobs, beyond TextFileKnobs'):
      TEXT_FORMAT: LINES, JSONL or TFRECORD.
      TEXT_FIELD: the JSON field / tf.train.Example feature that holds the text.
      DECODE_PROMPT_LEN: decoder prompts are the first this many tokens of each
        held-out document (trimmed to MAX_SEQ_LEN); the rest is the target.
        Documents of at most this many tokens are skipped (their task:
        TEXT_TASK_NAME + '_prompts').
    """

    TEXT_FORMAT: TextFormat = TextFormat.LINES
    TEXT_FIELD: str = "text"
    DECODE_PROMPT_LEN: int = 16

    MAX_SEQ_LEN = 64

    def validate(self) -> None:
        super().validate()
        if not 0 < self.DECODE_PROMPT_LEN < self.MAX_SEQ_LEN:
            raise KnobError(
                f"{type(self).__qualname__}: DECODE_PROMPT_LEN={self.DECODE_PROMPT_LEN} must be "
                f"in [1, MAX_SEQ_LEN={self.MAX_SEQ_LEN}): the rest of each document is the target."
            )

    def task(self) -> Any:
        """The LM's task; decoding stops at :meth:`eos_token_id`."""
        task = super().task()
        task.decoder.eos_token_id = self.eos_token_id()
        return task

    def eos_token_id(self) -> int | tuple[int, ...]:
        """SeqIO's EOS id (1), or a Hugging Face tokenizer's (VOCAB_PATH a directory)."""
        if self.VOCAB_PATH is not None and os.path.isdir(self.VOCAB_PATH):
            return make_vocabulary(self.VOCAB_PATH).eos_id
        return 1

    def register_task(self) -> None:
        """Registers the files as the SeqIO task TEXT_TASK_NAME (splits 'train', 'validation')."""
        register_text_task(
            self.TEXT_TASK_NAME,
            train_path=self.TEXT_DATA_PATH,
            eval_path=self.TEXT_EVAL_DATA_PATH,
            text_format=self.TEXT_FORMAT,
            text_field=self.TEXT_FIELD,
            vocab_path=self.VOCAB_PATH,
        )

    def lm_input_fields(self) -> dict[str, Any]:
        """The SeqIOInput fields that make the task's examples into MAX_SEQ_LEN-token rows."""
        return {"task_feature_lengths": {"targets": self.MAX_SEQ_LEN}}

    def datasets(self) -> list[Any]:
        """Registers the files as a SeqIO task; returns the train (and eval) inputs."""
        self.register_task()
        common = dict(
            mixture_name=self.TEXT_TASK_NAME,
            batch_size=self.train_batch_size(),
            model_vocab_size=self.vocab_size(),
            seed=self.SEED,
            **self.lm_input_fields(),
        )
        inputs = [
            config_lib.Config(
                SeqIOInput,
                split_name="train",
                feature_converter_pack=self.PACKED_INPUT,
                data_flag="--set=TEXT_DATA_PATH=PATH",
                **common,
            )
        ]
        if self.TEXT_EVAL_DATA_PATH is not None:
            inputs.append(
                config_lib.Config(
                    SeqIOInput,
                    name="validation",
                    split_name="validation",
                    is_training=False,
                    reset_for_eval=True,
                    data_flag=_EVAL_DATA_FLAG,
                    **common,
                )
            )
        return inputs

    def decoder_datasets(self) -> list[Any]:
        """Prompts from the held-out documents (TEXT_EVAL_DATA_PATH); none without them."""
        if self.TEXT_EVAL_DATA_PATH is None:
            return []
        prompts = config_lib.Config(
            SeqIOInput,
            name="prompts",
            split_name="validation",
            batch_size=self.train_batch_size(),
            is_training=False,
            reset_for_eval=True,
            model_vocab_size=self.vocab_size(),
            seed=self.SEED,
            data_flag=_EVAL_DATA_FLAG,
            **self.prompt_input_fields(),
        )
        return [prompts]

    def prompt_input_fields(self) -> dict[str, Any]:
        """Registers the held-out documents as the task TEXT_TASK_NAME + '_prompts'; the
        SeqIOInput fields that read them as prompts (DECODE_PROMPT_LEN tokens) and targets."""
        name = f"{self.TEXT_TASK_NAME}_prompts"
        register_text_prompt_task(
            name,
            eval_path=self.TEXT_EVAL_DATA_PATH,
            text_format=self.TEXT_FORMAT,
            text_field=self.TEXT_FIELD,
            vocab_path=self.VOCAB_PATH,
        )
        return {
            "mixture_name": name,
            "task_feature_lengths": {"targets": self.MAX_SEQ_LEN},
            "decode_form": DecodeForm.TARGETS_PREFIX,
            "prompt_len": self.DECODE_PROMPT_LEN,
        }


@registry.register
class LmTextTiny(TextLmData, LmSyntheticTiny):
    """LmSyntheticTiny's 2-layer, 64-dim LM on your text files (a laptop CPU, about a minute):
    ``TextLmData``'s knobs."""

    VOCAB_SIZE = 384  # Bytes: 256 + pad, EOS, UNK, rounded up to a multiple of 128.
