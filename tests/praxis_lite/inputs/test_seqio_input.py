"""SeqIOInput on real SeqIO pipelines: batches, packing, two hosts, Pax's eval table, resume;
decoder inputs (prompt/target batches) and the task's postprocessed predict metrics."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import seqio
import tensorflow as tf

from paxlite.evaluation import decode_lib
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.inputs import seqio_tasks
from praxis_lite.inputs.base_input import InputConfigError, InputDataError
from praxis_lite.inputs.seqio_checks import InputDataNotFoundError
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from praxis_lite.py_utils import NestedMap

T = 24
TRAIN_FILES = 4
EVAL_FILE_SIZES = (7, 5, 11)  # Two hosts shard the 3 files: 7 + 11 docs vs 5.


def _doc(split: str, f: int, i: int) -> str:
    return f"{split} f{f} d{i} " + "xyz"[i % 3] * (i % 7)


def _eval_docs() -> list[str]:
    return [_doc("va", f, i) for f, n in enumerate(EVAL_FILE_SIZES) for i in range(n)]


def _one_doc_task(name: str, patterns: dict, vocabulary: seqio.Vocabulary, **kwargs) -> seqio.Task:
    """Each line is one example (tokens + EOS), so examples can be told apart."""
    return seqio.Task(
        name,
        source=seqio.TextLineDataSource(patterns),
        preprocessors=[
            lambda ds: ds.map(lambda line: {"targets": line}),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features={"targets": seqio.Feature(vocabulary, add_eos=True)},
        shuffle_buffer_size=64,
        **kwargs,
    )


def train_spm(corpus, prefix, vocab_size: int) -> str:
    """Trains a SentencePiece model on ``corpus`` (seqio's ids: pad 0, EOS 1, UNK 2); its path."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        hard_vocab_limit=False,  # A tiny corpus may not have vocab_size pieces.
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    return f"{prefix}.model"


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> str:
    """'lines_lm': 4 train files of 25 docs, 3 validation files of 7, 5, 11 docs; bytes."""
    root = tmp_path_factory.mktemp("lines")
    for f in range(TRAIN_FILES):
        (root / f"train-{f}.txt").write_text("\n".join(_doc("tr", f, i) for i in range(25)))
    for f, n in enumerate(EVAL_FILE_SIZES):
        (root / f"valid-{f}.txt").write_text("\n".join(_doc("va", f, i) for i in range(n)))
    patterns = {"train": str(root / "train-*.txt"), "validation": str(root / "valid-*.txt")}
    seqio.TaskRegistry.remove("lines_lm")
    seqio.TaskRegistry.add_provider(
        "lines_lm", _one_doc_task("lines_lm", patterns, seqio.ByteVocabulary())
    )
    return "lines_lm"


def make(task: str, **kwargs) -> SeqIOInput:
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("task_feature_lengths", {"targets": T})
    return SeqIOInput(mixture_name=task, **kwargs)


def make_eval(task: str, **kwargs) -> SeqIOInput:
    return make(task, split_name="validation", name="eval", is_training=False, **kwargs)


def read_all(inp: SeqIOInput) -> list:
    batches = []
    while True:
        try:
            batches.append(inp.get_next())
        except StopIteration:
            return batches


def real_docs(inp: SeqIOInput, batches: list) -> list[str]:
    """The decoded targets of every example with a positive weight."""
    docs = []
    for b in batches:
        real = b.weights.sum(axis=1) > 0
        docs += inp.ids_to_strings(b.labels[real])
    return docs


def assert_batches_equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y)
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_unpacked_batch(task):
    b = make(task).get_next()
    assert sorted(b) == ["ids", "labels", "paddings", "weights"]
    for key, dtype in [("ids", np.int32), ("labels", np.int32), ("weights", np.float32)]:
        assert b[key].shape == (4, T) and b[key].dtype == dtype
    np.testing.assert_array_equal(b.paddings, (b.labels == 0).astype(np.float32))
    np.testing.assert_array_equal(b.weights, 1.0 - b.paddings)
    # Inputs are the targets shifted right behind a 0 (BOS).
    np.testing.assert_array_equal(b.ids[:, 0], 0)
    np.testing.assert_array_equal(b.ids[:, 1:] * (b.labels[:, :-1] != 0), b.labels[:, :-1])


