"""Beam search and the logits controls against references written here.

Oracles:
- exhaustive search: every sequence of the length (cut at its first EOS), scored with the
  penalty, argmax (and the n best) - what beam search with enough beams must return;
- a numpy transcription of T5X's ``beam_search`` (its 2K candidates, finished vs. live
  beams, brevity penalty, stopping rule, and live beams returned when nothing finished);
- a numpy greedy loop with numpy versions of transformers' controls;
- teacher-forced rescoring of the returned hypotheses by a real (tiny) transformer.

The fake model's next-token logits depend on the whole prefix through its cache (the sum
of the tokens so far), so a beam whose cache row is not moved with it decodes wrongly.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.decoding import beam_search, sampling
from praxis_lite.decoding import logits_processors as processors
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.py_utils import NestedMap

V, M = 6, 7  # vocabulary; the fake model's prefix classes
TABLE = 2.0 * np.random.default_rng(0).standard_normal((16, M, V)).astype(np.float32)


def _np_log_probs(prefix: list[int]) -> np.ndarray:
    """The fake model's next-token log-probs ``[V]`` after ``prefix`` (prompt + new)."""
    logits = TABLE[len(prefix), sum(prefix) % M].astype(np.float64)
    return logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()


def _fake_model():
    table = jnp.asarray(TABLE)

    def prefill(ids, paddings, positions, max_len):
        del positions, max_len
        real = paddings == 0
        cache = NestedMap(
            total=jnp.sum(jnp.where(real, ids, 0), axis=1), count=jnp.sum(real, axis=1)
        )
        last = table[cache.count, cache.total % M]
        return jnp.broadcast_to(last[:, None], ids.shape + (V,)), cache

    def step(cache, ids, positions):
        del positions
        cache = NestedMap(total=cache.total + ids, count=cache.count + 1)
        return table[cache.count, cache.total % M], cache

    return prefill, step


def _decode(prompts: list[list[int]], params: DecoderParams, n: int) -> NestedMap:
    prefill, step = _fake_model()
    ids = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    run = jax.jit(lambda i, ls: sampling.decode(prefill, step, i, ls, jax.random.key(0), params, n))
    return jax.tree.map(np.asarray, run(ids, lengths))


def _hypotheses(prompt: list[int], n: int, eos: int | None):
    """Every ``(new tokens, summed log-prob, ended)``: sequences of ``n`` tokens cut after
    their first EOS (each kept once)."""
    seen = {}
    for seq in itertools.product(range(V), repeat=n):
        cut = list(seq)
        if eos in cut:
            cut = cut[: cut.index(eos) + 1]
        key = tuple(cut)
        if key not in seen:
            total = sum(_np_log_probs(prompt + cut[:j])[t] for j, t in enumerate(cut))
            seen[key] = (cut, total, eos is not None and cut[-1] == eos)
    return list(seen.values())


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_enough_beams_equal_exhaustive_search_with_the_penalty(length_penalty):
    prompts, n, eos = [[1, 2], [4]], 3, 3
    params = DecoderParams(
        num_beams=V**n,
        num_return_sequences=4,
        eos_token_id=eos,
        length_penalty=length_penalty,
        pad_token_id=0,
    )
    out = _decode(prompts, params, n)
    for row, prompt in enumerate(prompts):
        ranked = sorted(
            _hypotheses(prompt, n, eos), key=lambda h: -h[1] / len(h[0]) ** length_penalty
        )
        assert any(h[2] for h in ranked) and any(not h[2] for h in ranked)
        for j, (cut, total, _) in enumerate(ranked[:4]):
            got = out.tokens[row, j, : out.lengths[row, j]].tolist()
            assert got == cut, (row, j, got, cut)
            np.testing.assert_allclose(
                out.scores[row, j], total / len(cut) ** length_penalty, rtol=1e-5
            )


