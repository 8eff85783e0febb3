"""Incremental decoding with the KV cache equals the full forward pass.

Prefill of a prompt then one token at a time through ``extend`` must give the
logits (or attention outputs) that one ``__call__`` over the whole sequence gives:
MHA, GQA/MQA, RoPE, combined qkv, logit cap; plain and scanned stacks; left-padded
prompts of different lengths. The full pass is itself checked against numpy in
test_attentions / test_transformer_models, so this is an independent path.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import instantiate
from praxis_lite.layers import attentions
from praxis_lite.layers import embedding_softmax as es
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.models.lm import LanguageModel
from tests.praxis_lite.layers import numpy_refs as ref

D, V, T, PROMPT = 16, 32, 7, 3
TOL = dict(rtol=2e-5, atol=2e-5)  # fp32: the two paths differ only in summation order.


def _positions(b: int, t: int) -> np.ndarray:
    return np.tile(np.arange(t, dtype=np.int32), (b, 1))


def _jit(fn, **kwargs):
    return jax.jit(fn, compiler_options=ref._FAST_COMPILE, **kwargs)


@pytest.mark.parametrize(
    "fields",
    [
        {"num_kv_heads": 2, "rope": True},
        {"combine_qkv": True, "use_bias": False, "atten_logit_cap": 1.0},
        {"num_kv_heads": 2, "rope": True, "sliding_window": 2},
    ],
    ids=["gqa_rope", "mha_combined_qkv_cap", "gqa_rope_sliding_window"],
)
def test_attention_prefill_then_steps_equals_full_pass(fields):
    fields = dict(fields)
    cfg = attentions.DotProductAttention.HParams.config(input_dims=D, num_heads=4)
    if fields.pop("rope", False):
        cfg.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    for name, value in fields.items():
        setattr(cfg, name, value)
    layer = ref.build(cfg)
    x = ref.normal((2, T, D), scale=2.0)
    variables = ref.init_variables(layer, x[:, :2])
    assert set(variables) == {"params"}  # The training path creates no cache.
    positions = _positions(2, T)
    full = _jit(layer.apply)(variables, x, positions=positions)

    def incremental(variables, x):
        extend = functools.partial(layer.apply, method=layer.extend, mutable=["cache"])
        out, cache = extend(variables, x[:, :PROMPT], positions=positions[:, :PROMPT], max_len=T)
        outs, first_cache = [out], cache["cache"]
        cache = nn.unbox(first_cache)
        for t in range(PROMPT, T):
            step, mutated = extend(
                {**variables, "cache": cache}, x[:, t : t + 1], positions=positions[:, t : t + 1]
            )
            outs.append(step)
            cache = mutated["cache"]
        return jnp.concatenate(outs, axis=1), first_cache, cache

    got, first_cache, cache = _jit(incremental)(variables, x)
    np.testing.assert_allclose(got, full, **TOL)
    assert first_cache["key"].value.shape == (2, T, cfg.num_kv_heads or 4, 4)
    assert first_cache["key"].names == attentions.CACHE_KV_AXES
    assert int(first_cache["index"]) == PROMPT and int(cache["index"]) == T


def test_extend_without_a_cache_names_max_len():
    layer = instantiate(attentions.DotProductAttention.HParams.config(input_dims=D, num_heads=4))
    x = jnp.ones((1, 1, D))
    init = functools.partial(layer.init, method=layer.extend, positions=jnp.zeros((1, 1), int))
    with pytest.raises(ValueError, match="max_len"):
        jax.eval_shape(init, jax.random.key(0), x)


def _lm_config(stack_cls, num_kv_heads, window=None):
    cfg = TransformerLm.HParams.config(model_dims=D, vocab_size=V)
    cfg.stacked_transformer_tpl = stack_cls.HParams.config(num_layers=2)
    block = cfg.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads = D, 32, 4
    block.num_kv_heads = num_kv_heads
    block.tr_atten_tpl.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    block.tr_atten_tpl.sliding_window = window
    return LanguageModel.HParams.config(lm_tpl=cfg)


@pytest.mark.slow
@pytest.mark.parametrize(
    "stack_cls, num_kv_heads, window",
    [(StackedTransformer, None, None), (StackedTransformerRepeated, 2, None),
     (StackedTransformer, 2, 2)],
    ids=["plain_mha", "repeated_gqa", "plain_gqa_sliding_window"],
)  # fmt: skip
def test_lm_left_padded_prefill_then_steps_equals_full_pass(stack_cls, num_kv_heads, window):
    """Row 0 has a 3-token prompt, row 1 a 1-token prompt left-padded to 3; RoPE; with a
    sliding window, the left padding must not count as window slots."""
    model = ref.build(_lm_config(stack_cls, num_kv_heads, window))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, (2, T)).astype(np.int32)
    variables = {"params": ref.init_variables(model, method=lambda m, i: m.lm(i), i=ids)["params"]}
    full = _jit(functools.partial(model.apply, method=lambda m, i: m.lm(i).logits))(variables, ids)

    lengths = np.array([PROMPT, 1])
    pad = PROMPT - lengths  # left padding per row
    prompt = np.zeros((2, PROMPT), np.int32)
    prompt[0] = ids[0, :PROMPT]
    prompt[1, pad[1] :] = ids[1, :1]
    paddings = (np.arange(PROMPT)[None] < pad[:, None]).astype(np.float32)
    positions = np.maximum(np.arange(PROMPT)[None] - pad[:, None], 0).astype(np.int32)
    steps = T - PROMPT
    # Then both rows feed the tokens that follow their prompts, one per step.
    step_pos = lengths[:, None] + np.arange(steps)[None]  # [B, steps]
    step_ids = np.take_along_axis(ids, step_pos, axis=1)

    def incremental(variables):
        logits, cache = model.apply(
            variables,
            prompt,
            paddings=paddings,
            positions=positions,
            max_len=PROMPT + steps,
            method=model.prefill,
            mutable=["cache"],
        )
        first_cache, cache = cache["cache"], nn.unbox(cache["cache"])
        step_logits = []
        for i in range(steps):
            out, mutated = model.apply(
                {**variables, "cache": cache},
                step_ids[:, i],
                positions=step_pos[:, i],
                method=model.extend_step,
                mutable=["cache"],
            )
            step_logits.append(out)
            cache = mutated["cache"]
        return logits, jnp.stack(step_logits, axis=1), first_cache

    logits, step_logits, cache = _jit(incremental)(variables)
    # Row 0: prompt logits at every prompt position; row 1: at its one real token.
    np.testing.assert_allclose(logits[0], full[0, :PROMPT], **TOL)
    np.testing.assert_allclose(logits[1, -1], full[1, 0], **TOL)
    np.testing.assert_allclose(step_logits, np.take_along_axis(full, step_pos[..., None], 1), **TOL)
    if stack_cls is StackedTransformerRepeated:
        k = cache["lm"]["transformer"]["repeat"]["block"]["self_attention"]["key"]
        assert k.value.shape == (2, 2, PROMPT + steps, num_kv_heads, 4)
        assert k.names == ("layers", *attentions.CACHE_KV_AXES)
    else:
        k = cache["lm"]["transformer"]["x_layers_1"]["self_attention"]["key"]
        assert k.value.shape == (2, PROMPT + steps, num_kv_heads or 4, 4)