def test_packed_segments_are_consistent(task):
    b = make(task, feature_converter_pack=True, task_feature_lengths={"targets": 48}).get_next()
    assert b.segment_ids.shape == b.segment_pos.shape == (4, 48)
    assert b.segment_ids.dtype == b.segment_pos.dtype == np.int32
    assert (b.segment_ids.max(axis=1) >= 2).all()  # Short docs: several per row.
    for seg, pos, w, ids in zip(b.segment_ids, b.segment_pos, b.weights, b.ids, strict=True):
        starts = np.flatnonzero(np.diff(seg, prepend=-1) != 0)
        for start in starts[seg[starts] > 0]:
            length = np.count_nonzero(seg == seg[start])
            np.testing.assert_array_equal(pos[start : start + length], np.arange(length))
            assert ids[start] == 0  # Each packed doc starts with its own BOS.
        np.testing.assert_array_equal(w[seg == 0], 0)
        np.testing.assert_array_equal(pos[seg == 0], 0)
        np.testing.assert_array_equal(w[seg > 0], 1)


def test_two_training_hosts_read_disjoint_docs(task):
    seen = []
    for host in range(2):
        inp = make(task, num_infeed_hosts=2, infeed_host_index=host)
        seen.append(set(real_docs(inp, [inp.get_next() for _ in range(10)])))
    assert len(seen[0]) > 10 and len(seen[1]) > 10
    assert not seen[0] & seen[1]


def test_one_epoch_eval_on_two_hosts(task):
    inputs = [
        make_eval(task, reset_for_eval=True, num_infeed_hosts=2, infeed_host_index=h)
        for h in (0, 1)
    ]
    assert inputs[0].shard_example_counts() == (18, 5)  # Sharded by file: uneven.
    passes = [read_all(inp) for inp in inputs]
    assert len(passes[0]) == len(passes[1]) == 5  # ceil(18 / 4) on both hosts.
    docs = real_docs(inputs[0], passes[0]) + real_docs(inputs[1], passes[1])
    assert collections.Counter(docs) == collections.Counter(_eval_docs())
    for batch in passes[1][2:]:  # Host 1's 5 docs fill 2 batches; then all-zero batches.
        assert not (batch.ids.any() or batch.labels.any() or batch.weights.any())
        np.testing.assert_array_equal(batch.paddings, 1.0)


def test_one_epoch_eval_on_one_host_pads_the_last_batch(task):
    inp = make_eval(task, reset_for_eval=True)
    batches = read_all(inp)
    assert len(batches) == 6  # 23 docs
    assert (batches[-1].weights.sum(axis=1) > 0).tolist() == [True, True, True, False]
    assert sorted(real_docs(inp, batches)) == sorted(_eval_docs())


def test_eval_reset_replays_the_epoch(task):
    inp = make_eval(task, reset_for_eval=True, num_infeed_hosts=2, infeed_host_index=0)
    first = read_all(inp)
    inp.reset()
    assert_batches_equal(read_all(inp), first)


def test_rolling_eval_passes_see_different_batches(task):
    inp = make_eval(task, eval_loop_num_batches=2)  # reset_for_eval=False, repeat=None
    assert inp.repeats
    first = [inp.get_next() for _ in range(2)]
    second = [inp.get_next() for _ in range(2)]
    assert not np.array_equal(first[0].labels, second[0].labels)
    for _ in range(10):  # 23 docs / 4 per batch: the rolling input wraps around.
        inp.get_next()


