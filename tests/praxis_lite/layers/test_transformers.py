"""TransformerFeedForward and the Transformer block against numpy compositions.

The block reference is composed from the references of its pieces (pre-norm:
``x + attn(ln(x))``, then ``x + ffn(ln(x))``). Each variant is initialized once and
applied jitted at every shape and dtype.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import activations, normalizations, transformers
from praxis_lite.layers import embedding_softmax as es
from tests.praxis_lite.layers import numpy_refs as ref

D, F = 8, 16
SHAPES = [(2, 5), (1, 7)]  # (B, T)

# name -> (fields, activation config or None for the default ReLU, numpy activation, gated)
FFN_VARIANTS = {
    "relu": ({}, None, ref.relu, False),
    "swiglu_nobias": (
        {"use_gated_activation": True, "use_bias": False},
        activations.SiLU.HParams.config,
        ref.silu,
        True,
    ),
    "gated_gelu": ({"use_gated_activation": True}, activations.GELU.HParams.config, ref.gelu, True),
}


def _build_ffn(variant, dtype=jnp.float32, **overrides):
    fields, activation_cfg, _, _ = FFN_VARIANTS[variant]
    cfg = transformers.TransformerFeedForward.HParams.config(
        input_dims=D, hidden_dims=F, **fields, **overrides
    )
    if activation_cfg is not None:
        cfg.activation_tpl = activation_cfg()
    return ref.build(cfg, dtype)


@functools.cache
def _ffn_variables(variant):
    return ref.init_variables(_build_ffn(variant), np.zeros((1, 2, D), np.float32))


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("b, t", SHAPES)
@pytest.mark.parametrize("variant", list(FFN_VARIANTS))
def test_feedforward(variant, b, t, dtype):
    fields, _, activation, gated = FFN_VARIANTS[variant]
    variables = _ffn_variables(variant)
    p = ref.to_numpy(variables["params"])
    use_bias = fields.get("use_bias", True)
    assert ("ffn_layer1_gate" in p) == gated and ("bias1" in p) == use_bias
    assert p["ffn_layer1"]["w"].shape == (D, F) and p["ffn_layer2"]["w"].shape == (F, D)

    x = ref.normal((b, t, D))
    y = ref.jit_apply(_build_ffn(variant, dtype))(variables, x)
    assert y.shape == (b, t, D) and y.dtype == dtype
    want = ref.transformer_ffn(x.astype(np.float64), p, activation=activation, gated=gated)
    ref.assert_close(y, want, dtype, tol=1e-4 if dtype == jnp.float32 else None)


def test_feedforward_dropout():
    x = ref.normal((2, 5, D))
    variables = _ffn_variables("relu")
    apply = ref.jit_apply(_build_ffn("relu", relu_dropout_prob=0.3, residual_dropout_prob=0.3))
    reference = ref.jit_apply(_build_ffn("relu"))(variables, x)
    np.testing.assert_array_equal(apply(variables, x, train=False), reference)
    y = apply(variables, x, train=True, rngs={"dropout": jax.random.key(0, impl="rbg")})
    assert not np.allclose(y, reference, atol=1e-3)


# name -> (block fields, attention fields, ffn variant, attention reference arguments)
BLOCK_VARIANTS = {
    "mha_relu": ({}, {}, "relu", {}),
    "gqa_rope_swiglu": ({"num_kv_heads": 2}, {"rope": True}, "swiglu_nobias", {"use_rope": True}),
    # Gemma 2's norms after the attention and the feed-forward, before each residual add.
    "post_norms": ({"post_ln": True}, {}, "relu", {}),
}


def _build_block(variant, dtype=jnp.float32, **overrides):
    fields, atten_fields, ffn_variant, _ = BLOCK_VARIANTS[variant]
    fields = dict(fields)
    post_ln = fields.pop("post_ln", False)
    cfg = transformers.Transformer.HParams.config(
        input_dims=D, hidden_dims=F, num_heads=4, **fields, **overrides
    )
    if post_ln:
        cfg.post_ln_tpl = normalizations.RmsNorm.HParams.config()
        cfg.tr_fflayer_tpl.post_ln_tpl = normalizations.RmsNorm.HParams.config()
    if atten_fields.get("rope"):
        cfg.tr_atten_tpl.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    ffn_fields, activation_cfg, _, _ = FFN_VARIANTS[ffn_variant]
    for name, value in ffn_fields.items():
        setattr(cfg.tr_fflayer_tpl, name, value)
    if activation_cfg is not None:
        cfg.tr_fflayer_tpl.activation_tpl = activation_cfg()
    return ref.build(cfg, dtype)


@functools.cache
def _block_variables(variant):
    return ref.init_variables(_build_block(variant), np.zeros((1, 2, D), np.float32))


def _block_reference(variant, x, paddings):
    _, _, ffn_variant, atten_args = BLOCK_VARIANTS[variant]
    _, _, activation, gated = FFN_VARIANTS[ffn_variant]
    p = ref.to_numpy(_block_variables(variant)["params"])
    ln = p["layer_norm"]
    atten = ref.attention(
        ref.layer_norm(x, ln["scale"], ln["bias"]),
        p["self_attention"],
        paddings=paddings,
        **atten_args,
    )
    if "post_layer_norm" not in p:
        h = x + atten
        return ref.transformer_ffn(h, p["ff_layer"], activation=activation, gated=gated)
    h = x + ref.rms_norm(atten, p["post_layer_norm"]["scale"])
    ff = dict(p["ff_layer"])
    post = ff.pop("post_layer_norm")
    branch = ref.transformer_ffn(h, ff, activation=activation, gated=gated) - h
    return h + ref.rms_norm(branch, post["scale"])


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("b, t", SHAPES)
@pytest.mark.parametrize("variant", list(BLOCK_VARIANTS))
def test_block(variant, b, t, dtype):
    variables = _block_variables(variant)
    post = {"post_layer_norm"} if variant == "post_norms" else set()
    assert set(variables["params"]) == {"layer_norm", "self_attention", "ff_layer"} | post
    kv_heads = BLOCK_VARIANTS[variant][0].get("num_kv_heads", 4)
    assert variables["params"]["self_attention"]["w_k"].shape == (D, kv_heads, D // 4)
    x = ref.normal((b, t, D))
    paddings = np.zeros((b, t), np.float32)
    paddings[0, -2:] = 1.0
    y = ref.jit_apply(_build_block(variant, dtype))(variables, x, paddings=paddings)
    assert y.shape == (b, t, D) and y.dtype == dtype
    want = _block_reference(variant, x.astype(np.float64), paddings)
    ref.assert_close(y, want, dtype, tol=1e-4 if dtype == jnp.float32 else None)


def test_block_is_causal_and_dropout_is_train_only():
    x = ref.normal((2, 5, D))
    variables = _block_variables("mha_relu")
    apply = ref.jit_apply(_build_block("mha_relu", residual_dropout_prob=0.3))
    y = np.asarray(apply(variables, x))
    x2 = x.copy()
    x2[:, 3] += 1.0
    np.testing.assert_allclose(np.asarray(apply(variables, x2))[:, :3], y[:, :3], atol=1e-6)

    reference = ref.jit_apply(_build_block("mha_relu"))(variables, x)
    np.testing.assert_array_equal(y, reference)
    y_train = apply(variables, x, train=True, rngs={"dropout": jax.random.key(0, impl="rbg")})
    assert not np.allclose(y_train, reference, atol=1e-3)


def test_block_passes_segments_and_positions_to_attention():
    segment_ids = np.array([[1, 1, 2, 2, 2], [3, 3, 3, 4, 4]], np.int32)
    apply = ref.jit_apply(_build_block("gqa_rope_swiglu"))
    variables = _block_variables("gqa_rope_swiglu")
    x = ref.normal(segment_ids.shape + (D,))
    # The later segments (2 and 4) would see the earlier ones but for the segment mask.
    later = segment_ids % 2 == 0
    y = np.asarray(apply(variables, x, segment_ids=segment_ids))
    x2 = np.where(later[..., None], x, ref.normal(x.shape, seed=3))
    y2 = np.asarray(apply(variables, x2, segment_ids=segment_ids))
    np.testing.assert_allclose(y2[later], y[later], rtol=1e-5, atol=1e-5)
    assert not np.allclose(apply(variables, x2), apply(variables, x), atol=1e-3)

    positions = np.broadcast_to(np.arange(5), segment_ids.shape)
    shifted = apply(variables, x, positions=positions + 11)
    np.testing.assert_allclose(
        shifted, apply(variables, x, positions=positions), rtol=1e-4, atol=1e-4
    )
    assert not np.allclose(apply(variables, x, positions=positions * 3), shifted, atol=1e-3)


def test_stack_gives_each_block_its_window():
    """``sliding_windows`` (Gemma 2's alternation) sets each block's attention window; a
    window of 1 (a token sees itself only) changes the output, one as long as T does not."""
    cfg = transformers.StackedTransformer.HParams.config(num_layers=2)
    cfg.block_tpl.input_dims, cfg.block_tpl.hidden_dims, cfg.block_tpl.num_heads = D, F, 4
    x = ref.normal((1, 5, D))
    plain = ref.build(cfg)
    variables = ref.init_variables(plain, x)
    outputs = {}
    for windows in [(1, None), (5, None)]:
        cfg.sliding_windows = windows
        stack = ref.build(cfg)
        got = stack.apply(
            variables, x, method=lambda m, x: [b.self_attention.sliding_window for b in m.x_layers]
        )
        assert got == list(windows)
        outputs[windows] = np.asarray(stack.apply(variables, x))
    same = np.asarray(plain.apply(variables, x))
    np.testing.assert_allclose(outputs[(5, None)], same, rtol=1e-6, atol=1e-6)
    assert not np.allclose(outputs[(1, None)], same, atol=1e-3)
    cfg.sliding_windows = (1,)
    with pytest.raises(ValueError, match="sliding_windows has 1 entries for 2 layers"):
        ref.build(cfg).apply(variables, x)
