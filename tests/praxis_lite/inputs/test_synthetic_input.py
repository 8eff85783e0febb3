"""SyntheticLmInput: host sharding, determinism, resume, eval semantics."""

import numpy as np
import pytest

from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.synthetic_input import SyntheticLmInput


def test_two_hosts_split_the_one_host_global_batch():
    one = SyntheticLmInput(batch_size=8, seq_len=6).get_next()
    halves = [
        SyntheticLmInput(
            batch_size=4, seq_len=6, num_infeed_hosts=2, infeed_host_index=h
        ).get_next()
        for h in (0, 1)
    ]
    np.testing.assert_array_equal(np.concatenate([h.ids for h in halves]), one.ids)
    assert not np.array_equal(halves[0].ids, halves[1].ids)


def test_progressions_and_labels_are_next_tokens():
    batch = SyntheticLmInput(batch_size=4, seq_len=8, vocab_size=50).get_next()
    np.testing.assert_array_equal(batch.ids[:, 1:], batch.labels[:, :-1])
    diffs = (batch.ids[:, 1:] - batch.ids[:, :-1]) % 50
    assert all(len(set(row)) == 1 and row[0] in (1, 2, 3) for row in diffs)


def test_resume_continues_with_the_same_batches():
    straight = SyntheticLmInput(batch_size=2, seq_len=4)
    expected = [straight.get_next().ids for _ in range(5)]
    first = SyntheticLmInput(batch_size=2, seq_len=4)
    for _ in range(2):
        first.get_next()
    resumed = SyntheticLmInput(batch_size=2, seq_len=4)
    resumed.set_state(first.get_state())
    for want in expected[2:]:
        np.testing.assert_array_equal(resumed.get_next().ids, want)


def test_eval_semantics_table():
    one_epoch = SyntheticLmInput(
        batch_size=2, seq_len=4, is_training=False, reset_for_eval=True, num_batches=3
    )
    assert not one_epoch.repeats
    assert len([one_epoch.get_next() for _ in range(3)]) == 3
    with pytest.raises(StopIteration):
        one_epoch.get_next()
    rolling = SyntheticLmInput(batch_size=2, seq_len=4, is_training=False, num_batches=2)
    assert rolling.repeats
    assert len([rolling.get_next() for _ in range(5)]) == 5
    first_batches = SyntheticLmInput(  # T5X's training eval: the first N, each pass.
        batch_size=2, is_training=False, reset_for_eval=True, repeat=True, num_batches=2
    )
    assert len([first_batches.get_next() for _ in range(5)]) == 5
    with pytest.raises(InputConfigError, match="needs a repeating input"):
        SyntheticLmInput(batch_size=2, is_training=False, repeat=False)
    with pytest.raises(ValueError, match="needs a finite input"):
        SyntheticLmInput(batch_size=2, is_training=False, reset_for_eval=True)


def test_ids_to_strings():
    inp = SyntheticLmInput(batch_size=1, seq_len=3)
    assert inp.ids_to_strings(np.array([[5, 6, 7]]), [2]) == ["5 6"]


def test_decode_batches_are_prompts_and_their_continuations():
    from praxis_lite.inputs.synthetic_input import continuation_metrics

    inp = SyntheticLmInput(
        batch_size=64,
        seq_len=12,
        vocab_size=50,
        prompt_len=6,
        min_prompt_len=2,
        is_training=False,
        reset_for_eval=True,
        num_batches=1,
    )
    batch = inp.get_next()
    assert batch.prefix_ids.shape == (64, 6) and batch.target_ids.shape == (64, 6)
    assert set(batch.prefix_lengths.tolist()) == {2, 3, 4, 5, 6}
    for prefix, n, target in zip(
        batch.prefix_ids, batch.prefix_lengths, batch.target_ids, strict=True
    ):
        assert not prefix[n:].any()
        seq = np.concatenate([prefix[:n], target])
        assert len(set(np.diff(seq) % 50)) == 1  # one progression: prompt, then target
    with pytest.raises(StopIteration):
        inp.get_next()
    assert continuation_metrics in inp.predict_metric_fns
    targets = inp.ids_to_strings(batch.target_ids[:2])
    three_right = " ".join(targets[1].split()[:3])  # a prediction that stops early
    assert continuation_metrics(targets, [targets[0], three_right]) == {
        "exact_match": 0.5,
        "token_accuracy": (6 + 3) / 12,
    }
    with pytest.raises(ValueError, match="min_prompt_len"):
        SyntheticLmInput(batch_size=2, seq_len=8, prompt_len=8)
