"""Language modelling on your own text files: a SeqIO task and a tiny CPU experiment.

Formats (TEXT_FORMAT): LINES (one document per line), JSONL (one JSON object per
line, the document in TEXT_FIELD) or TFRECORD (``tf.train.Example`` records, the
document in the bytes feature TEXT_FIELD). Tokens are bytes (``seqio.ByteVocabulary``)
unless VOCAB_PATH names a SentencePiece model. Documents go through Pax's C4
recipe (concatenate, split to the sequence length, append EOS)::

    paxlite --exp=LmTextTiny --job_log_dir=/tmp/text \\
        --set TEXT_DATA_PATH='/data/train-*.txt' --set TEXT_EVAL_DATA_PATH=/data/valid.txt
"""

from __future__ import annotations

import enum
import json
from typing import Any

import seqio
import tensorflow as tf

from paxlite import experiment_registry
from praxis_lite import config as config_lib
from praxis_lite.seqio_input import (
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
        text_key = "text"
        if text_format is TextFormat.TFRECORD:
            source = seqio.TFExampleDataSource(
                patterns, feature_description={text_field: tf.io.FixedLenFeature([], tf.string)}
            )
            to_text, text_key = [], text_field
        elif text_format is TextFormat.JSONL:
            source = seqio.TextLineDataSource(patterns)
            to_text = [_jsonl_to_text(text_field)]
        else:
            source = seqio.TextLineDataSource(patterns)
            to_text = [lambda ds: ds.map(lambda line: {"text": line})]
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
      TEXT_TASK_NAME: the SeqIO task name the files are registered under.
      PACKED_INPUT: pack several pieces into each training row.
    """

    TEXT_DATA_PATH: str
    TEXT_EVAL_DATA_PATH: str | None = None
    TEXT_FORMAT: TextFormat = TextFormat.LINES
    TEXT_FIELD: str = "text"
    VOCAB_PATH: str | None = None
    TEXT_TASK_NAME: str = "text_lm"
    PACKED_INPUT: bool = True

    VOCAB_SIZE = 384  # Bytes: 256 + pad, EOS, UNK, rounded up to a multiple of 128.
    MAX_SEQ_LEN = 64

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