def test_enough_beams_equal_exhaustive_search_under_t5x_rules():
    prompts, n, eos, alpha = [[1, 2], [4]], 3, 3, 0.6
    params = DecoderParams(
        num_beams=V**n, num_return_sequences=2, eos_token_id=eos, length_norm_alpha=alpha
    )
    out = _decode(prompts, params, n)
    for row, prompt in enumerate(prompts):
        ended = [h for h in _hypotheses(prompt, n, eos) if h[2]]  # T5X: only EOS finishes
        bp = functools.partial(_brevity, alpha, len(prompt))
        best = max(ended, key=lambda h: h[1] / bp(h))
        assert out.tokens[row, 0, : out.lengths[row, 0]].tolist() == best[0]
        np.testing.assert_allclose(out.scores[row, 0], best[1] / bp(best), rtol=1e-5)


def _brevity(alpha: float, prompt_length: int, hypothesis) -> float:
    """T5X's brevity penalty of a hypothesis after a prompt (T5X counts the prompt)."""
    return ((5.0 + prompt_length + len(hypothesis[0])) / 6.0) ** alpha


def _t5x_reference(prompt, k, n, alpha, eos, bound_length):
    """A numpy transcription of ``t5x.decoding.beam_search`` for one row: ``(sequences,
    scores)`` best first. ``bound_length``: the length T5X's stopping rule divides by."""
    neg = -1.0e7
    bp = lambda length: ((5.0 + length) / 6.0) ** alpha
    live = [([], 0.0)] + [([], neg)] * (k - 1)
    finished = [([], neg, False)] * k
    for i in range(n):
        cands = []
        for b, (seq, lp) in enumerate(live):
            log_probs = _np_log_probs(prompt + seq)
            cands += [(lp + log_probs[t], b * V + t, seq + [t]) for t in range(V)]
        top = sorted(cands, key=lambda c: (-c[0], c[1]))[: 2 * k]
        ended = [c[2][-1] == eos for c in top]
        live_scored = [(c[0] + neg * e, j) for j, (c, e) in enumerate(zip(top, ended, strict=True))]
        live = [(top[j][2], s) for s, j in sorted(live_scored, key=lambda x: (-x[0], x[1]))[:k]]
        new = [
            (c[2], c[0] / bp(len(prompt) + i + 1) + (0.0 if e else neg), e)
            for c, e in zip(top, ended, strict=True)
        ]
        merged = [(f, j) for j, f in enumerate(finished + new)]
        finished = [f for f, _ in sorted(merged, key=lambda x: (-x[0][1], x[1]))[:k]]
        worst = min(f[1] for f in finished)
        best_live = max(lp for _, lp in live) / bp(bound_length)
        if all((worst if f[2] else neg) > best_live for f in finished):
            break
    if any(f[2] for f in finished):
        return [f[0] for f in finished], [f[1] for f in finished]
    return [s for s, _ in live], [lp for _, lp in live]


@pytest.mark.parametrize(
    "prompts, n, k, unfinished_rows",
    [([[1, 2, 5], [4], [2, 2]], 6, 3, 0), ([[1, 2, 5], [0], [5, 5]], 3, 2, 2)],
)
def test_t5x_rules_equal_a_numpy_transcription_of_t5x(prompts, n, k, unfinished_rows):
    eos, alpha = 3, 0.6
    params = DecoderParams(
        num_beams=k,
        num_return_sequences=k,
        eos_token_id=eos,
        length_norm_alpha=alpha,
        pad_token_id=0,
    )
    out = _decode(prompts, params, n)
    no_finished = 0
    for row, prompt in enumerate(prompts):
        bound = max(map(len, prompts)) + n + 1
        seqs, scores = _t5x_reference(prompt, k, n, alpha, eos, bound)
        no_finished += all(s[-1] != eos for s in seqs)
        for j in range(k):
            if scores[j] <= -1.0e6:  # An empty finished slot: T5X returns it as it is.
                assert out.scores[row, j] <= -1.0e6
                continue
            assert out.tokens[row, j, : out.lengths[row, j]].tolist() == seqs[j], (row, j)
            np.testing.assert_allclose(out.scores[row, j], scores[j], rtol=1e-5)
    assert no_finished == unfinished_rows  # Such a row returns its live beams.


