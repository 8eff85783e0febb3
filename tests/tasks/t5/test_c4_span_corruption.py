"""T5's C4 span-corruption task end to end without a download: a tiny prepared TFDS
``c4/en:3.0.1`` written by the test, a SentencePiece model (+ 100 extra ids) trained in it."""

from __future__ import annotations

import numpy as np
import pytest
import seqio

from praxis_lite.inputs import span_corruption
from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.seqio_input import SeqIOInput
from praxis_lite.py_utils import NestedMap
from tasks.t5 import c4_span_corruption as c4sc
from tests.praxis_lite.inputs.test_seqio_input import read_all, train_spm
from tests.praxis_lite.inputs.test_span_corruption import uncorrupt
from tests.tasks.lm.test_c4 import write_prepared_c4

WORDS = "the of and to in is was for on are with as by at from this have one had not".split()
LENGTHS = {"inputs": 32, "targets": 8}  # Pieces of 34 tokens (random_spans_helper).


def _docs(split: str, n: int = 30) -> list[str]:
    rng = np.random.default_rng(len(split))
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 30))) + f" {i}." for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A prepared TFDS dir holding c4/en/3.0.1 (one file a split) and an SPM model."""
    root = tmp_path_factory.mktemp("c4sc")
    write_prepared_c4(root / "tfds", {split: [_docs(split)] for split in ("train", "validation")})
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(_docs("train") + _docs("validation")))
    vocab = train_spm(corpus, root / "spm", 100)
    seqio.set_tfds_data_dir_override(str(root / "tfds"))
    yield NestedMap(vocab=vocab)
    seqio.set_tfds_data_dir_override(None)


def test_eval_epoch_reconstructs_the_documents(data):
    """Inputs with sentinels + targets give back every validation token, in order."""
    task = c4sc.register_c4_span_corruption_task("c4sc_test", vocab_path=data.vocab)
    vocab = task.output_features["targets"].vocabulary
    assert vocab.extra_ids == 100 and vocab is task.output_features["inputs"].vocabulary
    inp = SeqIOInput(
        mixture_name="c4sc_test", task_feature_lengths=LENGTHS, encoder_decoder=True,
        split_name="validation", is_training=False, reset_for_eval=True, batch_size=4,
        model_vocab_size=vocab.vocab_size,
    )  # fmt: skip
    stream, rows = [], 0
    for b in read_all(inp):
        for enc, dec, w in zip(
            b.encoder_input_tokens, b.decoder_target_tokens, b.decoder_loss_weights, strict=True
        ):
            if not w.any():
                continue  # A padding example of the last batch.
            inputs, targets = enc[enc > 0], dec[dec > 0]
            assert inputs[-1] == targets[-1] == vocab.eos_id
            assert targets[0] == span_corruption.sentinel_id(vocab, 0)  # <extra_id_0>
            assert (inputs >= vocab.vocab_size - 100).any()  # Sentinels in every input.
            stream += uncorrupt(inputs[:-1], targets[:-1], vocab.vocab_size, 100)
            rows += len(inputs) == LENGTHS["inputs"] and len(targets) == LENGTHS["targets"]
    expected = [t for doc in _docs("validation") for t in vocab.encode(doc)]
    assert stream == expected
    assert rows == len(expected) // 34  # Every full piece fills both lengths exactly.
    assert "<extra_id_0>" in vocab.decode([int(span_corruption.sentinel_id(vocab, 0))])


@pytest.mark.slow
def test_packed_training_batches(data):
    c4sc.register_c4_span_corruption_task("c4sc_train", vocab_path=data.vocab)
    inp = SeqIOInput(
        mixture_name="c4sc_train", task_feature_lengths=LENGTHS, encoder_decoder=True,
        feature_converter_pack=True, batch_size=2, seed=3, shuffle_buffer_size=64,
    )  # fmt: skip
    b = inp.get_next()
    assert b.encoder_input_tokens.shape == (2, 32) and b.decoder_target_tokens.shape == (2, 8)
    assert (b.encoder_segment_ids.max(axis=1) >= 1).all()
    assert (b.encoder_input_tokens >= 100).any()  # Sentinels (ids past the SPM's 100 pieces).


def test_short_targets_length_is_refused(data):
    c4sc.register_c4_span_corruption_task("c4sc_short", vocab_path=data.vocab)
    with pytest.raises(InputConfigError, match="at least 8"):
        SeqIOInput(
            mixture_name="c4sc_short", task_feature_lengths={"inputs": 32, "targets": 6},
            encoder_decoder=True, batch_size=2,
        )  # fmt: skip


def test_registration_is_lazy_idempotent_and_t5s():
    task = c4sc.register_c4_span_corruption_task(vocab_path="/nowhere/spm.model")
    assert task.name == "c4_v220_span_corruption"
    assert c4sc.register_c4_span_corruption_task(vocab_path="/nowhere/spm.model") is task
    assert task.source.tfds_dataset.name == "c4/en:3.0.1"
    assert all(f.add_eos for f in task.output_features.values())
    assert task.output_features["inputs"].vocabulary.extra_ids == c4sc.T5_EXTRA_IDS == 100
    other = c4sc.register_c4_span_corruption_task(tfds_name=c4sc.T5_C4_TFDS_NAME)
    assert other is not task and other.source.tfds_dataset.name == "c4/en:2.2.0"
    assert other.output_features["targets"].vocabulary == seqio.SentencePieceVocabulary(
        "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model", extra_ids=100
    )
