"""DotProductAttention against a numpy multi-head attention, and its masking properties.

Covers multi-head, grouped-query, multi-query, combined qkv, logit cap and RoPE
numerics (fp32 and bf16 compute), then: causal masking hides the future, GQA with
``K == N`` is MHA, padded keys and other segments are invisible, and dropout.

Each variant is initialized once (weights fit every input shape and dtype) and applied
jitted: on a small CPU one XLA compile of the layer is cheaper than one per op.
"""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import attentions
from praxis_lite.layers import embedding_softmax as es
from praxis_lite.layers.normalizations import RmsNorm
from tests.praxis_lite.layers import numpy_refs as ref

D = 8
SHAPES = [(2, 5), (1, 7)]  # (B, T)

# name -> (layer fields, numpy-reference arguments). Options are combined so that each
# is covered without a full cross product of options, shapes and dtypes.
VARIANTS = {
    "mha": ({}, {}),
    "gqa_rope": ({"num_kv_heads": 2, "dims_per_head": 6, "rope": True}, {"use_rope": True}),
    "mqa_logit_cap": ({"num_kv_heads": 1, "atten_logit_cap": 1.0}, {"logit_cap": 1.0}),
    "combined_qkv_nobias_noncausal": (
        {"combine_qkv": True, "use_bias": False, "is_causal": False},
        {"causal": False},
    ),
    "per_dim_scale": (  # the reference reads p['per_dim_scale']
        {"query_scale": attentions.QueryScale.PER_DIM}, {}
    ),
    # Qwen3's q/k norms and Qwen2's biases (q/k/v, none on the output) with Mistral's window.
    "qk_norm_window_no_post_bias": (
        {"num_kv_heads": 2, "rope": True, "qk_norm": True, "use_post_bias": False,
         "sliding_window": 3},
        {"use_rope": True, "window": 3},
    ),
    "query_scale_logit_cap": (  # Gemma 2's query_pre_attn_scalar ** -0.5 and soft cap.
        {"query_scale": 0.2, "atten_logit_cap": 1.5}, {"query_scale": 0.2, "logit_cap": 1.5}
    ),
}  # fmt: skip


def _build(variant="mha", dtype=jnp.float32, **overrides):
    """The variant's layer (``overrides`` may not change its weight shapes)."""
    fields = {**VARIANTS[variant][0], **overrides}
    cfg = attentions.DotProductAttention.HParams.config(input_dims=D, num_heads=4)
    if fields.pop("rope", False):
        cfg.rotary_tpl = es.RotaryPositionalEmbedding.HParams.config()
    if fields.pop("qk_norm", False):
        cfg.qk_norm_tpl = RmsNorm.HParams.config()
    for name, value in fields.items():
        setattr(cfg, name, value)
    return ref.build(cfg, dtype)


@functools.cache
def _variables(variant):
    """The variant's (noised) initial weights; read-only."""
    return ref.init_variables(_build(variant), np.zeros((1, 2, D), np.float32))


