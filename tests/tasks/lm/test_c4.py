"""C4 end to end without a download: a tiny prepared TFDS ``c4/en:3.0.1`` written by the test
(and ``tfds.testing.mock_data`` on its metadata), a SentencePiece model trained in the test."""

from __future__ import annotations

import collections
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite import config as config_lib
from praxis_lite.inputs.seqio_checks import InputDataNotFoundError
from praxis_lite.inputs.seqio_input import SeqIOInput
from praxis_lite.optim import optimizers, schedules
from praxis_lite.py_utils import NestedMap
from tasks.lm import c4
from tests import REPO as REPO_PATH
from tests import cpu_xla_flags
from tests.praxis_lite.inputs.test_seqio_input import read_all, train_spm

pytestmark = pytest.mark.runs_first  # Minutes of whole runs: scheduled first.

REPO = str(REPO_PATH)
WORDS = "the of and to in is was for on are with as by at from this have one had not".split()
SPLITS = {"train": (120, 2), "validation": (31, 3)}  # docs, files
T = 32


def _docs(split: str) -> list[str]:
    rng = np.random.default_rng(len(split))
    n = SPLITS[split][0]
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 30))) + f" {i}." for i in range(n)]


def write_prepared_c4(tfds_dir, splits: dict[str, list[list[str]]]) -> None:
    """Writes ``c4/en/3.0.1`` as TFDS prepares it under ``tfds_dir``: for each split, one
    TFRecord file per list of documents, and the dataset's metadata."""
    version_dir = pathlib.Path(tfds_dir) / "c4" / "en" / "3.0.1"
    version_dir.mkdir(parents=True)
    features = tfds.features.FeaturesDict(
        {name: tfds.features.Text() for name in ("text", "timestamp", "url")}
    )
    for split, files in splits.items():
        for f, docs in enumerate(files):
            name = version_dir / f"c4-{split}.tfrecord-{f:05d}-of-{len(files):05d}"
            with tf.io.TFRecordWriter(str(name)) as writer:
                for text in docs:
                    example = {"text": text, "timestamp": "2019", "url": "http://x"}
                    writer.write(features.serialize_example(example))
    tfds.folder_dataset.write_metadata(data_dir=str(version_dir), features=features)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A prepared TFDS dir holding c4/en/3.0.1 and an SPM model; the seqio override is set."""
    root = tmp_path_factory.mktemp("c4")
    splits = {}
    for split, (_, files) in SPLITS.items():
        docs = _docs(split)
        splits[split] = [docs[f::files] for f in range(files)]
    write_prepared_c4(root / "tfds", splits)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(_docs("train") + _docs("validation")))
    vocab = train_spm(corpus, root / "spm", 100)
    seqio.set_tfds_data_dir_override(str(root / "tfds"))
    yield NestedMap(tfds_dir=str(root / "tfds"), vocab=vocab)
    seqio.set_tfds_data_dir_override(None)


def c4_input(data, task="c4_test", **kwargs) -> SeqIOInput:
    c4.register_c4_task(task, vocab_path=data.vocab, shuffle_buffer_size=256)
    kwargs.setdefault("batch_size", 4)
    return SeqIOInput(mixture_name=task, task_feature_lengths={"targets": T}, **kwargs)


@pytest.mark.slow
def test_packed_training_batches(data):
    inp = c4_input(data, feature_converter_pack=True)
    for _ in range(3):
        b = inp.get_next()
        assert sorted(b) == ["ids", "labels", "paddings", "segment_ids", "segment_pos", "weights"]
        assert all(v.shape == (4, T) for v in b.values())
        assert b.weights.dtype == b.paddings.dtype == np.float32
        assert b.ids.dtype == b.labels.dtype == b.segment_ids.dtype == np.int32
        np.testing.assert_array_equal(b.weights[b.segment_ids == 0], 0)
        for seg, pos in zip(b.segment_ids, b.segment_pos, strict=True):
            for s in np.unique(seg[seg > 0]):
                np.testing.assert_array_equal(pos[seg == s], np.arange(np.sum(seg == s)))
        # Pax's recipe: pieces of T - 1 tokens of concatenated documents, then EOS.
        assert (b.labels == c4.GPT_EOS_ID).sum() == b.segment_ids.max(axis=1).sum()
    # Pieces may start or end inside a word; most words are whole.
    words = " ".join(inp.ids_to_strings(b.labels)).replace(".", " ").split()
    assert np.mean([w in WORDS or w.isdigit() for w in words]) > 0.8


def test_under_tfds_mock_data(data):
    """tfds.testing.mock_data, using the metadata of the tiny dataset: random text flows."""
    c4.register_c4_task("c4_mock", vocab_path=data.vocab, shuffle_buffer_size=16)
    with tfds.testing.mock_data(
        num_examples=12, policy=tfds.testing.MockPolicy.USE_FILES, data_dir=data.tfds_dir
    ):
        inp = SeqIOInput(batch_size=2, mixture_name="c4_mock", task_feature_lengths={"targets": 16})
        b = inp.get_next()
    assert b.labels.shape == (2, 16) and (b.weights > 0).all()


def test_one_epoch_eval_on_two_hosts_covers_every_token_once(data):
    inputs = [
        c4_input(data, split_name="validation", name="eval", is_training=False,
                 reset_for_eval=True, num_infeed_hosts=2, infeed_host_index=h)
        for h in (0, 1)
    ]  # fmt: skip
    counts = inputs[0].shard_example_counts()
    assert counts[0] > counts[1] > 0  # 3 files over 2 hosts: uneven shards.
    passes = [read_all(inp) for inp in inputs]
    assert len(passes[0]) == len(passes[1]) == math.ceil(counts[0] / 4)
    tokens: collections.Counter = collections.Counter()
    for host, batches in enumerate(passes):
        labels = np.concatenate([b.labels for b in batches])
        real = np.concatenate([b.weights for b in batches]).sum(axis=1) > 0
        assert real.sum() == counts[host]
        assert not labels[~real].any()
        tokens.update(labels[real][labels[real] > c4.GPT_EOS_ID].tolist())
    # Documents are concatenated and split per host, so compare tokens, not examples.
    vocab = seqio.SentencePieceVocabulary(data.vocab)
    expected = collections.Counter(t for doc in _docs("validation") for t in vocab.encode(doc))
    assert tokens == expected


@pytest.mark.slow
def test_resume_is_exact(data):
    reference = c4_input(data, feature_converter_pack=True, seed=5)
    expected = [reference.get_next() for _ in range(6)]
    run = c4_input(data, feature_converter_pack=True, seed=5)
    for _ in range(4):
        run.get_next()
    resumed = c4_input(data, feature_converter_pack=True, seed=5)
    resumed.set_state(run.get_state())
    for want in expected[4:]:
        got = resumed.get_next()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_registration_is_idempotent_and_follows_the_vocab(data, tmp_path):
    first = c4.register_c4_task("c4_idem", vocab_path=data.vocab)
    assert c4.register_c4_task("c4_idem", vocab_path=data.vocab) is first
    other = c4.register_c4_task("c4_idem", vocab_path=str(tmp_path / "other.model"))
    assert other is not first and seqio.get_mixture_or_task("c4_idem") is other


def test_missing_vocab_names_the_path_and_the_knob(data, tmp_path):
    missing = str(tmp_path / "nope.model")
    c4.register_c4_task("c4_novocab", vocab_path=missing)
    with pytest.raises(InputDataNotFoundError) as e:
        SeqIOInput(batch_size=2, mixture_name="c4_novocab", task_feature_lengths={"targets": T})
    assert missing in str(e.value) and "--set VOCAB_PATH=" in str(e.value)


# ----- the experiments -----


def test_c4_1b_experiment_is_paxs():
    exp = c4.C4Spmd1BAdam4Replicas()
    assert exp.global_batch_size(4) == 128 and exp.ICI_MESH_SHAPE == (1, 4, 1)
    assert (exp.NUM_LAYERS, exp.MODEL_DIMS, exp.HIDDEN_DIMS, exp.NUM_HEADS) == (13, 2560, 10240, 20)
    assert (exp.MAX_SEQ_LEN, exp.VOCAB_SIZE, exp.VOCAB_PATH) == (1024, 32000, c4.GPT_SPM_PATH)
    task = config_lib.instantiate(exp.task())
    opt = task.learner.optimizer
    assert isinstance(opt, optimizers.Adam)
    assert (opt.learning_rate, opt.beta1, opt.beta2, opt.epsilon) == (1e-3, 0.9, 0.99, 1e-6)
    assert (opt.clip_gradient_norm_to_value, opt.clip_threshold) == (5.0, 1.0)  # Pax's
    assert opt.lr_schedule == schedules.LinearRampupExponentialDecay(
        warmup_steps=4000, decay_start=4001, decay_end=300_000, min_ratio=0.1, max=1.0
    )
    np.testing.assert_allclose(float(opt.lr_schedule(2000)), 0.5)
    np.testing.assert_allclose(float(opt.lr_schedule(300_000)), 0.1, rtol=1e-5)
    # About 1B parameters (abstract init: nothing allocated).
    ids = jax.ShapeDtypeStruct((1, exp.MAX_SEQ_LEN), jnp.int32)
    floats = jax.ShapeDtypeStruct((1, exp.MAX_SEQ_LEN), jnp.float32)
    batch = NestedMap(ids=ids, labels=ids, paddings=floats, weights=floats)
    init = lambda k, b: task.model.init({"params": k, "dropout": k}, b)  # noqa: E731
    params = jax.eval_shape(init, jax.random.key(0), batch)
    count = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
    assert 1.0e9 < count < 1.2e9, count


def test_datasets_register_the_task_without_reading_files():
    cls = base_experiment.with_overrides(
        c4.C4Spmd1BAdam4Replicas, {"VOCAB_PATH": "/nowhere/spm.model", "TRAIN_MIXTURE": "c4_lazy"}
    )
    train_cfg, eval_cfg = cls().datasets()
    assert seqio.get_mixture_or_task("c4_lazy").output_features["targets"].add_eos
    assert (train_cfg.split_name, train_cfg.feature_converter_pack) == ("train", True)
    assert (eval_cfg.split_name, eval_cfg.reset_for_eval, eval_cfg.is_training) == (
        "validation",
        True,
        False,
    )
    assert train_cfg.task_feature_lengths == {"targets": 1024}


TINY = {
    "NUM_LAYERS": 1,
    "MODEL_DIMS": 32,
    "HIDDEN_DIMS": 64,
    "NUM_HEADS": 2,
    "DIMS_PER_HEAD": 16,
    "VOCAB_SIZE": 128,
    "MAX_SEQ_LEN": T,
    "FPROP_DTYPE": jnp.float32,
    "PERCORE_BATCH_SIZE": 1,
    "ICI_MESH_SHAPE": (1, 8, 1),
    "LEARNING_RATE": 1e-2,
    "LR_LRED_WARMUP": 0,
    "LR_LRED_DECAY_START": 1,
    "LR_LRED_DECAY_END": 1000,
    "NUM_TRAIN_STEPS": 12,
    "SUMMARY_INTERVAL_STEPS": 1,
    "CHECKPOINT_EVERY_N_STEPS": 1000,
    "TRAIN_MIXTURE": "c4_exp",
}


@pytest.mark.slow
def test_tiny_c4_experiment_trains_and_evaluates(data, tmp_path):
    cls = base_experiment.with_overrides(
        c4.C4Spmd1BAdam4Replicas, {**TINY, "VOCAB_PATH": data.vocab}
    )
    exp = cls()
    datasets = exp.datasets()
    datasets[0].shuffle_buffer_size = 256  # Pax's 100k buffer is for the real C4.
    job = build_job(exp, exp.task(), datasets, tmp_path / "job")
    result = train_loop.run(job, evaluate=True, peak_tflops=1.0)  # (No MFU calibration.)
    losses = [s["loss"] for _, s in result.history]
    assert len(losses) == 12 and np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    metrics = result.eval["validation"]
    assert np.isfinite(metrics["loss"]) and metrics["num_batches"] >= 1


@pytest.mark.slow
def test_main_reports_a_missing_tfds_dir_without_traceback(data, tmp_path):
    empty = tmp_path / "empty_tfds"
    empty.mkdir()
    env = dict(os.environ, XLA_FLAGS=cpu_xla_flags(4))
    proc = subprocess.run(
        [
            sys.executable, "-m", "paxlite.main", "--exp=tasks.lm.c4.C4Spmd1BAdam4Replicas",
            f"--job_log_dir={tmp_path / 'job'}", f"--tfds_data_dir={empty}",
            f"--set=VOCAB_PATH={data.vocab}", "--set=PERCORE_BATCH_SIZE=1",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    error = proc.stderr[proc.stderr.index("paxlite: error:") :]
    assert str(empty) in error and "--tfds_data_dir=DIR" in error and "c4/en/3.0.1" in error
