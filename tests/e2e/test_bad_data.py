"""Bad data gets one line: each data and vocabulary format x missing, empty, truncated, malformed.

Formats: text lines, JSONL and TFRecord files (LmTextTiny's TEXT_DATA_PATH), a prepared
TFDS dataset (C4's ``--tfds_data_dir``) and SentencePiece vocabularies (VOCAB_PATH). Every
case runs ``paxlite.main`` in this process and must end with exit 2 and one line
``paxlite: error: ...`` naming the file (and line or record) and the knob or flag to fix,
whether the damage is found before anything runs or while the first batches are read
inside ``train.run``. All files are real, made here in temporary directories.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import time
from collections.abc import Callable

import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from tests.paxlite.test_main import main_in_process, run_main
from tests.praxis_lite.inputs.test_seqio_input import train_spm

TEXT_EXP = "tasks.lm.text.LmTextTiny"
C4_EXP = "tasks.lm.c4.C4Spmd1BAdam4Replicas"
SMALL = [
    "--set=ICI_MESH_SHAPE=1,8,1",  # The 8 fake CPU devices of the test process.
    "--set=PERCORE_BATCH_SIZE=1",
    "--set=MAX_SEQ_LEN=32",
    "--set=NUM_TRAIN_STEPS=2",
    "--peak_tflops=1",  # No MFU calibration before the first batch is read.
]
C4_SMALL = [
    *SMALL,
    "--set=NUM_LAYERS=1",
    "--set=MODEL_DIMS=32",
    "--set=HIDDEN_DIMS=64",
    "--set=NUM_HEADS=2",
    "--set=DIMS_PER_HEAD=16",
    "--set=VOCAB_SIZE=128",
]
DOCS = [f"document {i}: the cat sat on the mat and the dog sat on the log." for i in range(60)]
TEXT = {"text": "\n".join(DOCS) + "\n"}


def _example(text: str, field: str = "text") -> bytes:
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))
    return tf.train.Example(
        features=tf.train.Features(feature={field: feature})
    ).SerializeToString()


def _write_tfrecord(path: pathlib.Path, records: list[bytes]) -> pathlib.Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


def _jsonl(docs: list[str]) -> str:
    return "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs))


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Well-formed files of every format: lines, JSONL, TFRecord, an SPM model, a TFDS dir."""
    root = tmp_path_factory.mktemp("good")
    (root / "docs.txt").write_text(TEXT["text"])
    (root / "docs.jsonl").write_text(_jsonl(DOCS))
    _write_tfrecord(root / "docs.tfrecord", [_example(d) for d in DOCS])
    version_dir = root / "tfds" / "c4" / "en" / "3.0.1"
    version_dir.mkdir(parents=True)
    features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
    for split in ("train", "validation"):
        records = [features.serialize_example({"text": d}) for d in DOCS]
        _write_tfrecord(version_dir / f"c4-{split}.tfrecord-00000-of-00001", records)
    tfds.folder_dataset.write_metadata(data_dir=str(version_dir), features=features)
    return {
        "lines": root / "docs.txt",
        "jsonl": root / "docs.jsonl",
        "tfrecord": root / "docs.tfrecord",
        "spm": pathlib.Path(train_spm(root / "docs.txt", root / "spm", 60)),
        "tfds": root / "tfds",
    }


@pytest.fixture(autouse=True)
def _no_tfds_override():
    """--tfds_data_dir sets seqio's process-wide override; later tests must not see it."""
    yield
    seqio.set_tfds_data_dir_override(None)


