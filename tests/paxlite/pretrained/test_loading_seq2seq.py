"""paxlite.pretrained.loading.from_pretrained, encoder-decoder job: the seq2seq model it returns,
its teacher-forced logits against the checkpoint's own weights applied here, greedy
generation against the argmax chain of those logits (stopping at the EOS, pad after),
1 and 3 inputs on the 8-device mesh, the encoder's outputs, and one-line errors.

One in-process run of T5Tiny (20 steps on the 8-device data mesh) and one loaded model are
shared by the tests of this module; every test uses the same batch shapes (inputs of 4
tokens, 6 new tokens), so that each program compiles once.
"""

import numpy as np
import pytest

from paxlite.pretrained.loading import PretrainedSeq2Seq, from_pretrained
from praxis_lite.py_utils import NestedMap
from tests.paxlite.test_main import restore_params, run_main_in_process

STEPS = 20
EOS, PAD = 1, 0  # SyntheticSeq2SeqInput's EOS; T5Tiny decodes with pad 0.
# Inputs of different lengths (each ending with its EOS), right-padded to 4 tokens.
ROWS = [[5, 6, 7, EOS], [9, 3, EOS], [2, 2, 8, EOS]]
N = 6


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("seq2seq") / "job"
    code, out, err = run_main_in_process(
        f"--job_log_dir={job_dir}",
        "--mode=train",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=2",
        f"--set=NUM_TRAIN_STEPS={STEPS}",
        f"--set=CHECKPOINT_EVERY_N_STEPS={STEPS}",
        f"--set=SUMMARY_INTERVAL_STEPS={STEPS}",
        "--set=EVAL_INTERVAL_STEPS=0",
        exp="tasks.t5.tiny.T5Tiny",
    )
    assert code == 0, out + err
    return job_dir


@pytest.fixture(scope="module")
def s2s(job):
    return from_pretrained(job)  # The experiment and its mesh from the job's config files.


def _decoder_ids(targets: np.ndarray) -> np.ndarray:
    """``targets [B, N]`` shifted right after the decoder start id 0: ``[B, N + 1]``."""
    return np.concatenate([np.zeros((len(targets), 1), targets.dtype), targets], axis=1)


