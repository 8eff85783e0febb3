"""SyntheticSeq2SeqInput: reversed and sorted sequences, host split, decode batches, eval."""

import numpy as np
import pytest

from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.synthetic_input import Seq2SeqTask, SyntheticSeq2SeqInput


def sequences(tokens: np.ndarray) -> list[list[int]]:
    """Each row's tokens before its EOS (1), checking the EOS and the padding after it."""
    out = []
    for row in tokens:
        n = row.tolist().index(1)
        assert (row[:n] >= 2).all() and not row[n + 1 :].any()
        out.append(row[:n].tolist())
    return out


@pytest.mark.parametrize("task", ["reverse", "sort"])
def test_targets_are_the_transformed_inputs(task):
    inp = SyntheticSeq2SeqInput(batch_size=16, vocab_size=12, min_len=2, max_len=7, task=task)
    assert inp.task is Seq2SeqTask(task)
    b = inp.get_next()
    assert sorted(b) == [
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_target_tokens",
        "encoder_input_tokens",
    ]
    for key, value in b.items():
        dtype = np.float32 if key == "decoder_loss_weights" else np.int32
        assert value.shape == (16, 8) and value.dtype == dtype, key
    sources, targets = sequences(b.encoder_input_tokens), sequences(b.decoder_target_tokens)
    assert {len(s) for s in sources} <= set(range(2, 8)) and len({len(s) for s in sources}) > 1
    assert max(max(s) for s in sources) < 12
    transform = (lambda s: s[::-1]) if task == "reverse" else sorted
    assert targets == [transform(s) for s in sources]
    shifted = np.pad(b.decoder_target_tokens[:, :-1], ((0, 0), (1, 0)))
    np.testing.assert_array_equal(b.decoder_input_tokens, shifted)
    np.testing.assert_array_equal(b.decoder_loss_weights, b.decoder_target_tokens != 0)


def test_feature_lengths_pad_the_same_examples_to_other_shapes():
    """A stand-in for a real task's row shapes (inputs 12, targets 6): the rows are the
    unpadded input's, padded with zeros."""
    plain = SyntheticSeq2SeqInput(batch_size=4, max_len=4, seed=1).get_next()
    padded = SyntheticSeq2SeqInput(batch_size=4, max_len=4, seed=1, feature_lengths=(12, 6))
    batch = padded.get_next()
    assert batch.encoder_input_tokens.shape == (4, 12)
    for key in ("decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights"):
        assert batch[key].shape == (4, 6), key
    for key, value in plain.items():
        np.testing.assert_array_equal(batch[key][:, :5], value, err_msg=key)
        assert not batch[key][:, 5:].any(), key


def test_two_hosts_split_the_one_host_global_batch():
    one = SyntheticSeq2SeqInput(batch_size=8, seed=3).get_next()
    halves = [
        SyntheticSeq2SeqInput(batch_size=4, seed=3, num_infeed_hosts=2, infeed_host_index=h)
        for h in (0, 1)
    ]
    batches = [h.get_next() for h in halves]
    for key in one:
        np.testing.assert_array_equal(np.concatenate([b[key] for b in batches]), one[key])
    assert not np.array_equal(batches[0].encoder_input_tokens, batches[1].encoder_input_tokens)


def test_decode_batches_are_the_training_examples():
    common = dict(batch_size=6, seed=5, max_len=5, task="sort")
    train = SyntheticSeq2SeqInput(**common).get_next()
    inp = SyntheticSeq2SeqInput(
        **common, decode=True, is_training=False, reset_for_eval=True, num_batches=1
    )
    b = inp.get_next()
    assert sorted(b) == ["input_ids", "input_lengths", "target_ids", "target_lengths"]
    assert all(v.dtype == np.int32 for v in b.values())
    np.testing.assert_array_equal(b.input_ids, train.encoder_input_tokens)
    np.testing.assert_array_equal(b.target_ids, train.decoder_target_tokens)
    np.testing.assert_array_equal(b.input_lengths, (b.input_ids != 0).sum(axis=1))
    np.testing.assert_array_equal(b.target_lengths, b.input_lengths)  # Both with EOS.
    targets = inp.ids_to_strings(b.target_ids, b.target_lengths.tolist())
    assert targets == [" ".join(map(str, s)) for s in sequences(b.target_ids)]
    assert inp.ids_to_strings(b.target_ids) == targets  # The text ends at the EOS.
    (metric,) = inp.predict_metric_fns
    wrong = targets[:-1] + [targets[-1] + " 2"]
    assert metric(targets, targets)["exact_match"] == 1.0
    assert metric(targets, wrong)["exact_match"] == pytest.approx(5 / 6)
    with pytest.raises(StopIteration):
        inp.get_next()
    assert SyntheticSeq2SeqInput(batch_size=2).predict_metric_fns == ()


def test_ids_to_strings_keeps_decoded_padding():
    inp = SyntheticSeq2SeqInput(batch_size=1)
    ids = np.array([[5, 0, 4, 1, 3], [7, 8, 0, 0, 0]])
    assert inp.ids_to_strings(ids) == ["5 0 4", "7 8 0 0 0"]
    assert inp.ids_to_strings(ids, [2, 2]) == ["5 0", "7 8"]


def test_determinism_resume_and_one_epoch_eval():
    def first(n, **kwargs):
        inp = SyntheticSeq2SeqInput(batch_size=2, **kwargs)
        return [inp.get_next().encoder_input_tokens for _ in range(n)], inp

    batches, inp = first(4)
    again, _ = first(4)
    other_seed, _ = first(4, seed=1)
    for a, b, c in zip(batches, again, other_seed, strict=True):
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, c)
    resumed = SyntheticSeq2SeqInput(batch_size=2)
    resumed.set_state(first(2)[1].get_state())
    np.testing.assert_array_equal(resumed.get_next().encoder_input_tokens, batches[2])
    evaluation = SyntheticSeq2SeqInput(
        batch_size=2, is_training=False, reset_for_eval=True, num_batches=2
    )
    assert len([evaluation.get_next() for _ in range(2)]) == 2
    with pytest.raises(StopIteration):
        evaluation.get_next()
    evaluation.reset()
    np.testing.assert_array_equal(evaluation.get_next().encoder_input_tokens, batches[0])


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(task="rotate"), "task='rotate' is unknown; set one of \\['reverse', 'sort'\\]"),
        (dict(vocab_size=2), "set vocab_size >= 3"),
        (dict(min_len=0), "1 <= min_len <= max_len"),
        (dict(min_len=5, max_len=4), "1 <= min_len <= max_len"),
        (dict(decode=True), "cannot feed training; set is_training=False"),
        (dict(max_len=4, feature_lengths=(8, 4)), "must each exceed max_len=4"),
        (dict(is_training=False, reset_for_eval=True), "needs a finite input; set num_batches"),
    ],
)
def test_settings_are_checked(settings, match):
    with pytest.raises(InputConfigError, match=match):
        SyntheticSeq2SeqInput(batch_size=2, **settings)
