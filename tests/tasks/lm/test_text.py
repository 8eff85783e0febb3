"""LmTextTiny on users' own files: lines, JSONL and TFRecord; bytes or a SentencePiece model;
decoding prompts cut from held-out documents."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.runtime import partitioning
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite.inputs.base_input import InputConfigError, InputDataError
from praxis_lite.inputs.seqio_checks import InputDataNotFoundError
from tasks.lm import text
from tasks.lm.text import LmTextTiny, TextFormat
from tests.paxlite.test_main import scalar_series
from tests.praxis_lite.inputs.test_seqio_input import train_spm

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

DOCS = [f"line {i}: the cat sat on the mat and the dog sat on the log." for i in range(60)]
FAST = {
    "ICI_MESH_SHAPE": (1, 8, 1),  # The 8 fake CPU devices of the test process.
    "PERCORE_BATCH_SIZE": 1,
    "MAX_SEQ_LEN": 32,
    "NUM_TRAIN_STEPS": 8,
    "SUMMARY_INTERVAL_STEPS": 1,
    "CHECKPOINT_EVERY_N_STEPS": 1000,
    "LR_COS_WARMUP": 0,
    "LEARNING_RATE": 1e-2,
}


def write(tmp_path, fmt: TextFormat, docs=DOCS, field="text", name="data") -> str:
    if fmt is TextFormat.LINES:
        path = tmp_path / f"{name}.txt"
        path.write_text("\n".join(docs) + "\n")
    elif fmt is TextFormat.JSONL:
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    else:
        path = tmp_path / f"{name}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for d in docs:
                feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[d.encode()]))
                example = tf.train.Example(features=tf.train.Features(feature={field: feature}))
                writer.write(example.SerializeToString())
    return str(path)


def experiment(**knobs) -> LmTextTiny:
    return base_experiment.with_overrides(LmTextTiny, {**FAST, **knobs})()


def inputs(exp: LmTextTiny) -> list:
    return [partitioning.instantiate_input(cfg) for cfg in exp.datasets()]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [TextFormat.LINES, TextFormat.JSONL])
def test_trains_on_a_file(tmp_path, fmt):
    path = write(tmp_path, fmt)
    exp = experiment(TEXT_DATA_PATH=path, TEXT_FORMAT=fmt, TEXT_TASK_NAME=f"text_{fmt.value}")
    job = build_job(exp, exp.task(), exp.datasets(), tmp_path / "job")
    result = train_loop.run(job, peak_tflops=1.0)  # (No MFU calibration.)
    losses = [s["loss"] for _, s in result.history]
    assert len(losses) == 8 and np.isfinite(losses).all()
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("fmt", list(TextFormat))
def test_eval_epoch_reads_back_every_document(tmp_path, fmt):
    """Unpacked one-epoch eval with bytes: the real examples decode to the documents."""
    train_path = write(tmp_path, fmt, field="body", name="train")
    eval_docs = DOCS[:9]
    eval_path = write(tmp_path, fmt, eval_docs, field="body", name="valid")
    exp = experiment(
        TEXT_DATA_PATH=train_path,
        TEXT_EVAL_DATA_PATH=eval_path,
        TEXT_FORMAT=fmt,
        TEXT_FIELD="body",
        TEXT_TASK_NAME=f"text_eval_{fmt.value}",
        MAX_SEQ_LEN=512,
    )
    train_cfg, _ = exp.datasets()
    assert train_cfg.feature_converter_pack
    _, eval_input = inputs(exp)
    labels, weights = [], []
    while True:
        try:
            batch = eval_input.get_next()
        except StopIteration:
            break
        assert "segment_ids" not in batch
        labels.append(batch.labels)
        weights.append(batch.weights)
    real = np.concatenate(weights).sum(axis=1) > 0
    decoded = eval_input.ids_to_strings(np.concatenate(labels)[real])
    # 9 short documents are concatenated into one piece (Pax's recipe), then split at 511 bytes.
    assert "".join(decoded) == "".join(eval_docs)


def test_sentencepiece_vocabulary(tmp_path):
    path = write(tmp_path, TextFormat.LINES)
    vocab_path = train_spm(path, tmp_path / "spm", 60)
    exp = experiment(TEXT_DATA_PATH=path, VOCAB_PATH=vocab_path, TEXT_TASK_NAME="text_spm")
    (train_input,) = inputs(exp)
    vocab = seqio.SentencePieceVocabulary(vocab_path)
    ids = np.asarray([vocab.encode("the dog sat on the log.") + [0, 0]])
    assert train_input.ids_to_strings(ids) == ["the dog sat on the log."]
    assert train_input.get_next().labels.max() < vocab.vocab_size

    small = experiment(
        TEXT_DATA_PATH=path, VOCAB_PATH=vocab_path, TEXT_TASK_NAME="text_spm", VOCAB_SIZE=8
    )
    with pytest.raises(InputConfigError, match="VOCAB_SIZE"):
        inputs(small)


def test_data_path_is_a_required_knob():
    with pytest.raises(KnobError, match="TEXT_DATA_PATH"):
        LmTextTiny()


def test_missing_file_names_the_pattern_and_the_knob(tmp_path):
    pattern = str(tmp_path / "missing-*.txt")
    exp = experiment(TEXT_DATA_PATH=pattern, TEXT_TASK_NAME="text_missing")
    with pytest.raises(InputDataNotFoundError, match="TEXT_DATA_PATH") as e:
        inputs(exp)
    assert pattern in str(e.value)


def test_missing_vocab_file(tmp_path):
    missing = str(tmp_path / "missing.model")
    exp = experiment(
        TEXT_DATA_PATH=write(tmp_path, TextFormat.LINES), VOCAB_PATH=missing, TEXT_TASK_NAME="tv"
    )
    with pytest.raises(InputDataNotFoundError, match="VOCAB_PATH") as e:
        inputs(exp)
    assert missing in str(e.value)


def test_jsonl_without_the_field_says_which_knob(tmp_path):
    path = write(tmp_path, TextFormat.JSONL, field="body")
    exp = experiment(TEXT_DATA_PATH=path, TEXT_FORMAT=TextFormat.JSONL, TEXT_TASK_NAME="tj")
    with pytest.raises(InputDataError, match=r"line 1 has no field 'text'.*TEXT_FIELD") as e:
        inputs(exp)
    assert path in str(e.value)


@pytest.mark.parametrize("fmt", [TextFormat.JSONL, TextFormat.TFRECORD])
def test_a_bad_document_found_while_reading_names_its_line_or_record(tmp_path, fmt):
    """Past what each file's check looks at (its first line or record): found while read."""
    path = write(tmp_path, fmt, field="text")
    if fmt is TextFormat.JSONL:
        lines = pathlib.Path(path).read_text().splitlines(keepends=True)
        lines[56] = "[1, 2]\n"
        pathlib.Path(path).write_text("".join(lines))
        bad = f"{path}: line 57 has no field 'text' (it is no object)"
    else:
        records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
        records[40] = b"not an Example"
        with tf.io.TFRecordWriter(path) as writer:
            for record in records:
                writer.write(record)
        bad = f"{path}: record 41 is not a tf.train.Example"
    exp = experiment(TEXT_DATA_PATH=path, TEXT_FORMAT=fmt, TEXT_TASK_NAME=f"tb_{fmt.value}")
    with pytest.raises(InputDataError) as e:  # When the input reads its first packed example.
        (train_input,) = inputs(exp)
        train_input.get_next()
    # (Built through Fiddle, which appends its context on later lines; main.py drops it.)
    assert str(e.value).splitlines()[0].startswith(f"SeqIOInput 'train': {bad}")


