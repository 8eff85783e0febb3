"""The decoding loop: sampling rules, EOS handling, and greedy decoding vs. no-cache argmax."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import config as config_lib
from praxis_lite.decoding import sampling
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.layers import embedding_softmax as es
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.lm import LanguageModel
from tests.praxis_lite.layers import numpy_refs as ref

V = 16


def _logits(b=64, seed=0):
    return jnp.asarray(3.0 * np.random.default_rng(seed).standard_normal((b, V)), jnp.float32)


@functools.cache
def _sampler():
    return jax.jit(sampling.sample_logits, static_argnames="params")


def test_top_k_1_and_tiny_top_p_equal_greedy():
    logits = _logits()
    greedy = np.argmax(np.asarray(logits), axis=-1)
    np.testing.assert_array_equal(_sampler()(logits, jax.random.key(0), DecoderParams()), greedy)
    for params in (
        DecoderParams(do_sample=True, top_k=1),
        DecoderParams(do_sample=True, top_p=1e-6),
    ):
        for seed in range(3):
            tokens = _sampler()(logits, jax.random.key(seed), params)
            np.testing.assert_array_equal(tokens, greedy)


def test_do_sample_false_is_greedy_whatever_the_sampling_fields_say():
    logits = _logits()
    greedy = np.argmax(np.asarray(logits), axis=-1)
    params = DecoderParams(temperature=0.7, top_k=3, top_p=0.9)
    for seed in range(2):
        np.testing.assert_array_equal(_sampler()(logits, jax.random.key(seed), params), greedy)


def test_temperature_sampling_is_reproducible_and_respects_top_k():
    logits = jnp.tile(_logits(1), (512, 1))  # one distribution, many draws
    params = DecoderParams(do_sample=True)
    a = _sampler()(logits, jax.random.key(7), params)
    b = _sampler()(logits, jax.random.key(7), params)
    c = _sampler()(logits, jax.random.key(8), params)
    np.testing.assert_array_equal(a, b)
    assert np.any(np.asarray(a) != np.asarray(c))
    assert len(np.unique(a)) > 3  # It samples, it is not argmax.
    top3 = set(np.argsort(-np.asarray(logits[0]))[:3].tolist())
    k3 = _sampler()(logits, jax.random.key(7), DecoderParams(do_sample=True, top_k=3))
    assert set(np.unique(k3).tolist()) == top3
    # top_p keeps the fewest most-likely tokens whose probability reaches p.
    probs = np.sort(np.asarray(jax.nn.softmax(logits[0])))[::-1]
    need = int(np.searchsorted(np.cumsum(probs), 0.8) + 1)
    p8 = _sampler()(logits, jax.random.key(7), DecoderParams(do_sample=True, top_p=0.8))
    assert set(np.unique(p8).tolist()) == set(np.argsort(-np.asarray(logits[0]))[:need].tolist())


def _counting_model():
    """A fake LM whose next token is (last token + 1) % V, with log-prob log(0.9)-ish."""

    def logits_for(ids):
        return 5.0 * jax.nn.one_hot((ids + 1) % V, V)

    def prefill(ids, paddings, positions, max_len):
        return logits_for(ids), jnp.zeros((), jnp.int32)

    def step(cache, ids, positions):
        return logits_for(ids), cache + 1

    return prefill, step


def _count_after(first_ids, params, steps):
    """:func:`decoding.decode` of the counting model after one-token prompts."""
    prefill, step = _counting_model()
    ids, lengths = jnp.asarray(first_ids)[:, None], jnp.ones(len(first_ids), jnp.int32)
    key = jax.random.key(0)
    return jax.jit(lambda: sampling.decode(prefill, step, ids, lengths, key, params, steps))()


def test_eos_stops_each_row_and_pads_after_it():
    prefill, step = _counting_model()
    prompts = jnp.asarray([[3, 4, 0], [9, 0, 0], [13, 14, 15]], jnp.int32)
    lengths = jnp.asarray([2, 1, 3])
    params = DecoderParams(eos_token_id=12, pad_token_id=0)
    run = jax.jit(lambda p, n: sampling.decode(prefill, step, p, n, jax.random.key(0), params, 6))
    out = run(prompts, lengths)
    tokens = np.asarray(out.tokens)
    np.testing.assert_array_equal(tokens[0], [5, 6, 7, 8, 9, 10])  # no EOS within 6 steps
    np.testing.assert_array_equal(tokens[1], [10, 11, 12, 0, 0, 0])  # stops at EOS 12
    np.testing.assert_array_equal(tokens[2], [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(out.lengths, [6, 3, 6])
    step_lp = float(jax.nn.log_softmax(5.0 * jax.nn.one_hot(0, V))[0])
    np.testing.assert_allclose(out.log_probs[1], [step_lp] * 3 + [0.0] * 3, rtol=1e-6)
    np.testing.assert_allclose(out.scores, np.asarray(out.log_probs).sum(-1), rtol=1e-6)

    # Every row ends early (the loop's condition stops it); the rest stays padding.
    out = _count_after([9, 10], DecoderParams(eos_token_id=11), 8)
    np.testing.assert_array_equal(out.tokens, [[10, 11, 0, 0, 0, 0, 0, 0], [11] + [0] * 7])
    np.testing.assert_array_equal(out.lengths, [2, 1])


def test_a_list_of_eos_ids_stops_a_row_at_any_of_them():
    params = DecoderParams(eos_token_id=[6, 11], pad_token_id=15)
    assert params.eos_token_id == (6, 11)
    hash(params)  # A tuple: the params stay hashable (static under jit).
    out = _count_after([3, 9], params, 4)
    np.testing.assert_array_equal(out.tokens, [[4, 5, 6, 15], [10, 11, 15, 15]])
    np.testing.assert_array_equal(out.lengths, [3, 2])


def test_params_are_validated():
    with pytest.raises(ValueError, match="top_p"):
        DecoderParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        DecoderParams(temperature=-1.0)
    with pytest.raises(ValueError, match="set temperature > 0 to sample, or do_sample=False"):
        DecoderParams(do_sample=True, temperature=0.0)
    DecoderParams(temperature=0.0)  # Greedy: the temperature is not used.


@pytest.mark.parametrize(
    "old, new",
    [
        ("max_decode_steps", "max_new_tokens"),
        ("eos_id", "eos_token_id"),
        ("pad_id", "pad_token_id"),
    ],
)
def test_pax_names_fail_naming_hugging_faces(old, new):
    message = f"^DecoderParams: {old} is now {new} \\(Hugging Face's name\\)\\.$"
    with pytest.raises(TypeError, match=message):
        DecoderParams(**{old: 1})
    with pytest.raises(AttributeError, match=message):
        setattr(config_lib.Config(DecoderParams), old, 1)


@pytest.mark.slow
def test_greedy_decode_of_an_lm_equals_argmax_of_full_passes():
    """Cached greedy decoding vs. re-running the whole sequence for every new token."""
    cfg = TransformerLm.HParams.config(model_dims=16, vocab_size=V)
    cfg.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(num_layers=2)
    block = cfg.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads, block.num_kv_heads = 16, 32, 4, 2
    block.tr_atten_tpl.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    model = ref.build(LanguageModel.HParams.config(lm_tpl=cfg))
    prompts = np.asarray([[1, 2, 3, 4], [5, 6, 0, 0], [7, 0, 0, 0]], np.int32)
    lengths = np.asarray([4, 2, 1], np.int32)
    variables = ref.init_variables(model, method=lambda m, i: m.lm(i), i=prompts, noise=0.5)
    steps = 5
    out = jax.jit(
        lambda v, p, n: model.decode(v, p, n, jax.random.key(0), DecoderParams(), steps),
        compiler_options=ref._FAST_COMPILE,
    )(variables, prompts, lengths)

    full = jax.jit(
        functools.partial(model.apply, method=lambda m, i: m.lm(i).logits),
        compiler_options=ref._FAST_COMPILE,
    )
    # Causal: the logits at t depend on tokens <= t only, so one fixed-length pass per step.
    seqs = np.zeros((3, prompts.shape[1] + steps), np.int32)
    seqs[:, : prompts.shape[1]] = prompts
    rows = np.arange(3)
    want_lp = []
    for i in range(steps):
        logits = np.asarray(full(variables, seqs))[rows, lengths + i - 1]
        seqs[rows, lengths + i] = np.argmax(logits, axis=-1)
        log_probs = np.asarray(jax.nn.log_softmax(logits))
        want_lp.append(log_probs[rows, seqs[rows, lengths + i]])
    want_tokens = np.stack([seqs[r, lengths[r] : lengths[r] + steps] for r in rows])
    np.testing.assert_array_equal(out.tokens, want_tokens)
    np.testing.assert_allclose(out.log_probs, np.stack(want_lp, 1), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(out.lengths, [steps] * 3)


def test_the_loop_stops_once_every_row_has_ended():
    """A model that says EOS at its k-th step: the loop runs k steps, not max_new_tokens."""
    eos, vocab, rows = 3, 8, 2
    steps_run = []

    def logits_for(token_id):
        return jnp.full((rows, vocab), -10.0).at[:, token_id].set(10.0)

    def prefill(ids, paddings, positions, max_len):
        return logits_for(1)[:, None, :], jnp.zeros((), jnp.int32)

    def step(count, token, positions):
        jax.debug.callback(lambda: steps_run.append(1))
        count = count + 1
        return jnp.where(count >= 4, logits_for(eos), logits_for(2)), count

    out = jax.jit(
        lambda ids, lengths: sampling.decode(
            prefill,
            step,
            ids,
            lengths,
            jax.random.key(0),
            DecoderParams(eos_token_id=eos),
            max_new_tokens=50,
        )
    )(jnp.ones((rows, 3), jnp.int32), jnp.array([3, 2]))
    jax.effects_barrier()
    assert len(steps_run) == 4  # Steps 1..4; the 4th says EOS for both rows.
    np.testing.assert_array_equal(out.lengths, [5, 5])  # The prefill's token, 3 more, EOS.
    np.testing.assert_array_equal(out.tokens[0, :6], [1, 2, 2, 2, eos, 0])
