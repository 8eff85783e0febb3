"""Language modelling on your own text files: a SeqIO task and a tiny CPU experiment.

Formats (TEXT_FORMAT): LINES (one document per line), JSONL (one JSON object per
line, the document in TEXT_FIELD) or TFRECORD (``tf.train.Example`` records, the
document in the bytes feature TEXT_FIELD). Tokens are bytes (``seqio.ByteVocabulary``)
unless VOCAB_PATH names a SentencePiece model. Documents go through Pax's C4
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
from typing import Any

import seqio
import tensorflow as tf

from paxlite import experiment_registry
from paxlite.base_experiment import KnobError
from praxis_lite import config as config_lib
from praxis_lite.seqio_input import (
    DecodeForm,
    SeqIOInput,
    lm_preprocessors,
    make_vocabulary,
    register_task_once,
)
from tasks.lm.synthetic import LmSyntheticTiny


class TextFormat(enum.Enum):
    """How documents are stored in the text files."""

    LINES = "lines"
    JSONL = "jsonl"
    TFRECORD = "tfrecord"


def _jsonl_to_text(text_field: str):
    """Preprocessor: JSON lines -> ``{'text': record[text_field]}`` (blank lines skipped)."""

    def parse(line: bytes) -> bytes:
        record = json.loads(line)
        if not isinstance(record, dict) or text_field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"a JSONL record has no field {text_field!r} (it has {keys}); set TEXT_FIELD "
                "to the field that holds the text."
            )
        return str(record[text_field]).encode("utf-8")

    def to_text(line: tf.Tensor) -> dict[str, tf.Tensor]:
        text = tf.numpy_function(parse, [line], tf.string, stateful=False)
        text.set_shape([])
        return {"text": text}

    def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
        ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
        return ds.map(to_text, num_parallel_calls=tf.data.AUTOTUNE)

    return preprocess


def _source_and_text(
    patterns: dict[str, str], text_format: TextFormat, text_field: str
) -> tuple[seqio.DataSource, list, str]:
    """``(source, preprocessors to a text feature, its key)`` for files in ``text_format``."""
    if text_format is TextFormat.TFRECORD:
        source = seqio.TFExampleDataSource(
            patterns, feature_description={text_field: tf.io.FixedLenFeature([], tf.string)}
        )
        return source, [], text_field
    source = seqio.TextLineDataSource(patterns)
    if text_format is TextFormat.JSONL:
        return source, [_jsonl_to_text(text_field)], "text"
    return source, [lambda ds: ds.map(lambda line: {"text": line})], "text"


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
    patterns = {"train": train_path}
    if eval_path is not None:
        patterns["validation"] = eval_path

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


@experiment_registry.register
class LmTextTiny(LmSyntheticTiny):
    """LmSyntheticTiny's 2-layer, 64-dim LM on your text files (a laptop CPU, about a minute).

    Attributes (knobs, beyond LmSyntheticTiny's):
      TEXT_DATA_PATH: training files (a path or glob pattern); required.
      TEXT_EVAL_DATA_PATH: files read once per eval; None: no eval input.
      TEXT_FORMAT: LINES, JSONL or TFRECORD.
      TEXT_FIELD: the JSON field / tf.train.Example feature that holds the text.
      VOCAB_PATH: a SentencePiece model; None: bytes (259 ids). VOCAB_SIZE must
        be at least the vocabulary's size (checked when the inputs are built).
      TEXT_TASK_NAME: the SeqIO task name the files are registered under (the
        decoder's prompts task: TEXT_TASK_NAME + '_prompts').
      PACKED_INPUT: pack several pieces into each training row.
      DECODE_PROMPT_LEN: decoder prompts are the first this many tokens of each
        held-out document (trimmed to MAX_SEQ_LEN); the rest is the target.
        Documents of at most this many tokens are skipped.
    """

    TEXT_DATA_PATH: str
    TEXT_EVAL_DATA_PATH: str | None = None
    TEXT_FORMAT: TextFormat = TextFormat.LINES
    TEXT_FIELD: str = "text"
    VOCAB_PATH: str | None = None
    TEXT_TASK_NAME: str = "text_lm"
    PACKED_INPUT: bool = True
    DECODE_PROMPT_LEN: int = 16

    VOCAB_SIZE = 384  # Bytes: 256 + pad, EOS, UNK, rounded up to a multiple of 128.
    MAX_SEQ_LEN = 64

    def validate(self) -> None:
        super().validate()
        if not 0 < self.DECODE_PROMPT_LEN < self.MAX_SEQ_LEN:
            raise KnobError(
                f"{type(self).__qualname__}: DECODE_PROMPT_LEN={self.DECODE_PROMPT_LEN} must be "
                f"in [1, MAX_SEQ_LEN={self.MAX_SEQ_LEN}): the rest of each document is the target."
            )

    def task(self) -> Any:
        """LmSyntheticTiny's task; decoding stops at SeqIO's EOS id (1)."""
        task = super().task()
        task.decoder.eos_id = 1
        return task

    def datasets(self) -> list[Any]:
        """Registers the files as a SeqIO task; returns the train (and eval) inputs."""
        register_text_task(
            self.TEXT_TASK_NAME,
            train_path=self.TEXT_DATA_PATH,
            eval_path=self.TEXT_EVAL_DATA_PATH,
            text_format=self.TEXT_FORMAT,
            text_field=self.TEXT_FIELD,
            vocab_path=self.VOCAB_PATH,
        )
        common = dict(
            mixture_name=self.TEXT_TASK_NAME,
            task_feature_lengths={"targets": self.MAX_SEQ_LEN},
            batch_size=self.train_batch_size(),
            model_vocab_size=self.VOCAB_SIZE,
            seed=self.SEED,
        )
        inputs = [
            config_lib.Config(
                SeqIOInput, split_name="train", feature_converter_pack=self.PACKED_INPUT, **common
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
                    **common,
                )
            )
        return inputs

    def decoder_datasets(self) -> list[Any]:
        """Prompts from the held-out documents (TEXT_EVAL_DATA_PATH); none without them."""
        if self.TEXT_EVAL_DATA_PATH is None:
            return []
        name = f"{self.TEXT_TASK_NAME}_prompts"
        register_text_prompt_task(
            name,
            eval_path=self.TEXT_EVAL_DATA_PATH,
            text_format=self.TEXT_FORMAT,
            text_field=self.TEXT_FIELD,
            vocab_path=self.VOCAB_PATH,
        )
        prompts = config_lib.Config(
            SeqIOInput,
            name="prompts",
            mixture_name=name,
            split_name="validation",
            task_feature_lengths={"targets": self.MAX_SEQ_LEN},
            decode_form=DecodeForm.TARGETS_PREFIX,
            prompt_len=self.DECODE_PROMPT_LEN,
            batch_size=self.train_batch_size(),
            is_training=False,
            reset_for_eval=True,
            model_vocab_size=self.VOCAB_SIZE,
            seed=self.SEED,
        )
        return [prompts]