def _truncate(path: pathlib.Path, keep: float = 0.7) -> pathlib.Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _copy(src: pathlib.Path, tmp: pathlib.Path, name: str | None = None) -> pathlib.Path:
    dst = tmp / (name or src.name)
    (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return dst


# Each case: (tmp dir, good files) -> (command-line arguments, phrases of the error line).
Case = Callable[[pathlib.Path, dict], tuple[list[str], list[str]]]


def _text(path, fmt: str = "LINES", *extra: str) -> list[str]:
    return [f"--set=TEXT_DATA_PATH={path}", f"--set=TEXT_FORMAT={fmt}", *SMALL, *extra]


def _lines_missing(tmp, good):
    pattern = tmp / "train-*.txt"
    return _text(pattern), [f"no file matches '{pattern}'", "--set=TEXT_DATA_PATH=PATH"]


def _lines_empty(tmp, good):
    (tmp / "a.txt").write_text("")
    return _text(tmp / "a.txt"), [f"{tmp / 'a.txt'}", "is empty (0 bytes)", "TEXT_DATA_PATH"]


def _lines_blank(tmp, good):
    (tmp / "a.txt").write_text("\n  \n\n")
    return _text(tmp / "a.txt"), [f"{tmp / 'a.txt'} holds only blank lines", "TEXT_DATA_PATH"]


def _lines_binary(tmp, good):
    path = _copy(good["tfrecord"], tmp)
    return _text(path), [f"{path}: byte ", "is a NUL", "--set=TEXT_FORMAT=TFRECORD"]


def _jsonl_missing(tmp, good):
    path = tmp / "nope.jsonl"
    return _text(path, "JSONL"), [f"{path} (split 'train'", "does not exist", "TEXT_DATA_PATH"]


def _jsonl_empty(tmp, good):
    (tmp / "a.jsonl").write_text("")
    return _text(tmp / "a.jsonl", "JSONL"), [f"{tmp / 'a.jsonl'}", "is empty (0 bytes)"]


def _jsonl_truncated(tmp, good):
    path = _copy(good["jsonl"], tmp)
    path.write_text(path.read_text()[:-20])
    return _text(path, "JSONL"), [f"{path}: line 60 is not JSON", "truncated"]


def _jsonl_bad_line_57(tmp, good):
    """Past the first 64 KiB that are checked up front: found while train.run reads."""
    docs = [d * 4 for d in DOCS] * 20  # 1200 lines, ~250 KiB.
    lines = _jsonl(docs).splitlines(keepends=True)
    lines[56] = '{"text": "cut off\n'
    (tmp / "big.jsonl").write_text("".join(lines))
    path = tmp / "big.jsonl"
    return _text(path, "JSONL", "--set=PACKED_INPUT=False"), [
        f"{path}: line 57 is not JSON",
        "--set=TEXT_FORMAT=LINES",
    ]


def _jsonl_no_field(tmp, good):
    path = _copy(good["jsonl"], tmp)
    return _text(path, "JSONL", "--set=TEXT_FIELD=body"), [
        f"{path}: line 1 has no field 'body'",
        "['id', 'text']",
        "--set=TEXT_FIELD=",
    ]


def _tfrecord_missing(tmp, good):
    path = tmp / "nope.tfrecord"
    return _text(path, "TFRECORD"), [f"{path} (split 'train'", "does not exist", "TEXT_DATA_PATH"]


def _tfrecord_empty(tmp, good):
    (tmp / "a.tfrecord").write_bytes(b"")
    return _text(tmp / "a.tfrecord", "TFRECORD"), [f"{tmp / 'a.tfrecord'}", "is empty"]


def _tfrecord_truncated(tmp, good):
    path = _truncate(_copy(good["tfrecord"], tmp))
    return _text(path, "TFRECORD"), [f"{path}: record 43 is cut off", "TEXT_DATA_PATH"]


def _tfrecord_not_tfrecord(tmp, good):
    path = _copy(good["lines"], tmp, "docs.tfrecord")
    return _text(path, "TFRECORD"), [
        f"{path}: record 1 cannot be read",
        "not a TFRecord file",
        "--set=TEXT_FORMAT=",
    ]


def _tfrecord_not_examples(tmp, good):
    path = _write_tfrecord(tmp / "raw.tfrecord", [b"\xff\xfe raw bytes"] * 3)
    return _text(path, "TFRECORD"), [f"{path}: record 1 is not a tf.train.Example"]


def _tfrecord_no_field(tmp, good):
    path = _write_tfrecord(tmp / "b.tfrecord", [_example(d, "body") for d in DOCS])
    return _text(path, "TFRECORD"), [
        f"{path}: record 1 has no bytes feature 'text'",
        "'body'",
        "--set=TEXT_FIELD=",
    ]


def _spm(tmp, good, vocab) -> list[str]:
    return _text(good["lines"], "LINES", f"--set=VOCAB_PATH={vocab}")


def _spm_missing(tmp, good):
    return _spm(tmp, good, tmp / "no.model"), [f"{tmp / 'no.model'}' ", "does not exist"]


def _spm_empty(tmp, good):
    (tmp / "e.model").write_bytes(b"")
    return _spm(tmp, good, tmp / "e.model"), [f"{tmp / 'e.model'}", "is empty (0 bytes)"]


def _spm_truncated(tmp, good):
    path = _truncate(_copy(good["spm"], tmp), 0.5)
    return _spm(tmp, good, path), [f"{path}", "is not a SentencePiece model"]


def _spm_not_a_model(tmp, good):
    path = _copy(good["lines"], tmp, "text.model")
    return _spm(tmp, good, path), [f"{path}", "is not a SentencePiece model"]


def _c4(tfds_dir: pathlib.Path, good) -> list[str]:
    # A task per case: seqio's TFDS loader keeps the data dir it first saw.
    task = f"--set=TRAIN_MIXTURE=c4_{tfds_dir.parent.name}"
    return [f"--tfds_data_dir={tfds_dir}", f"--set=VOCAB_PATH={good['spm']}", task, *C4_SMALL]


def _shard(tfds_dir: pathlib.Path) -> pathlib.Path:
    return tfds_dir / "c4/en/3.0.1/c4-train.tfrecord-00000-of-00001"


def _tfds_missing(tmp, good):
    (tmp / "tfds").mkdir()
    return _c4(tmp / "tfds", good), [f"{tmp / 'tfds'}", "c4/en/3.0.1", "--tfds_data_dir=DIR"]


def _tfds_empty(tmp, good):
    tfds_dir = _copy(good["tfds"], tmp)
    _shard(tfds_dir).write_bytes(b"")
    return _c4(tfds_dir, good), [f"{_shard(tfds_dir)}", "is empty (0 bytes)", "--tfds_data_dir"]


def _tfds_truncated(tmp, good):
    tfds_dir = _copy(good["tfds"], tmp)
    _truncate(_shard(tfds_dir))
    return _c4(tfds_dir, good), [
        f"{_shard(tfds_dir)}: record 43 is cut off",
        "tfds build",
        "--tfds_data_dir=DIR",
    ]


def _tfds_malformed(tmp, good):
    tfds_dir = _copy(good["tfds"], tmp)
    shutil.copy(good["lines"], _shard(tfds_dir))
    return _c4(tfds_dir, good), [f"{_shard(tfds_dir)}: record 1 cannot be read", "--tfds_data_dir"]


CASES: dict[str, Case] = {
    name.lstrip("_"): fn
    for name, fn in dict(globals()).items()
    if name.startswith(("_lines_", "_jsonl_", "_tfrecord_", "_spm_", "_tfds_")) and callable(fn)
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_fails_in_one_line_naming_the_file_and_the_fix(tmp_path, good, case):
    args, phrases = CASES[case](tmp_path, good)
    exp = C4_EXP if case.startswith("tfds_") else TEXT_EXP
    start = time.perf_counter()
    code, stderr = main_in_process(f"--job_log_dir={tmp_path / 'job'}", *args, exp=exp)
    assert code == 2, stderr[-3000:]
    assert time.perf_counter() - start < 30
    assert "Traceback" not in stderr, stderr[-3000:]
    message = stderr[stderr.index("paxlite: error: ") :].rstrip()
    assert "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message


def test_every_format_is_tried_with_every_kind_of_damage():
    kinds = {"lines", "jsonl", "tfrecord", "spm", "tfds"}
    assert {name.split("_")[0] for name in CASES} == kinds
    for kind in kinds - {"lines"}:  # A cut text file is still text: lines have no "truncated".
        assert any(n.startswith(f"{kind}_truncated") for n in CASES), kind


@pytest.mark.slow
def test_a_bad_line_found_mid_run_gives_one_line_in_a_real_process(tmp_path, good):
    """A fresh process: nothing on the real stderr but the one line (TF's C++ logs included)."""
    args, phrases = _jsonl_bad_line_57(tmp_path, good)
    proc = run_main(
        f"--job_log_dir={tmp_path / 'job'}",
        *args,
        exp=TEXT_EXP,
        devices=8,
        timeout=120,
        unset_env=("TF_CPP_MIN_LOG_LEVEL",),  # main.py's own default must keep TF quiet.
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if not _tf_startup_line(line)]
    assert len(lines) == 1 and lines[0].startswith("paxlite: error: "), proc.stderr
    for phrase in phrases:
        assert phrase in lines[0]


def _tf_startup_line(line: str) -> bool:
    """TensorFlow's CUDA probe at import, logged before its log level applies (no GPU here)."""
    return line.startswith("WARNING: All log messages before absl::InitializeLog()") or (
        "cudart_stub.cc" in line and "Could not find cuda drivers" in line
    )