def test_one_beam_is_greedy():
    prefill, step = _fake_model()
    prompts = np.array([[1, 2], [4, 0]], np.int32)
    lengths = np.array([2, 1], np.int32)
    greedy = _decode([[1, 2], [4]], DecoderParams(), 5)
    params = DecoderParams(num_beams=2, eos_token_id=None)
    one = dataclasses_replace(params, num_beams=1)

    def run(ids, lens):
        ids_l, pads, _ = sampling.left_align(ids, lens)
        logits, cache = prefill(ids_l, pads, None, 0)
        history = jnp.where(pads > 0, processors.EMPTY, ids_l)
        return beam_search.beam_search(
            lambda c, t, i: step(c, t, None),
            logits[:, -1],
            cache,
            None,
            history,
            lens,
            one,
            5,
        )

    out = jax.tree.map(np.asarray, jax.jit(run)(prompts, lengths))
    np.testing.assert_array_equal(out.tokens[:, 0], greedy.tokens)
    np.testing.assert_allclose(out.scores[:, 0], greedy.scores / 5, rtol=1e-5)


def dataclasses_replace(params, **changes):
    """``DecoderParams`` with ``changes``, skipping its checks (one beam in beam search)."""
    out = object.__new__(DecoderParams)
    for name, value in {**params.__dict__, **changes}.items():
        object.__setattr__(out, name, value)
    return out


def _np_process(scores, history, generated, params):
    """transformers' three controls in numpy: ``scores [V]`` after ``history`` (ids)."""
    scores = scores.copy()
    for t in set(history):
        scores[t] = (
            scores[t] * params.repetition_penalty
            if scores[t] < 0
            else (scores[t] / params.repetition_penalty)
        )
    size = params.no_repeat_ngram_size
    if size and len(history) + 1 >= size:
        head = tuple(history[len(history) - size + 1 :])
        for j in range(len(history) - size + 1):
            if tuple(history[j : j + size - 1]) == head:
                scores[history[j + size - 1]] = -np.inf
    if generated < params.min_new_tokens:
        scores[list(processors.eos_ids(params.eos_token_id))] = -np.inf
    return scores


@pytest.mark.parametrize("size", [1, 2, 3])
def test_the_controls_equal_numpy_on_padded_histories(size):
    rng = np.random.default_rng(size)
    params = DecoderParams(
        repetition_penalty=1.7, no_repeat_ngram_size=size, min_new_tokens=2, eos_token_id=(1, 4)
    )
    r, p, n = 5, 4, 6
    history = np.full((r, p + n), processors.EMPTY, np.int32)
    real = []
    for i in range(r):
        prompt, new = rng.integers(0, 3, rng.integers(1, p + 1)), rng.integers(0, 3, i + 1)
        history[i, p - len(prompt) : p] = prompt
        history[i, p : p + len(new)] = new
        real.append(prompt.tolist() + new.tolist())
    scores = rng.standard_normal((r, V)).astype(np.float32)
    for generated in (1, 2):
        got = np.asarray(
            processors.process(jnp.asarray(scores), jnp.asarray(history), generated, params)
        )
        want = np.stack([_np_process(scores[i], real[i], generated, params) for i in range(r)])
        np.testing.assert_allclose(got, want, rtol=1e-6)
        assert np.isinf(want).any()


def test_greedy_with_controls_equals_a_numpy_loop_and_eos_waits_for_min_new_tokens():
    prompts, n = [[1, 2], [4]], 7
    params = DecoderParams(
        repetition_penalty=1.5,
        no_repeat_ngram_size=2,
        min_new_tokens=3,
        eos_token_id=(4, 5),
        pad_token_id=0,
    )
    out = _decode(prompts, params, n)
    for row, prompt in enumerate(prompts):
        new = []
        while len(new) < n:
            logits = TABLE[len(prompt + new), sum(prompt + new) % M]  # Greedy: on logits.
            new.append(int(np.argmax(_np_process(logits, prompt + new, len(new), params))))
            if new[-1] in (4, 5):
                break
        assert out.tokens[row, : len(new)].tolist() == new
        assert out.lengths[row] == len(new)
    plain = _decode(prompts, DecoderParams(eos_token_id=(4, 5)), n)
    assert plain.lengths.min() < 3  # Without min_new_tokens some row ends sooner.
    assert out.lengths.min() >= 3