def _right_paddings(b, t):
    """Row ``i`` has its last ``i + 1`` positions padded (never all of them)."""
    paddings = np.zeros((b, t), np.float32)
    for i in range(b):
        paddings[i, t - 1 - i :] = 1.0
    return paddings


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("b, t", SHAPES)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_numpy(variant, b, t, dtype):
    fields, ref_args = VARIANTS[variant]
    x = ref.normal((b, t, D), scale=2.0)
    paddings = _right_paddings(b, t)
    variables = _variables(variant)
    p = ref.to_numpy(variables["params"])
    if fields.get("combine_qkv"):
        assert p["w_qkv"].shape == (3, D, 4, 2) and "w_q" not in p
    else:
        k, h = fields.get("num_kv_heads", 4), fields.get("dims_per_head", D // 4)
        assert p["w_q"].shape == (D, 4, h) and p["w_k"].shape == p["w_v"].shape == (D, k, h)
    assert ("b_q" in p) == fields.get("use_bias", True)
    assert ("b_post" in p) == fields.get("use_post_bias", fields.get("use_bias", True))
    assert ("query_norm" in p) == fields.get("qk_norm", False)
    assert ("per_dim_scale" in p) == (fields.get("query_scale") == attentions.QueryScale.PER_DIM)

    y = ref.jit_apply(_build(variant, dtype))(variables, x, paddings=paddings)
    assert y.shape == (b, t, D) and y.dtype == dtype
    want = ref.attention(x.astype(np.float64), p, paddings=paddings, **ref_args)
    ref.assert_close(y, want, dtype, tol=1e-4 if dtype == jnp.float32 else None)


def test_logit_cap_and_rope_change_the_output():
    """Both options matter for these inputs, so the tests above can catch them unapplied."""
    x = ref.normal((2, 5, D), scale=2.0).astype(np.float64)
    p = ref.to_numpy(_variables("mha")["params"])
    plain = ref.attention(x, p)
    assert not np.allclose(plain, ref.attention(x, p, logit_cap=1.0), atol=1e-3)
    assert not np.allclose(plain, ref.attention(x, p, use_rope=True), atol=1e-3)


def test_window_and_qk_norms_change_the_output():
    """As above, for the window (T = 7 > 3) and the noised q/k norm scales."""
    x = ref.normal((2, 7, D), scale=2.0).astype(np.float64)
    p = ref.to_numpy(_variables("qk_norm_window_no_post_bias")["params"])
    want = ref.attention(x, p, use_rope=True, window=3)
    assert not np.allclose(want, ref.attention(x, p, use_rope=True), atol=1e-3)
    unnormed = {k: v for k, v in p.items() if k not in ("query_norm", "key_norm")}
    assert not np.allclose(want, ref.attention(x, unnormed, use_rope=True, window=3), atol=1e-3)
    y = ref.jit_apply(_build("qk_norm_window_no_post_bias"))(
        _variables("qk_norm_window_no_post_bias"), x.astype(np.float32)
    )
    ref.assert_close(y, want, jnp.float32, tol=1e-4)


@pytest.mark.parametrize("variant", ["mha", "gqa_rope"])
def test_causal_mask_hides_the_future(variant):
    b, t = SHAPES[0]
    apply = ref.jit_apply(_build(variant))
    variables = _variables(variant)
    x = ref.normal((b, t, D))
    y = np.asarray(apply(variables, x))
    # All tokens real (no padding masks anything): only the causal mask hides the future.
    p = ref.to_numpy(variables["params"])
    want = ref.attention(x.astype(np.float64), p, **VARIANTS[variant][1])
    ref.assert_close(y, want, jnp.float32, tol=1e-4)
    for s in (0, 2):
        x2 = x.copy()
        x2[:, s + 1] += ref.normal((b, D), seed=s + 10)
        y2 = np.asarray(apply(variables, x2))
        np.testing.assert_allclose(y2[:, : s + 1], y[:, : s + 1], rtol=1e-6, atol=1e-6)
        changed = np.abs(y2[:, s + 1 :] - y[:, s + 1 :]).max(axis=-1)
        assert np.all(changed > 1e-4), (s, changed)


def test_rope_positions_are_relative():
    """With RoPE, shifting every position leaves the output as is; spreading them does not."""
    b, t = SHAPES[0]
    apply = ref.jit_apply(_build("gqa_rope"))
    variables = _variables("gqa_rope")
    x = ref.normal((b, t, D))
    positions = np.broadcast_to(np.arange(t), (b, t))
    y = apply(variables, x, positions=positions)
    np.testing.assert_allclose(apply(variables, x), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        apply(variables, x, positions=positions + 17), y, rtol=1e-4, atol=1e-4
    )
    spread = apply(variables, x, positions=positions * 3)
    assert not np.allclose(spread, y, atol=1e-3)


def test_not_causal_sees_the_future():
    apply = ref.jit_apply(_build(is_causal=False))
    variables = _variables("mha")
    x = ref.normal((2, 5, D))
    x2 = x.copy()
    x2[:, -1] += 1.0
    y, y2 = apply(variables, x), apply(variables, x2)
    assert np.all(np.abs(np.asarray(y2 - y)).max(-1) > 1e-4)


@pytest.mark.parametrize("b, t", SHAPES)
def test_gqa_with_all_kv_heads_is_mha(b, t):
    x = ref.normal((b, t, D))
    paddings = _right_paddings(b, t)
    variables = _variables("mha")
    y_mha = ref.jit_apply(_build())(variables, x, paddings=paddings)
    y_gqa = ref.jit_apply(_build(num_kv_heads=4))(variables, x, paddings=paddings)
    np.testing.assert_allclose(y_gqa, y_mha, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("is_causal", [True, False])
def test_padded_keys_are_invisible(is_causal):
    (b, t), n_pad = SHAPES[1], 2
    apply = ref.jit_apply(_build(is_causal=is_causal))
    variables = _variables("mha")
    x = ref.normal((b, t, D))
    paddings = np.zeros((b, t), np.float32)
    paddings[:, t - n_pad :] = 1.0
    y = np.asarray(apply(variables, x, paddings=paddings))

    x2 = x.copy()
    x2[:, t - n_pad :] = ref.normal((b, n_pad, D), seed=5, scale=10.0)
    y2 = np.asarray(apply(variables, x2, paddings=paddings))
    np.testing.assert_allclose(y2[:, : t - n_pad], y[:, : t - n_pad], rtol=1e-6, atol=1e-6)
    # ... and equal to attention over the unpadded prefix alone.
    y_short = apply(variables, x[:, : t - n_pad])
    np.testing.assert_allclose(y[:, : t - n_pad], y_short, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_causal", [True, False])
def test_segments_attend_within_themselves(is_causal):
    segment_ids = np.array([[1, 1, 2, 2, 2], [3, 4, 4, 4, 4]], np.int32)
    apply = ref.jit_apply(_build(is_causal=is_causal))
    variables = _variables("mha")
    x = ref.normal(segment_ids.shape + (D,))
    y = np.asarray(apply(variables, x, segment_ids=segment_ids))
    for seg in np.unique(segment_ids):
        # The segment alone: every other token is replaced by noise and padded away.
        inside = segment_ids == seg
        noise = ref.normal(x.shape, seed=int(seg), scale=10.0)
        alone = apply(
            variables,
            np.where(inside[..., None], x, noise),
            paddings=(~inside).astype(np.float32),
        )
        np.testing.assert_allclose(np.asarray(alone)[inside], y[inside], rtol=1e-5, atol=1e-5)
    p = ref.to_numpy(variables["params"])
    want = ref.attention(x.astype(np.float64), p, causal=is_causal, segment_ids=segment_ids)
    ref.assert_close(y, want, jnp.float32, tol=1e-4)


def test_attention_mask():
    paddings = np.array([[0, 0, 1], [0, 1, 1]], np.float32)
    segment_ids = np.array([[1, 2, 2], [1, 1, 1]], np.int32)
    mask = attentions.attention_mask(
        3,
        3,
        causal=True,
        key_paddings=paddings,
        query_segment_ids=segment_ids,
        key_segment_ids=segment_ids,
    )
    assert mask.shape == (2, 1, 1, 3, 3) and mask.dtype == bool
    want = np.tril(np.ones((3, 3), bool))[None] & (paddings < 0.5)[:, None, :]
    want &= segment_ids[:, :, None] == segment_ids[:, None, :]
    np.testing.assert_array_equal(mask[:, 0, 0], want)
    assert attentions.attention_mask(2, 3, causal=False).shape == (1, 1, 1, 2, 3)


def test_dropout():
    x = ref.normal((2, 5, D))
    variables = _variables("mha")
    apply = ref.jit_apply(_build(atten_dropout_prob=0.5))
    no_dropout = ref.jit_apply(_build())
    reference = no_dropout(variables, x)

    # Eval: identical to a layer without dropout.
    np.testing.assert_array_equal(apply(variables, x), reference)
    np.testing.assert_array_equal(apply(variables, x, train=False), reference)
    # Train: needs the 'dropout' RNG, and changes the output.
    with pytest.raises(flax.errors.InvalidRngError, match="dropout"):
        apply(variables, x, train=True)
    key = jax.random.key(7, impl="rbg")
    y1 = apply(variables, x, train=True, rngs={"dropout": key})
    assert not np.allclose(y1, reference, atol=1e-3)
    np.testing.assert_array_equal(y1, apply(variables, x, train=True, rngs={"dropout": key}))
    y2 = apply(variables, x, train=True, rngs={"dropout": jax.random.key(8, impl="rbg")})
    assert not np.allclose(y1, y2, atol=1e-3)
    # A zero rate trains without an RNG and without change.
    np.testing.assert_array_equal(no_dropout(variables, x, train=True), reference)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"num_kv_heads": 3}, "multiple"),
        ({"num_kv_heads": 2, "combine_qkv": True}, "combine"),
        ({"query_scale": "per-dim"}, r"query_scale='per-dim': give a number .* per_dim, in_init"),
        ({"query_scale": True}, "query_scale=True: give a number"),
    ],
)
def test_invalid_head_configs_raise(fields, match):
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(_build(**fields).init, jax.random.key(0), jnp.ones((1, 2, D)))


def test_the_old_query_scale_flags_name_the_one_field():
    cfg = attentions.DotProductAttention.HParams.config(input_dims=D, num_heads=4)
    with pytest.raises(AttributeError, match=r"per_dim_scale is now query_scale=QueryScale"):
        cfg.per_dim_scale = True
    with pytest.raises(AttributeError, match=r"query_scale_in_init is now query_scale="):
        cfg.query_scale_in_init = True


def test_the_values_fdl_set_gives_are_read_as_the_members():
    """``--fdl_set`` gives strings ('per_dim', 'xla'): the same layer as the members."""
    x = ref.normal((2, 5, D))
    variables = _variables("per_dim_scale")
    want = ref.jit_apply(_build("per_dim_scale"))(variables, x)
    for name in ("per_dim", "PER_DIM"):
        spelled = _build("per_dim_scale", query_scale=name, attention_impl="xla")
        ref.assert_close(ref.jit_apply(spelled)(variables, x), want, jnp.float32, tol=1e-5)
    plain = ref.jit_apply(_build())(_variables("mha"), x)  # None: praxis' spelling of the default.
    none = ref.jit_apply(_build(query_scale=None))(_variables("mha"), x)
    np.testing.assert_array_equal(none, plain)