def test_registration_is_idempotent(tmp_path):
    path = write(tmp_path, TextFormat.LINES)
    first = text.register_text_task("text_idem", train_path=path)
    assert text.register_text_task("text_idem", train_path=path) is first
    assert text.register_text_task("text_idem", train_path=path + "x") is not first


@pytest.mark.slow
def test_decodes_prompts_cut_from_held_out_documents(tmp_path):
    """Train 2 steps on 1 device, decode at the end: one JSONL line per held-out document
    long enough to prompt, the task's metrics in TensorBoard (the plumbing, not the quality)."""
    held_out = [*DOCS[10:15], "tiny", "a short doc!"]  # "tiny" + EOS has no target past 8.
    exp = experiment(
        TEXT_DATA_PATH=write(tmp_path, TextFormat.LINES, name="train"),
        TEXT_EVAL_DATA_PATH=write(tmp_path, TextFormat.LINES, held_out, name="valid"),
        TEXT_TASK_NAME="text_decode",
        DECODE_PROMPT_LEN=8,
        NUM_TRAIN_STEPS=2,
        ICI_MESH_SHAPE=(1, 1, 1),
    )
    task_cfg = exp.task()
    task_cfg.decode_interval_steps = 2
    train_cfg = exp.datasets()[0]
    job_dir = tmp_path / "job"
    job = build_job(exp, task_cfg, [train_cfg], job_dir, jax.devices()[:1], exp.decoder_datasets())
    metrics = train_loop.run(job, evaluate=True, peak_tflops=1.0).decode["prompts"]
    rows = [json.loads(x) for x in (job_dir / "decoder_out" / "prompts_step2.jsonl").open()]
    kept = [d for d in held_out if len(d) + 1 > 8]  # Bytes plus EOS.
    assert len(rows) == metrics["num_examples"] == len(kept) == 6
    for row, doc in zip(rows, kept, strict=True):  # One host, no shuffling: file order.
        assert row["prompt"] == doc[:8] and row["prompt_ids"][0] == 0  # BOS, then the prompt.
        assert row["target"] == doc[8:31]  # Trimmed to MAX_SEQ_LEN=32 with the EOS.
        assert len(row["decoded_ids"]) <= 32 - 8
    want = text.continuation_metrics([r["target"] for r in rows], [r["decoded"] for r in rows])
    logdir = job_dir / "summaries" / "decode_prompts"
    for name, value in want.items():
        assert metrics[name] == pytest.approx(value)
        assert scalar_series(logdir, f"decode_prompts/{name}") == [(2, pytest.approx(value))]


def test_no_held_out_files_no_decoder_datasets(tmp_path):
    assert experiment(TEXT_DATA_PATH=write(tmp_path, TextFormat.LINES)).decoder_datasets() == []
    with pytest.raises(KnobError, match="DECODE_PROMPT_LEN=32 must be in"):
        experiment(TEXT_DATA_PATH="x", DECODE_PROMPT_LEN=32)