def test_a_rolling_eval_that_would_run_dry_raises(task):
    with pytest.raises(InputConfigError, match="reset_for_eval"):
        make_eval(task, reset_for_eval=False, repeat=False)


def test_a_repeating_reset_eval_reads_the_same_first_batches_each_pass(task):
    """T5X's training eval (``take(eval_steps).cache()``): every pass, the first N batches."""
    inp = make_eval(task, reset_for_eval=True, repeat=True, eval_loop_num_batches=2)
    first = [inp.get_next() for _ in range(2)]
    inp.reset()
    assert_batches_equal([inp.get_next() for _ in range(2)], first)
    for _ in range(10):  # 23 docs / 4 per batch: it repeats instead of ending.
        assert inp.get_next().weights.shape[0] == 4


def test_finite_training_input_drops_the_remainder(task):
    inp = make(task, repeat=False, shuffle=False, batch_size=32)
    batches = read_all(inp)
    assert len(batches) == 3  # 100 docs -> 3 full batches; the last 4 docs are dropped.


@pytest.mark.slow
def test_resume_is_exact(task):
    kwargs = dict(feature_converter_pack=True, seed=7, num_infeed_hosts=2, infeed_host_index=1)
    reference = make(task, **kwargs)
    expected = [reference.get_next() for _ in range(8)]

    run = make(task, **kwargs)
    for _ in range(5):
        run.get_next()
    state = json.loads(json.dumps(run.get_state()))
    assert state["num_batches"] == 5

    resumed = make(task, **kwargs)
    resumed.set_state(state)
    assert_batches_equal([resumed.get_next() for _ in range(3)], expected[5:])


@pytest.mark.slow
def test_num_batches_to_skip_starts_later_and_resumes_exactly(task):
    """Pax's num_batches_to_skip (TRAINING_NUM_BATCHES_TO_SKIP): the stream starts k batches in;
    its state counts only what it read, and a resume skips both."""
    kwargs = dict(feature_converter_pack=True, seed=7)
    reference = make(task, **kwargs)
    expected = [reference.get_next() for _ in range(8)]

    skipping = make(task, num_batches_to_skip=3, **kwargs)
    assert_batches_equal([skipping.get_next() for _ in range(2)], expected[3:5])
    state = skipping.get_state()
    assert state["num_batches"] == 2
    resumed = make(task, num_batches_to_skip=3, **kwargs)
    resumed.set_state(state)
    assert_batches_equal([resumed.get_next() for _ in range(3)], expected[5:8])


@pytest.mark.slow
def test_reset_after_the_sample_batch_replays_it(task):
    """The trainer reads a sample batch, then resets; the stream must start over exactly."""
    expected = [make(task, seed=3).get_next()]
    fresh = make(task, seed=3)
    expected.append([fresh.get_next() for _ in range(2)][1])
    inp = make(task, seed=3)
    inp.get_next()
    inp.reset()
    assert_batches_equal([inp.get_next(), inp.get_next()], expected)
    inp.get_next()
    inp.reset()  # After more than one batch: rebuilt from the start.
    assert_batches_equal([inp.get_next()], expected[:1])


def test_ids_to_strings_round_trip_bytes(task):
    inp = make(task)
    texts = ["hello world", "ünïcode ok", "a"]
    vocab = seqio.ByteVocabulary()
    ids = np.zeros((3, 16), np.int32)
    for row, text in zip(ids, texts, strict=True):
        tokens = vocab.encode(text)
        row[: len(tokens)] = tokens
    assert inp.ids_to_strings(ids) == texts
    assert inp.ids_to_strings(ids, lengths=[5, 16, 1]) == ["hello", "ünïcode ok", "a"]


