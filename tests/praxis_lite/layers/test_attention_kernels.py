"""The fused attention kernels against the einsum attention of ``DotProductAttention.attend``.

The reference below is ``attend``'s computation (q already scaled, float32 einsum logits,
``cap * tanh(l / cap)``, a large negative where masked, softmax, einsum) and the masks
come from ``attentions.attention_mask``, so each kernel is checked against what the layer
computes today: forward and the gradients of a scalar loss wrt q, k and v. Splash runs in
the Pallas interpreter (slow: shapes are the smallest its 128-lane tiles allow).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import attention_kernels as ak
from praxis_lite.layers.attentions import attention_mask

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_TILES_128 = ak.SplashBlockSizes(*(128,) * 8)  # Capped at T = S = 256 below: none changes.


def _reference(q, k, v, mask5d, logit_cap=0.0):
    """``attend``: q ``[B, T, N, H]`` (scaled), k/v ``[B, S, K, H]``, mask ``[B|1, 1, 1, T,
    S]`` -> ``[B, T, N, H]``."""
    b, t, n, h = q.shape
    kv_heads = k.shape[2]
    grouped = q.reshape(b, t, kv_heads, n // kv_heads, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", grouped, k).astype(jnp.float32)
    if logit_cap > 0:
        logits = logit_cap * jnp.tanh(logits / logit_cap)
    logits = jnp.where(mask5d, logits, _MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(b, t, n, h)


def _qkv(b, t, n, kv_heads, h, seed=0):
    """Random q ``[B, T, N, H]`` (scaled by ``1/sqrt(H)``), k and v ``[B, T, K, H]``
    (numpy's generator: eager jax.random ops each compile, seconds in all)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, n, h)) / np.sqrt(h)
    k, v = rng.standard_normal((2, b, t, kv_heads, h))
    return tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v))


def _packed_segments(b, t, first):
    """``[B, T]`` ids: 2 packed segments per row, the first ``first + row`` tokens long."""
    pos = np.arange(t)[None, :]
    return jnp.asarray(1 + (pos >= first + np.arange(b)[:, None]), jnp.int32)


def _value_and_grads(fn, q, k, v):
    """``fn(q, k, v)`` and the gradients of ``sum(fn(q, k, v) * w)`` (``w`` fixed random)
    wrt q, k and v, in one jitted program (op by op, tiny grads take seconds to dispatch)."""

    @jax.jit
    def run(q, k, v):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(jax.random.normal(jax.random.key(7), out.shape, out.dtype))

    return run(q, k, v)


def _assert_close(got, want, atol):
    """Outputs and each of the three gradients agree to ``atol`` (gradients: relative to
    their own largest entry)."""
    f32 = lambda x: np.asarray(x, np.float32)
    (out, grads), (ref_out, ref_grads) = got, want
    np.testing.assert_allclose(f32(out), f32(ref_out), atol=atol, rtol=0)
    for name, g, rg in zip("qkv", grads, ref_grads, strict=True):
        scale = float(jnp.abs(rg).max())
        np.testing.assert_allclose(f32(g), f32(rg), atol=atol * scale, rtol=0, err_msg=f"d{name}")


def test_dense_mask_drops_the_kv_and_group_axes():
    mask5d = attention_mask(4, 6, causal=True, key_paddings=jnp.zeros((3, 6)))
    assert ak.dense_mask(mask5d).shape == (3, 1, 4, 6)
    with pytest.raises(ValueError, match="B|1, 1, 1, T, S"):
        ak.dense_mask(jnp.ones((3, 2, 1, 4, 6), bool))


@pytest.mark.slow
def test_xla_attention_matches_einsum_causal_segments_gqa_padding():
    """B=2, T=8, N=4 query heads on K=2 kv heads, 2 packed segments per row, the last key
    of row 1 padded: float32, to ~1e-5."""
    q, k, v = _qkv(2, 8, 4, 2, 8)
    segments = _packed_segments(2, 8, first=4)
    paddings = jnp.zeros((2, 8)).at[1, -2:].set(1.0)
    mask5d = attention_mask(
        8,
        8,
        causal=True,
        key_paddings=paddings,
        query_segment_ids=segments,
        key_segment_ids=segments,
    )
    got = _value_and_grads(
        lambda *a: ak.xla_attention(*a, mask=ak.dense_mask(mask5d), implementation="xla"),
        q,
        k,
        v,
    )
    _assert_close(got, _value_and_grads(lambda *a: _reference(*a, mask5d), q, k, v), 1e-5)


@pytest.mark.slow
def test_xla_attention_query_that_sees_no_key_averages_the_values():
    """A fully masked row is finite (the mask is a large negative, not -inf): the uniform
    average of the values, as in ``attend``; no NaN in the gradients either."""
    q, k, v = _qkv(1, 4, 2, 2, 8)
    mask = jnp.ones((1, 1, 4, 4), bool).at[0, 0, 2].set(False)
    out, grads = _value_and_grads(lambda *a: ak.xla_attention(*a, mask=mask), q, k, v)
    np.testing.assert_allclose(out[0, 2], v[0].mean(axis=0), atol=1e-6)
    assert all(bool(jnp.isfinite(g).all()) for g in grads)


SPLASH_CASES = {
    # name: (splash_attention kwargs, attention_mask kwargs besides segments, segmented)
    "causal_segments_gqa_cap": ({"causal": True, "logit_cap": 50.0}, {"causal": True}, True),
    "causal_window": ({"causal": True, "window": 48}, {"causal": True, "window": 48}, False),
    "window_not_causal": ({"causal": False, "window": 40}, {"causal": False, "window": 40}, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SPLASH_CASES))
