"""SeqIOInput over a Hugging Face tokenizer whose id 0 is a real token ("!", as in GPT-2,
Llama 3 and Qwen): weights and paddings from lengths, not ``id == 0``; BOS (or EOS) first."""

from __future__ import annotations

import numpy as np
import pytest
import seqio
import tensorflow as tf

from praxis_lite.inputs import seqio_tasks
from praxis_lite.inputs.base_input import InputDataError
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from tests.praxis_lite.inputs.test_seqio_input import read_all
from tests.praxis_lite.tokenizers.test_hf_tokenizer import write_bpe_dir

T = 16
DOCS = ["wow!!", "! hi !", "Hello world!", "no bang here", "!", "the cat sat on the mat!"]
QA = [("wow!", "!!"), ("hi", "! ok"), ("!", "the mat!")]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> seqio_tasks.HfVocabulary:
    return seqio_tasks.make_vocabulary(write_bpe_dir(tmp_path_factory.mktemp("bpe")))


def _register(name: str, source: seqio.DataSource, preprocessors: list, features: dict) -> str:
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name, source=source, preprocessors=preprocessors, output_features=features
    )
    return name


@pytest.fixture(scope="module")
def docs_task(vocab, tmp_path_factory) -> str:
    """One example per line: its tokens, then EOS."""
    path = tmp_path_factory.mktemp("docs") / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n")
    return _register(
        "hf_docs",
        seqio.TextLineDataSource({"train": str(path)}),
        [
            lambda ds: ds.map(lambda line: {"targets": line}),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        {"targets": seqio.Feature(vocab, add_eos=True)},
    )


def _one_epoch(task: str, **kwargs) -> list:
    lengths = kwargs.pop("task_feature_lengths", {"targets": T})
    return read_all(
        SeqIOInput(
            mixture_name=task,
            batch_size=4,
            task_feature_lengths=lengths,
            is_training=False,
            reset_for_eval=True,
            shuffle=False,
            **kwargs,
        )
    )


def _expected(vocab) -> list[list[int]]:
    return [vocab.encode(doc) + [vocab.eos_id] for doc in DOCS]


@pytest.mark.parametrize("pack", [False, True], ids=["unpacked", "packed"])
def test_id_0_is_a_weighted_token_and_sequences_start_with_bos(vocab, docs_task, pack):
    expected = _expected(vocab)
    assert sum(ids.count(0) for ids in expected) == 5  # Lone "!" ("!!" is a token).
    segments = []
    for b in _one_epoch(docs_task, feature_converter_pack=pack):
        np.testing.assert_array_equal(b.paddings, 1.0 - b.weights)
        seg = b.segment_ids if pack else (b.weights > 0).astype(np.int32)
        for row in range(len(seg)):
            for s in sorted(set(seg[row]) - {0}):
                where = np.flatnonzero(seg[row] == s)
                assert (b.weights[row, where] == 1).all()
                labels = b.labels[row, where].tolist()
                assert b.ids[row, where].tolist() == [vocab.bos_id, *labels[:-1]]  # BOS first.
                segments.append(labels)
    assert sorted(segments) == sorted(expected)  # With their 0s, each once.


def test_prefix_lm_weights_the_target_zeros(vocab, tmp_path):
    path = tmp_path / "qa.tsv"
    path.write_text("".join(f"{q}\t{a}\n" for q, a in QA))
    features = {k: seqio.Feature(vocab, add_eos=k == "targets") for k in ("inputs", "targets")}

    def split(line):
        question, answer = tf.strings.split(line, "\t")[0], tf.strings.split(line, "\t")[1]
        return {"inputs": question, "targets": answer}

    qa_task = _register(
        "hf_qa",
        seqio.TextLineDataSource({"validation": str(path)}),
        [
            lambda ds: ds.map(split),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        features,
    )
    (b,) = _one_epoch(
        qa_task,
        split_name="validation",
        prefix_lm=True,
        task_feature_lengths={"inputs": 6, "targets": 6},
    )
    for row, (question, answer) in enumerate(QA):
        prompt, target = vocab.encode(question), vocab.encode(answer) + [vocab.eos_id]
        n = len(prompt) + len(target)
        assert b.labels[row, :n].tolist() == prompt + target
        assert b.ids[row, :n].tolist() == [vocab.bos_id, *(prompt + target)[:-1]]
        assert b.weights[row].tolist() == [0] * len(prompt) + [1] * len(target) + [0] * (12 - n)
        assert b.paddings[row].tolist() == [0] * n + [1] * (12 - n)


def test_lm_preprocessors_keep_id_0(vocab):
    ds = tf.data.Dataset.from_tensor_slices({"text": DOCS})
    features = {"targets": seqio.Feature(vocab, add_eos=True)}
    for fn in seqio_tasks.lm_preprocessors("text", concat_batch_size=4):
        ds = seqio.utils.add_kwargs_to_transform(
            fn, sequence_length={"targets": 9}, output_features=features
        )(ds)
    pieces = [x["targets"].tolist() for x in ds.as_numpy_iterator()]
    stream = [t for ids in _expected(vocab) for t in ids[:-1]]  # Concatenated, no EOS.
    assert [t for p in pieces for t in p[:-1]] == stream
    assert all(p[-1] == vocab.eos_id and len(p) <= 9 for p in pieces)


def test_decoder_prompts_start_with_bos_and_keep_id_0(vocab, docs_task):
    (b,) = _one_epoch(docs_task, decode_form=DecodeForm.TARGETS_PREFIX, prompt_len=2)[:1]
    first = vocab.encode(DOCS[0]) + [vocab.eos_id]  # "wow!!": [wow, !!, EOS]
    assert b.prefix_ids[0, : b.prefix_lengths[0]].tolist() == [vocab.bos_id, *first[:2]]
    inp = SeqIOInput(mixture_name=docs_task, batch_size=1, task_feature_lengths={"targets": T})
    ids = np.asarray([vocab.encode("! hi !") + [0, 0]])
    assert inp.ids_to_strings(ids, [len(ids[0]) - 2]) == ["! hi !"]


def test_start_id_without_bos_is_eos(tmp_path):
    vocab = seqio_tasks.make_vocabulary(write_bpe_dir(tmp_path, bos=False))
    assert vocab.bos_id is None and vocab.start_id == vocab.eos_id
    assert not seqio_tasks.zero_is_padding(vocab)
    assert vocab == seqio_tasks.make_vocabulary(str(tmp_path))
    assert vocab.vocab_size == vocab.tokenizer.vocab_size
    ids = vocab.encode("wow!") + [vocab.eos_id, 5]
    assert vocab.decode(ids) == "wow!"  # Stops at EOS.
    assert vocab.decode_tf(tf.constant([ids, ids])).numpy().tolist() == [b"wow!", b"wow!"]


def test_a_directory_without_a_tokenizer_is_a_data_error(tmp_path):
    with pytest.raises(InputDataError, match="has no tokenizer.json or tokenizer.model"):
        seqio_tasks.make_vocabulary(str(tmp_path)).encode("hi")