def test_ids_to_strings_round_trip_sentencepiece(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(f"the quick brown fox {i} jumps over the lazy dog" for i in range(200))
    )
    vocab = seqio.SentencePieceVocabulary(train_spm(corpus, tmp_path / "spm", 40))
    patterns = {"train": str(corpus)}
    seqio.TaskRegistry.remove("spm_lines")
    seqio.TaskRegistry.add_provider("spm_lines", _one_doc_task("spm_lines", patterns, vocab))
    inp = make("spm_lines", task_feature_lengths={"targets": 64}, shuffle=False)
    texts = ["the lazy dog jumps", "over the quick brown fox 17"]
    ids = np.zeros((2, 64), np.int32)
    for row, text in zip(ids, texts, strict=True):
        tokens = vocab.encode(text)
        row[: len(tokens)] = tokens
    assert inp.ids_to_strings(ids) == texts
    first = inp.get_next()
    assert inp.ids_to_strings(first.labels[:1]) == ["the quick brown fox 0 jumps over the lazy dog"]


def test_score_metric_fns_come_from_the_task(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")

    def count(targets, scores):
        return {"n": len(targets)}

    seqio.TaskRegistry.remove("scored_lines")
    seqio.TaskRegistry.add_provider(
        "scored_lines",
        _one_doc_task(
            "scored_lines",
            {"train": str(tmp_path / "a.txt")},
            seqio.ByteVocabulary(),
            metric_fns=[count],
        ),
    )
    assert list(make("scored_lines").score_metric_fns) == [count]


def test_mixture(task):
    seqio.MixtureRegistry.remove("lines_mix")
    seqio.MixtureRegistry.add("lines_mix", [(task, 1.0)])
    b = make("lines_mix", feature_converter_pack=True).get_next()
    assert b.labels.shape == (4, T) and "segment_ids" in b
    with pytest.raises(InputConfigError, match="Mixture"):
        make("lines_mix", shuffle_buffer_size=10)


# ----- errors say what was looked for and how to fix it -----


def _assert_clean(error: BaseException) -> None:
    assert error.__cause__ is None
    assert error.__suppress_context__ or error.__context__ is None
    assert "Traceback" not in str(error)


def test_unknown_name_lists_close_names(task):
    with pytest.raises(InputConfigError, match="no SeqIO Task or Mixture named 'lines_ln'") as e:
        make("lines_ln")
    assert "lines_lm" in str(e.value)
    _assert_clean(e.value)


def test_unknown_split_lists_splits(task):
    with pytest.raises(InputConfigError, match=r"no split 'test'.*\['train', 'validation'\]"):
        make(task, split_name="test")


def test_missing_files(tmp_path):
    pattern = str(tmp_path / "nothing-*.txt")
    seqio.TaskRegistry.remove("no_files")
    seqio.TaskRegistry.add_provider(
        "no_files", _one_doc_task("no_files", {"train": pattern}, seqio.ByteVocabulary())
    )
    with pytest.raises(InputDataNotFoundError, match="no file matches") as e:
        make("no_files", data_flag="--set=MY_DATA=PATH")
    assert pattern in str(e.value) and "point --set=MY_DATA=PATH at existing files" in str(e.value)


def _example_task(name: str, path: str) -> None:
    """Registers ``name``: seqio's own TFExampleDataSource over ``path`` (feature 'text')."""
    source = seqio.TFExampleDataSource(
        {"train": path}, feature_description={"text": tf.io.FixedLenFeature([], tf.string)}
    )
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add_provider(
        name,
        seqio.Task(
            name,
            source=source,
            preprocessors=[
                lambda ds: ds.map(lambda x: {"targets": x["text"]}),
                seqio.preprocessors.tokenize,
            ],
            output_features={"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)},
        ),
    )


def test_a_damaged_record_found_while_reading_is_named_by_file_and_record(tmp_path):
    """TensorFlow names only a byte offset; the error names the file and the record."""
    path = tmp_path / "docs.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(8):
            text = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"doc %d" % i]))
            features = tf.train.Features(feature={"text": text})
            writer.write(tf.train.Example(features=features).SerializeToString())
    data = bytearray(path.read_bytes())
    record_size = len(data) // 8  # 8 bytes length, 4 its CRC, the data, 4 the data's CRC.
    data[4 * record_size + 14] ^= 0xFF  # A flipped byte in record 5's data: its CRC fails.
    path.write_bytes(bytes(data))
    _example_task("damaged", str(path))
    inp = make("damaged", data_flag="--set=MY_DATA=PATH")  # Record 1 reads: built fine.
    with pytest.raises(InputDataError) as e:
        read_all(inp)
    message = str(e.value)
    assert message.startswith(f"SeqIOInput 'train': {path}: record 5 is damaged (corrupted")
    assert "the 4 records before it read" in message and "--set=MY_DATA=PATH" in message
    _assert_clean(e.value)


