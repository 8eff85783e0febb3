"""T5's span corruption against a numpy reference of T5's algorithm (t5/data/preprocessors.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from praxis_lite.inputs import span_corruption as sc
from praxis_lite.inputs.base_input import InputConfigError

VOCAB = seqio.ByteVocabulary(extra_ids=100)  # 359 ids: pad, EOS, UNK, 256 bytes, 100 extra.
SEEDS = [(1, 2), (3, 4)]


# ----- the numpy reference -----


def np_unique_sentinel(tokens, noise_mask, vocab_size: int) -> list[int]:
    """T5's noise_span_to_unique_sentinel: each run of noise -> the next sentinel, down
    from vocab_size - 1."""
    out, sentinel, prev = [], vocab_size - 1, False
    for token, noise in zip(tokens, noise_mask, strict=True):
        if noise and not prev:
            out.append(sentinel)
            sentinel -= 1
        elif not noise:
            out.append(int(token))
        prev = noise
    return out


def np_noise_counts(length: int, density: float, mean_span: float) -> tuple[int, int]:
    """T5's counts (float32, as its TF ops): (noise tokens, noise spans) of max(length, 2)."""
    length = max(length, 2)
    noise = int(np.round(np.float32(length) * np.float32(density)))
    noise = min(max(noise, 1), length - 1)
    return noise, max(1, int(np.round(np.float32(noise) / np.float32(mean_span))))


def runs(mask) -> list[tuple[bool, int]]:
    """(value, length) of each run of equal values."""
    return [(bool(v), len(list(g))) for v, g in itertools.groupby(mask)]


def uncorrupt(inputs, targets, vocab_size: int, extra_ids: int) -> list[int]:
    """The piece back: each sentinel of ``inputs`` -> the ``targets`` tokens after it (no EOS)."""

    def is_sentinel(t):
        return vocab_size - extra_ids <= t < vocab_size

    fills: dict[int, list[int]] = {}
    for t in targets:
        if is_sentinel(t):
            current = fills[int(t)] = []
        else:
            current.append(int(t))
    return [x for t in inputs for x in (fills[int(t)] if is_sentinel(t) else [int(t)])]


# ----- the pieces -----


@pytest.mark.parametrize(
    "mask",
    [
        "0010011101",
        "1100000111",
        "0000000000",
        "1111111111",
        "0101010101",
        "1",
        "0",
    ],
)
def test_sentinels_match_numpy(mask):
    noise = np.array([c == "1" for c in mask])
    tokens = np.arange(10, 10 + len(mask), dtype=np.int32)
    inputs = sc.noise_span_to_unique_sentinel(tf.constant(tokens), tf.constant(noise), VOCAB)
    targets = sc.nonnoise_span_to_unique_sentinel(tf.constant(tokens), tf.constant(noise), VOCAB)
    assert inputs.numpy().tolist() == np_unique_sentinel(tokens, noise, VOCAB.vocab_size)
    assert targets.numpy().tolist() == np_unique_sentinel(tokens, ~noise, VOCAB.vocab_size)
    assert inputs.dtype == targets.dtype == tf.int32
    assert sc.sentinel_id(VOCAB, 0) == 358 and sc.sentinel_id(VOCAB, 99) == 259  # <extra_id_99>


@pytest.mark.parametrize("density,mean_span", [(0.15, 3.0), (0.3, 2.0), (0.5, 5.0)])
def test_noise_mask_counts_and_alternation(density, mean_span):
    for length in (1, 2, 3, 10, 37, 100, 568):
        mask = sc.random_spans_noise_mask(length, density, SEEDS, mean_span).numpy()
        assert mask.shape == (length,) and mask.dtype == bool
        if length == 1:  # Masked as 2 tokens (non-noise, noise) and cut back.
            assert not mask.any()
            continue
        noise, spans = np_noise_counts(length, density, mean_span)
        assert mask.sum() == noise, (length, density)
        r = runs(mask)
        assert [v for v, _ in r] == [False, True] * spans, (length, density)


def test_noise_mask_is_seeded():
    masks = [sc.random_spans_noise_mask(200, 0.15, seeds).numpy() for seeds in (SEEDS, SEEDS)]
    np.testing.assert_array_equal(*masks)
    other = sc.random_spans_noise_mask(200, 0.15, [(5, 6), (7, 8)]).numpy()
    assert other.sum() == masks[0].sum() and (other != masks[0]).any()
    assert not sc.random_spans_noise_mask(50, 0.0, SEEDS).numpy().any()