def test_n_samples_per_row_are_reproducible_and_scored_by_the_model():
    prompts, n = [[1, 2], [4]], 5
    params = DecoderParams(do_sample=True, num_return_sequences=3, seed=0)
    a, b = _decode(prompts, params, n), _decode(prompts, params, n)
    assert a.tokens.shape == (2, 3, n) and a.scores.shape == (2, 3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert len({tuple(s) for s in a.tokens.reshape(-1, n).tolist()}) > 3
    for row, prompt in enumerate(prompts):
        for j in range(3):
            seq = a.tokens[row, j].tolist()
            want = sum(_np_log_probs(prompt + seq[:i])[t] for i, t in enumerate(seq))
            np.testing.assert_allclose(a.scores[row, j], want, rtol=1e-5)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(length_penalty=1.0, length_norm_alpha=0.6), "not both"),
        (dict(num_beams=2, num_return_sequences=3), "at most num_beams"),
        (dict(num_return_sequences=2), "greedy decoding returns one sequence"),
        (dict(num_beams=2, do_sample=True), "beam sampling"),
        (dict(early_stopping="always"), "early_stopping must be"),
        (dict(early_stopping=True, length_norm_alpha=0.6), "T5X's stopping rule"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(stop_strings=["x", ""]), "empty string"),
    ],
)
def test_contradicting_settings_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message) as info:
        DecoderParams(**settings)
    assert "\n" not in str(info.value)


def test_paxs_beam_size_names_num_beams():
    with pytest.raises(TypeError, match="beam_size is now num_beams"):
        DecoderParams(beam_size=4)


@pytest.mark.slow
def test_the_cached_beams_scores_equal_rescoring_them_teacher_forced():
    """A tiny transformer LM (rotary, GQA, a repeated stack: the KV cache's rows follow
    their beams): each returned hypothesis' score times n ** p is the summed log-prob a
    full forward pass gives its tokens."""
    from praxis_lite.layers import embedding_softmax as es
    from praxis_lite.layers.repeats import StackedTransformerRepeated
    from praxis_lite.layers.transformer_models import TransformerLm
    from praxis_lite.models.lm import LanguageModel
    from tests.praxis_lite.layers import numpy_refs as ref

    vocab, n, penalty = 16, 5, 0.7
    cfg = TransformerLm.HParams.config(model_dims=16, vocab_size=vocab)
    cfg.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(num_layers=2)
    block = cfg.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads, block.num_kv_heads = 16, 32, 4, 2
    block.tr_atten_tpl.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    model = ref.build(LanguageModel.HParams.config(lm_tpl=cfg))
    prompts = np.asarray([[1, 2, 3, 4], [5, 6, 0, 0]], np.int32)
    lengths = np.asarray([4, 2], np.int32)
    variables = ref.init_variables(model, method=lambda m, i: m.lm(i), i=prompts, noise=2.0)
    params = DecoderParams(
        num_beams=3, num_return_sequences=3, length_penalty=penalty, eos_token_id=7
    )
    out = jax.jit(
        lambda v, p, ln: model.decode(v, p, ln, jax.random.key(0), params, n),
        compiler_options=ref._FAST_COMPILE,
    )(variables, prompts, lengths)
    out = jax.tree.map(np.asarray, out)
    full = jax.jit(
        functools.partial(model.apply, method=lambda m, i: m.lm(i).logits),
        compiler_options=ref._FAST_COMPILE,
    )
    seqs = np.zeros((2, 3, prompts.shape[1] + n), np.int32)
    for row in range(2):
        for j in range(3):
            seqs[row, j, : lengths[row]] = prompts[row, : lengths[row]]
            seqs[row, j, lengths[row] : lengths[row] + n] = out.tokens[row, j]
    log_probs = np.asarray(jax.nn.log_softmax(full(variables, seqs.reshape(6, -1)))).reshape(
        2, 3, -1, vocab
    )
    for row in range(2):
        for j in range(3):
            count = out.lengths[row, j]
            slots = lengths[row] - 1 + np.arange(count)
            total = log_probs[row, j, slots, out.tokens[row, j, :count]].sum()
            np.testing.assert_allclose(out.scores[row, j] * count**penalty, total, rtol=2e-4)
        assert out.scores[row, 0] >= out.scores[row, 1] >= out.scores[row, 2]
    assert len({tuple(out.tokens[0, j]) for j in range(3)}) == 3