def test_splash_interpret_matches_einsum(case):
    """B=2, T=S=256 with 128-wide tiles, N=4 on K=2, H=32: forward and gradients."""
    kwargs, mask_kwargs, segmented = SPLASH_CASES[case]
    q, k, v = _qkv(2, 256, 4, 2, 32)
    segments = _packed_segments(2, 256, first=100) if segmented else None
    ids = {"q_segment_ids": segments, "kv_segment_ids": segments}
    mask5d = attention_mask(
        256, 256, query_segment_ids=segments, key_segment_ids=segments, **mask_kwargs
    )
    cap = kwargs.get("logit_cap", 0.0)

    def splash(*a):
        return ak.splash_attention(*a, **kwargs, **ids, block_sizes=_TILES_128, interpret=True)

    got = _value_and_grads(splash, q, k, v)
    _assert_close(got, _value_and_grads(lambda *a: _reference(*a, mask5d, cap), q, k, v), 2e-5)


@pytest.mark.slow
def test_splash_under_shard_map_equals_unsharded():
    """Batch over 'data' (2), query and kv heads over 'model' (2) on 4 of the 8 CPU
    devices: forward and gradients as on one device."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    q, k, v = _qkv(2, 256, 4, 2, 32, seed=1)
    segments = _packed_segments(2, 256, first=130)
    kwargs = {
        "causal": True,
        "q_segment_ids": segments,
        "kv_segment_ids": segments,
        "block_sizes": _TILES_128,
        "interpret": True,
    }
    sharded = lambda *a: ak.splash_attention(
        *a, **kwargs, mesh=mesh, batch_axes=("data",), head_axes=("model",)
    )
    want = _value_and_grads(lambda *a: ak.splash_attention(*a, **kwargs), q, k, v)
    _assert_close(_value_and_grads(sharded, q, k, v), want, 1e-6)


def test_splash_rejects_kv_heads_that_do_not_split():
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    q, k, v = _qkv(2, 256, 4, 2, 32)
    with pytest.raises(ValueError, match=r"kv heads \(2\) must divide by the 4 shards"):
        ak.splash_attention(q, k, v, causal=True, mesh=mesh, head_axes=("model",))


def test_splash_block_sizes_default_to_maxtext_and_cap_at_the_lengths():
    sizes = ak.SplashBlockSizes()
    assert set(vars(sizes).values()) == {512}
    capped = sizes.capped(256, 384)
    assert (capped.block_q, capped.block_q_dkv, capped.block_q_dq) == (256, 256, 256)
    assert (capped.block_kv, capped.block_kv_compute, capped.block_kv_dkv) == (384, 384, 384)
    assert (capped.block_kv_dkv_compute, capped.block_kv_dq) == (384, 384)


@pytest.mark.parametrize(
    "args, reason",
    [
        ((1024, 1024, ak.SplashBlockSizes(), 0.0, False, 8, 4), None),
        ((256, 320, ak.SplashBlockSizes(), 0.0, False, 8, 1), "block_kv=320 (capped)"),
        ((64, 64, ak.SplashBlockSizes(), 0.0, False, 8, 1), "multiple of 128"),
        ((1024, 1280, ak.SplashBlockSizes(), 0.0, False, 8, 1), "key length 1280"),
        ((1024, 1024, ak.SplashBlockSizes(block_kv_compute=256), 0.0, False, 8, 1), None),
        ((1024, 1024, ak.SplashBlockSizes(block_kv=256), 0.0, False, 8, 1), "divide block_kv"),
        ((1024, 1024, ak.SplashBlockSizes(), 0.1, False, 8, 1), "dropout"),
        ((1024, 1024, ak.SplashBlockSizes(), 0.0, True, 8, 1), "bias"),
        ((1024, 1024, ak.SplashBlockSizes(), 0.0, False, 2, 4), "split evenly 4 ways"),
    ],
)
def test_splash_unsupported_reasons(args, reason):
    got = ak.splash_unsupported(*args)
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize(
    "args, reason",
    [
        ((jnp.bfloat16, 128, 0.0, 0.0, False, False), None),
        ((jnp.float16, 256, 0.0, 0.0, False, False), None),
        ((jnp.float32, 128, 0.0, 0.0, False, False), "not float32"),
        ((jnp.bfloat16, 100, 0.0, 0.0, False, False), "not 100"),
        ((jnp.bfloat16, 512, 0.0, 0.0, False, False), "<= 256"),
        ((jnp.bfloat16, 128, 50.0, 0.0, False, False), "logit cap"),
        ((jnp.bfloat16, 128, 0.0, 0.1, False, False), "dropout"),
        ((jnp.bfloat16, 128, 0.0, 0.0, True, False), "segment ids"),
        ((jnp.bfloat16, 128, 0.0, 0.0, False, True), "bias"),
    ],
)
def test_cudnn_unsupported_reasons(args, reason):
    got = ak.cudnn_unsupported(*args)
    assert got is None if reason is None else reason in got


def test_cudnn_attention_raises_without_cudnn():
    """On CPU, jax refuses while tracing (the integration never calls it there)."""
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(1, 8, 2, 2, 16))
    with pytest.raises(RuntimeError, match="cuDNN is not detected"):
        ak.cudnn_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="window needs causal"):
        ak.cudnn_attention(q, k, v, causal=False, window=4)