def test_an_input_with_no_examples_says_so_instead_of_stopping(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    task = seqio.Task(
        "filtered_out",
        source=seqio.TextLineDataSource({"train": str(tmp_path / "a.txt")}),
        preprocessors=[
            lambda ds: ds.filter(lambda line: tf.strings.length(line) > 10),  # None is.
            lambda ds: ds.map(lambda line: {"targets": line}),
            seqio.preprocessors.tokenize,
        ],
        output_features={"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)},
    )
    seqio.TaskRegistry.remove("filtered_out")
    seqio.TaskRegistry.add_provider("filtered_out", task)
    for settings in ({}, {"is_training": False, "reset_for_eval": True, "name": "eval"}):
        with pytest.raises(InputDataError, match="yields no examples") as e:
            make("filtered_out", **settings).get_next()
        assert str(tmp_path / "a.txt") in str(e.value)


def test_missing_vocabulary_file(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    missing = str(tmp_path / "missing.model")
    vocab = seqio.SentencePieceVocabulary(missing)
    seqio.TaskRegistry.remove("no_vocab")
    seqio.TaskRegistry.add_provider(
        "no_vocab", _one_doc_task("no_vocab", {"train": str(tmp_path / "a.txt")}, vocab)
    )
    with pytest.raises(InputDataNotFoundError, match="does not exist") as e:
        make("no_vocab")
    assert missing in str(e.value) and "--set VOCAB_PATH=" in str(e.value)
    _assert_clean(e.value)
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("tfds_name", ["c4/en:3.0.1", "mnist:3.0.1"], ids=["no-code", "code"])
def test_missing_tfds_data_dir(tmp_path, tfds_name):
    """Both 'no builder code for that version' and 'code but no prepared files' are clear."""
    seqio.TaskRegistry.remove("no_tfds")
    source = seqio.TfdsDataSource(tfds_name, tfds_data_dir=str(tmp_path / "tfds"))
    features = {"targets": seqio.Feature(seqio.ByteVocabulary())}
    seqio.TaskRegistry.add_provider("no_tfds", seqio.Task("no_tfds", source, features))
    with pytest.raises(InputDataNotFoundError) as e:
        make("no_tfds")
    message = str(e.value)
    assert str(tmp_path / "tfds") in message and "--tfds_data_dir=DIR" in message
    assert tfds_name.replace(":", "/") in message
    _assert_clean(e.value)


def test_vocabulary_larger_than_the_model(task):
    with pytest.raises(InputConfigError, match="has 259 ids but the model's vocabulary has 128"):
        make(task, model_vocab_size=128)
    make(task, model_vocab_size=259)


# ----- the LM preprocessors shared by the C4 and text tasks -----


def test_concat_and_split_preprocessors():
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": np.asarray(d, np.int32)} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    ds = seqio_tasks.reduce_concat_tokens(ds, batch_size=2)
    assert [x["targets"].tolist() for x in ds.as_numpy_iterator()] == [
        [5, 6, 7, 8],
        [9, 10, 11, 12, 13],
    ]
    features = {"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)}
    pieces = seqio_tasks.split_tokens_to_targets_length(ds, {"targets": 4}, features)
    assert [x["targets"].tolist() for x in pieces.as_numpy_iterator()] == [
        [5, 6, 7],
        [8],
        [9, 10, 11],
        [12, 13],
    ]


# ----- decoder inputs: prompt/target batches -----

QA = [(f"What is {i} plus {i}?", f"It is {2 * i}.") for i in range(11)]
QA_LENGTHS = {"inputs": 16, "targets": 8}  # Trims every question and the longer answers.
BYTES = seqio.ByteVocabulary()


def _exact_match(targets: list[str], predictions: list[str]) -> dict[str, float]:
    return {
        "exact_match": float(np.mean([t == p for t, p in zip(targets, predictions, strict=True)]))
    }


def _normalize(text: str, example=None, is_target: bool = False) -> str:
    """A postprocess_fn: case and surrounding space do not count."""
    del example, is_target
    return text.strip().lower()


@pytest.fixture(scope="module")
def qa_task(tmp_path_factory) -> str:
    """'qa_decode': prompt -> completion pairs ('inputs', 'targets'), in 2 files of 6 and 5."""
    root = tmp_path_factory.mktemp("qa")
    for f, pairs in enumerate((QA[:6], QA[6:])):
        (root / f"qa-{f}.tsv").write_text("".join(f"{q}\t{a}\n" for q, a in pairs))

    def to_features(ds):
        def split(line):
            question, answer = tf.strings.split(line, "\t")[0], tf.strings.split(line, "\t")[1]
            return {"inputs": question, "targets": answer}

        return ds.map(split)

    task = seqio.Task(
        "qa_decode",
        source=seqio.TextLineDataSource({"validation": str(root / "qa-*.tsv")}),
        preprocessors=[
            to_features,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features={
            "inputs": seqio.Feature(BYTES, add_eos=False),
            "targets": seqio.Feature(BYTES, add_eos=True),
        },
        postprocess_fn=_normalize,
        metric_fns=[_exact_match],
    )
    seqio.TaskRegistry.remove("qa_decode")
    seqio.TaskRegistry.add_provider("qa_decode", task)
    return "qa_decode"


def make_decode(task: str, **kwargs) -> SeqIOInput:
    kwargs.setdefault("decode_form", DecodeForm.INPUTS_TARGETS)
    kwargs.setdefault("task_feature_lengths", QA_LENGTHS)
    return make_eval(task, reset_for_eval=True, **kwargs)


def decode_rows(batches: list) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(prompt ids, target ids) of every real example (prefix_lengths > 0)."""
    rows = []
    for b in batches:
        for p, n, t, m in zip(
            b.prefix_ids, b.prefix_lengths, b.target_ids, b.target_lengths, strict=True
        ):
            if n:
                assert not p[n:].any() and not t[m:].any()  # Right-padded with 0.
                rows.append((tuple(p[:n].tolist()), tuple(t[:m].tolist())))
    return rows


def test_decode_form_inputs_targets_one_epoch_on_two_hosts(qa_task):
    """Prompts are BOS + 'inputs', targets 'targets' (+ EOS); every pair once over 2 hosts."""
    inputs = [make_decode(qa_task, num_infeed_hosts=2, infeed_host_index=h) for h in (0, 1)]
    assert inputs[0].shard_example_counts() == (6, 5)
    passes = [read_all(inp) for inp in inputs]
    assert len(passes[0]) == len(passes[1]) == 2  # ceil(6 / 4) on both hosts.
    for b in passes[0] + passes[1]:
        assert sorted(b) == ["prefix_ids", "prefix_lengths", "target_ids", "target_lengths"]
        assert b.prefix_ids.shape == (4, 17) and b.target_ids.shape == (4, 8)
        assert all(v.dtype == np.int32 for v in b.values())
    want = [((0, *BYTES.encode(q)[:16]), (*BYTES.encode(a)[:7], BYTES.eos_id)) for q, a in QA]
    got = decode_rows(passes[0]) + decode_rows(passes[1])
    assert collections.Counter(got) == collections.Counter(want)
    last = passes[1][-1]  # Host 1: 5 pairs, then 3 padding examples.
    assert last.prefix_lengths.tolist() == [17, 0, 0, 0]  # BOS + 16 question bytes.
    assert not last.prefix_ids[1:].any() and not last.target_ids[1:].any()


def test_decode_form_targets_prefix_splits_each_example(task):
    """LM task: prompt = BOS + first prompt_len tokens, target = the rest; short docs skipped."""
    n = 11
    inp = make_eval(task, reset_for_eval=True, decode_form=DecodeForm.TARGETS_PREFIX, prompt_len=n)
    batches = read_all(inp)
    docs = [BYTES.encode(d)[: T - 1] + [BYTES.eos_id] for d in _eval_docs()]
    want = [((0, *d[:n]), tuple(d[n:])) for d in docs if len(d) > n]
    assert 0 < len(want) < len(docs)  # Some docs have nothing after the prompt.
    assert collections.Counter(decode_rows(batches)) == collections.Counter(want)
    assert batches[0].prefix_ids.shape == (4, n + 1) and batches[0].target_ids.shape == (4, T - n)
    assert len(batches) == -(-len(want) // 4)


@pytest.mark.slow
def test_decode_metrics_are_the_tasks_on_postprocessed_texts(qa_task):
    """decode_lib scores decoded text with the task's predict metrics after its postprocess_fn."""
    inp = make_decode(qa_task, task_feature_lengths={"inputs": 32, "targets": 16})
    assert list(inp.predict_metric_fns) == [_exact_match]

    def shouting_oracle(params, batch, key, steps):
        """Decodes each target exactly, but in upper case: right only after postprocessing."""
        del params, key
        ids = batch.target_ids
        lower_case = (ids >= 3 + ord("a")) & (ids <= 3 + ord("z"))  # Byte b has id b + 3.
        upper = np.where(lower_case, ids - 32, ids)
        n = batch.target_ids.shape[1]
        assert steps == n
        return {
            "tokens": upper,
            "lengths": batch.target_lengths,
            "log_probs": np.zeros((len(upper), n), np.float32),
            "scores": np.zeros(len(upper), np.float32),
            **batch,
        }

    rows, metrics = decode_lib.run_decode_pass(
        shouting_oracle,
        None,
        inp,
        lambda b: NestedMap(b),
        DecoderParams(eos_token_id=1),
        step=0,
        keys=("prefix_ids", "prefix_lengths", "target_ids", "target_lengths"),
    )
    assert len(rows) == metrics["num_examples"] == len(QA)
    assert sorted(r["target"] for r in rows) == sorted(a for _, a in QA)
    assert all(r["decoded"] == r["target"].upper() != r["target"] for r in rows)
    assert metrics["exact_match"] == 1.0
    assert (
        _exact_match([r["target"] for r in rows], [r["decoded"] for r in rows])["exact_match"] == 0
    )


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(decode_form=DecodeForm.INPUTS_TARGETS), "needs an 'inputs' feature.*TARGETS_PREFIX"),
        (dict(decode_form=DecodeForm.TARGETS_PREFIX), "0 < prompt_len < .*got prompt_len=0"),
        (dict(decode_form=DecodeForm.TARGETS_PREFIX, prompt_len=T), "0 < prompt_len"),
        (dict(prompt_len=3), "applies to decode_form=DecodeForm.TARGETS_PREFIX only"),
        (
            dict(decode_form=DecodeForm.TARGETS_PREFIX, prompt_len=3, is_training=True),
            "cannot feed training",
        ),
    ],
)
def test_decode_form_settings_are_checked(task, settings, match):
    settings = {"is_training": False, "reset_for_eval": True, **settings}
    if settings["is_training"]:
        settings["reset_for_eval"] = False
    with pytest.raises(InputConfigError, match=match):
        make(task, split_name="validation", **settings)


def test_decode_form_reads_one_task(task):
    seqio.MixtureRegistry.remove("lines_mix_decode")
    seqio.MixtureRegistry.add("lines_mix_decode", [(task, 1.0)])
    with pytest.raises(InputConfigError, match="is a Mixture; list one decoder input per task"):
        make_eval(
            "lines_mix_decode",
            reset_for_eval=True,
            decode_form=DecodeForm.TARGETS_PREFIX,
            prompt_len=3,
        )


def test_prefix_lm_rows_are_bos_inputs_targets_with_loss_on_targets(qa_task):
    """prefix_lm: seqio's PrefixLMFeatureConverter; rows of inputs + targets (16 + 8) tokens."""
    inp = make_eval(qa_task, reset_for_eval=True, prefix_lm=True, task_feature_lengths=QA_LENGTHS)
    batches = read_all(inp)
    assert sorted(batches[0]) == ["ids", "labels", "paddings", "weights"]
    for i, (question, answer) in enumerate(QA):  # One host, unshuffled: file order.
        b, r = batches[i // 4], i % 4
        prompt, target = BYTES.encode(question)[:16], BYTES.encode(answer)[:7] + [BYTES.eos_id]
        labels = np.pad(prompt + target, (0, 24 - len(prompt) - len(target)))
        np.testing.assert_array_equal(b.labels[r], labels)
        np.testing.assert_array_equal(b.ids[r, : len(prompt) + len(target)], [0, *labels[:-1]])
        weights = [0] * len(prompt) + [1] * len(target)
        np.testing.assert_array_equal(b.weights[r], np.pad(weights, (0, 24 - len(weights))))
    assert not batches[-1].weights[len(QA) % 4 :].any()  # Padding examples.


@pytest.mark.slow
def test_prefix_lm_one_epoch_eval_on_two_hosts(qa_task):
    """Packed rows of 4 + 20 tokens hold one pair each (4 + 9 or 10 tokens): 6 and 5 rows."""
    inputs = [
        make_eval(
            qa_task,
            reset_for_eval=True,
            prefix_lm=True,
            feature_converter_pack=True,
            task_feature_lengths={"inputs": 4, "targets": 20},
            num_infeed_hosts=2,
            infeed_host_index=h,
        )
        for h in (0, 1)
    ]
    assert inputs[0].shard_example_counts() == (6, 5)
    passes = [read_all(inp) for inp in inputs]
    assert len(passes[0]) == len(passes[1]) == 2  # ceil(6 / 4) on both hosts.
    answers = real_docs(inputs[0], passes[0]) + real_docs(inputs[1], passes[1])
    assert sorted(a[4:] for a in answers) == sorted(a for _, a in QA)  # After 4 prompt bytes.
    for b in passes[0] + passes[1]:
        assert b.ids.shape == b.segment_ids.shape == (4, 24)


@pytest.mark.parametrize(
    "task_name, settings, match",
    [
        ("task", dict(prefix_lm=True), "task 'lines_lm' has only \\['targets'\\]"),
        ("qa_task", dict(prefix_lm=True, task_feature_lengths={"targets": 8}), "positive 'inputs'"),
        (
            "qa_task",
            dict(prefix_lm=True, decode_form=DecodeForm.INPUTS_TARGETS, reset_for_eval=True),
            "Set prefix_lm=False",
        ),
        ("qa_task", dict(), "has an 'inputs' length.*set prefix_lm=True"),
    ],
    ids=["no-inputs-feature", "no-inputs-length", "decoder-input", "inputs-without-prefix-lm"],
)
def test_prefix_lm_settings_are_checked(request, task_name, settings, match):
    settings = {"task_feature_lengths": {"inputs": 4, "targets": 8}, **settings}
    with pytest.raises(InputConfigError, match=match):
        make_eval(request.getfixturevalue(task_name), **settings)