@pytest.mark.slow
def test_a_job_loads_as_seq2seq_with_the_logits_of_its_checkpoint(job, s2s):
    import jax

    assert isinstance(s2s, PretrainedSeq2Seq)
    assert jax.tree_util.tree_leaves(s2s.params)[0].sharding.mesh.devices.size == 8
    targets = np.array([[7, 6, 5, EOS, 0, 0], [3, 9, EOS, 0, 0, 0], [8, 2, 2, EOS, 0, 0]])
    logits = s2s.logits(ROWS, decoder_input_ids=_decoder_ids(targets))
    assert logits.shape == (3, N + 1, 32) and logits.dtype == np.float32
    # The step's weights read by the trainer's checkpointer, applied here on one device.
    inputs = np.array([[5, 6, 7, EOS], [9, 3, EOS, 0], [2, 2, 8, EOS]])
    batch = NestedMap(encoder_input_tokens=inputs, decoder_input_tokens=_decoder_ids(targets))
    apply = jax.jit(lambda params, b: s2s.model.apply({"params": params}, b, method="logits"))
    want = apply(restore_params(job, STEPS), batch)
    np.testing.assert_allclose(logits, np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_greedy_generate_is_the_argmax_chain_of_its_logits_and_pads_after_eos(s2s):
    new = s2s.generate(ROWS, max_new_tokens=N)  # The job's settings: greedy, EOS 1, pad 0.
    assert new.shape == (3, N) and new.dtype.kind == "i"
    chain = s2s.logits(ROWS, decoder_input_ids=_decoder_ids(new))[:, :-1].argmax(-1)
    stopped = 0
    for row, want in zip(new, chain, strict=True):
        end = int(np.argmax(row == EOS)) + 1 if EOS in row else N  # Through the EOS.
        np.testing.assert_array_equal(row[:end], want[:end])
        assert (row[end:] == PAD).all(), row
        stopped += end < N
    assert stopped, f"no row stopped before {N} tokens ({new}): the EOS path went untested"
    # 1 and 3 inputs on the 8-device mesh (padded to 8 rows): each row as in the batch of 3.
    np.testing.assert_array_equal(s2s.generate(ROWS[1:2], max_new_tokens=N), new[1:2])
    np.testing.assert_array_equal(s2s.generate(np.array([ROWS[0]]), max_new_tokens=N), new[:1])


@pytest.mark.slow
def test_one_input_gives_its_rows_logits_of_the_batch(s2s):
    decoder_ids = _decoder_ids(np.array([[7, 6, 5, EOS, 0, 0]] * 3))
    three = s2s.logits(ROWS, decoder_input_ids=decoder_ids)
    one = s2s.logits([ROWS[1] + [0]], decoder_input_ids=decoder_ids[1:2])
    assert one.shape == (1, N + 1, 32)
    np.testing.assert_allclose(one, three[1:2], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_encode_and_logits_depend_on_the_inputs_through_it(s2s):
    out = s2s.encode(ROWS)
    assert out.shape == (3, 4, 64) and out.dtype == np.float32
    # Padding is never attended: the short row's outputs equal its own, unpadded.
    np.testing.assert_allclose(s2s.encode([ROWS[1]])[0], out[1, :3], rtol=1e-5, atol=1e-5)
    changed = [[5, 6, 9, EOS], *ROWS[1:]]
    moved = s2s.encode(changed)
    assert not np.allclose(moved[0], out[0]) and np.allclose(moved[1:], out[1:], atol=1e-6)
    decoder_ids = _decoder_ids(np.array([[7, 6, 5, EOS, 0, 0]] * 3))
    before = s2s.logits(ROWS, decoder_input_ids=decoder_ids)
    after = s2s.logits(changed, decoder_input_ids=decoder_ids)
    assert not np.allclose(after[0], before[0])
    np.testing.assert_allclose(after[1:], before[1:], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_strings_go_through_the_tokenizer(s2s, monkeypatch):
    class Letters:
        """a..z as ids 2..27, the EOS added (as T5's tokenizer adds it)."""

        def encode(self, text):
            return [ord(c) - ord("a") + 2 for c in text] + [EOS]

        def decode(self, ids):
            return "".join(chr(i - 2 + ord("a")) for i in ids if i > EOS)

    monkeypatch.setattr(s2s, "tokenizer", Letters())
    texts = ["dfg", "hb"]  # [5, 7, 8, EOS], [9, 3, EOS] (ROWS[1]): the programs above
    new = s2s.generate([Letters().encode(t) for t in texts], max_new_tokens=N)
    want = [Letters().decode(row) for row in new]  # Pad after the EOS: dropped.
    assert s2s.generate(texts, max_new_tokens=N) == want
    assert s2s.generate("dfg", max_new_tokens=N) == want[0]


@pytest.mark.slow
def test_errors_are_one_line(s2s):
    with pytest.raises(ValueError, match=r"pass decoder_input_ids \[B, T\]") as e:
        s2s.logits(ROWS)
    assert "\n" not in str(e.value) and "decoder start id 0" in str(e.value)
    with pytest.raises(ValueError, match="3 rows of input_ids but 1 of decoder_input_ids") as e:
        s2s.logits(ROWS, decoder_input_ids=[[0, 7]])
    with pytest.raises(ValueError, match=r"decoder_input_ids must be token ids \[B, T\]"):
        s2s.logits(ROWS, decoder_input_ids=[0, 7, 6])
    with pytest.raises(ValueError, match=r"messages=\.\.\.\) is for decoder-only models") as e:
        s2s.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=N)
    assert "\n" not in str(e.value)