def test_random_spans_helper_is_t5s():
    assert sc.random_spans_helper(512, 0.15, 3.0) == (568, 114)  # T5's documented lengths.
    assert sc.random_spans_helper(32) == (34, 8)
    # A piece of that length noised: exactly the inputs and targets lengths with an EOS.
    tokens = tf.range(3, 3 + 568)
    mask = sc.random_spans_noise_mask(568, 0.15, SEEDS, 3.0)
    assert sc.noise_span_to_unique_sentinel(tokens, mask, VOCAB).shape[0] + 1 == 512
    assert sc.nonnoise_span_to_unique_sentinel(tokens, mask, VOCAB).shape[0] + 1 == 114


def test_select_random_chunk_keeps_an_aligned_chunk():
    ds = tf.data.Dataset.from_tensors({"targets": tf.range(250), "other": tf.constant(1)})
    ds = ds.concatenate(tf.data.Dataset.from_tensors({"targets": tf.range(0), "other": 1}))
    with seqio.map_seed_manager(0):  # Each repeat draws its own seed.
        chunks = list(sc.select_random_chunk(ds.repeat(12), max_length=100).as_numpy_iterator())
    assert len(chunks) == 12 and all(list(x) == ["targets"] for x in chunks)  # Empty dropped.
    starts = {int(x["targets"][0]) for x in chunks}
    for x in chunks:
        np.testing.assert_array_equal(x["targets"], np.arange(250)[x["targets"][0] :][:100])
    assert starts == {0, 100, 200}


# ----- the preprocessor -----

LENGTHS = {"inputs": 512, "targets": 114}
FEATURES = {key: seqio.Feature(VOCAB) for key in ("inputs", "targets")}


def _docs(sizes) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(3, 259, size=n).astype(np.int32) for n in sizes]


def _corrupt(docs, seed: int, lengths=LENGTHS, features=FEATURES) -> list[dict]:
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": d} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    with seqio.map_seed_manager(seed):
        ds = sc.span_corruption(ds, lengths, features)
        ds = seqio.preprocessors.append_eos_after_trim(ds, features, lengths)
    return list(ds.as_numpy_iterator())


def test_span_corruption_fills_inputs_and_reconstructs():
    docs = _docs([300, 500, 0, 1300])  # 2100 tokens: pieces of 568, 568, 568, 396.
    examples = _corrupt(docs, seed=7)
    lengths = [(len(ex["inputs"]), len(ex["targets"])) for ex in examples]
    assert lengths[:3] == [(512, 114)] * 3 and lengths[3][0] < 512
    pieces = []
    for ex in examples:
        assert ex["inputs"][-1] == ex["targets"][-1] == VOCAB.eos_id
        inputs, targets = ex["inputs"][:-1], ex["targets"][:-1]
        sentinels = [t for t in targets if t >= 259]
        assert sentinels == list(range(358, 358 - len(sentinels), -1))  # Down from the end.
        assert [t for t in inputs if t >= 259] == sentinels and targets[0] == 358
        pieces += uncorrupt(inputs, targets, VOCAB.vocab_size, 100)
    assert pieces == np.concatenate(docs).tolist()
    again = _corrupt(docs, seed=7)
    assert all((a["inputs"] == b["inputs"]).all() for a, b in zip(examples, again, strict=True))
    other = _corrupt(docs, seed=8)
    assert any((a["inputs"] != b["inputs"]).any() for a, b in zip(examples, other, strict=True))


def test_span_corruption_refuses_short_targets_and_few_sentinels():
    docs = _docs([100])
    with pytest.raises(InputConfigError, match="at least 114"):
        _corrupt(docs, 0, lengths={"inputs": 512, "targets": 100})
    few = {key: seqio.Feature(seqio.ByteVocabulary(extra_ids=10)) for key in FEATURES}
    with pytest.raises(InputConfigError, match="28 sentinels.*10 extra ids"):
        _corrupt(docs, 0, features=few)
    with pytest.raises(InputConfigError, match="'inputs' and 'targets'"):
        _corrupt(docs, 0, lengths={"targets": 114})
