"""Pure-numpy (float64) references of the praxis_lite layers, and the helpers their tests share.

Every reference takes numpy arrays and the layer's own weights (read back from the
variables that ``init`` returned) and is written from the textbook definition, not
from the layer's code. Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``N`` query
heads, ``K`` key/value heads, ``H`` dims per head, ``V`` vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

import praxis_lite
from praxis_lite.config import set_dtypes

# fp32 compute with a tight tolerance; bf16 compute (fp32 weights) with a loose one.
DTYPES = [pytest.param(jnp.float32, id="fp32"), pytest.param(jnp.bfloat16, id="bf16")]
_TOLERANCE = {np.dtype(jnp.float32): 2e-5, np.dtype(jnp.bfloat16): 3e-2}


# --- building, weights, comparing --------------------------------------------------
def build(cfg: Any, fprop_dtype: Any = jnp.float32) -> nn.Module:
    """Instantiates ``cfg`` with ``fprop_dtype`` set on every layer config of the tree."""
    return praxis_lite.instantiate(set_dtypes(cfg, fprop_dtype=fprop_dtype))


# Test-only XLA options: unoptimized CPU code compiles 2-3x faster, and the references
# are checked to rounding level either way.
_FAST_COMPILE = {"xla_backend_optimization_level": 0}


def init_variables(
    layer: nn.Module, *args: Any, seed: int = 0, noise: float = 0.2, **kwargs: Any
) -> dict[str, Any]:
    """``layer.init(key, *args, **kwargs)`` unboxed to numpy, plus ``noise`` * N(0, 1).

    The noise turns the zero biases and unit scales of a fresh layer into generic
    values, so that a reference that ignored them would fail. The init is jitted with
    an ``rbg`` key: compiling the default threefry generator eagerly costs about a
    second per weight shape on a small CPU. Weights depend neither on the input shape
    nor on ``fprop_dtype``, so tests may init once and apply at several of both.
    """
    init = jax.jit(
        lambda key: nn.unbox(layer.init(key, *args, **kwargs)), compiler_options=_FAST_COMPILE
    )
    variables = init(jax.random.key(seed, impl="rbg"))
    rng = np.random.default_rng(seed + 1)
    return jax.tree_util.tree_map(
        lambda w: (np.asarray(w) + noise * rng.standard_normal(w.shape)).astype(w.dtype),
        variables,
    )


def jit_apply(layer: nn.Module, static_argnames: tuple[str, ...] = ("train",)) -> Any:
    """``layer.apply`` jitted: one compile of a whole layer is cheaper than one per op."""
    return fast_jit(layer.apply, static_argnames=static_argnames)


def fast_jit(fn: Any, **jit_kwargs: Any) -> Any:
    """``jax.jit(fn)`` compiled with the test-only fast XLA options."""
    return jax.jit(fn, compiler_options=_FAST_COMPILE, **jit_kwargs)


def to_numpy(tree: Any) -> Any:
    """The arrays of ``tree`` as float64 numpy arrays (the references' inputs)."""
    return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def normal(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Float32 Gaussian test data."""
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def assert_close(got: Any, want: np.ndarray, fprop_dtype: Any, tol: float | None = None) -> None:
    """Checks ``got`` (computed in ``fprop_dtype``) against a float64 reference.

    Relative tolerance ``tol`` (per dtype by default), plus an absolute slack of ``tol``
    times the reference's largest magnitude for entries near zero.
    """
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    tol = _TOLERANCE[np.dtype(fprop_dtype)] if tol is None else tol
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


# --- activations --------------------------------------------------------------------
def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


# --- normalizations -----------------------------------------------------------------
def layer_norm(
    x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None, epsilon: float = 1e-6
) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + epsilon)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


def rms_norm(x: np.ndarray, scale: np.ndarray, epsilon: float = 1e-6) -> np.ndarray:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + epsilon) * scale


# --- softmax and cross-entropy -----------------------------------------------------
def logsumexp(logits: np.ndarray) -> np.ndarray:
    """``log(sum(exp(logits)))`` over the last axis (``-inf`` entries are fine)."""
    m = logits.max(-1, keepdims=True)
    return (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]


def softmax(logits: np.ndarray) -> np.ndarray:
    return np.exp(logits - logsumexp(logits)[..., None])


def cross_entropy(
    logits: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    label_smoothing: float = 0.0,
    z_loss_weight: float = 0.0,
) -> dict[str, np.ndarray]:
    """Weighted softmax cross-entropy with uniform label smoothing and PaLM's z-loss."""
    num_classes = logits.shape[-1]
    log_z = logsumexp(logits)
    log_probs = logits - log_z[..., None]
    targets = np.eye(num_classes)[labels] * (1.0 - label_smoothing) + label_smoothing / num_classes
    per_example = -(targets * log_probs).sum(-1)
    total_weight = weights.sum()
    denominator = max(total_weight, 1e-8)
    log_pplx = (per_example * weights).sum() / denominator
    z_loss = (log_z**2 * weights).sum() / denominator
    return dict(
        log_probs=log_probs,
        per_token_xent=per_example,
        total_weight=total_weight,
        log_pplx=log_pplx,
        z_loss=z_loss,
        total_loss=log_pplx + z_loss_weight * z_loss,
    )


# --- positions ----------------------------------------------------------------------
def sinusoids(positions: np.ndarray, dims: int, max_timescale: float = 1e4) -> np.ndarray:
    """``[..., dims]``: sin of all frequencies, then cos; timescales 1 .. ``max_timescale``."""
    n = dims // 2
    timescales = max_timescale ** (np.arange(n) / max(n - 1, 1))
    angles = positions[..., None] / timescales
    signal = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
    if dims % 2:
        signal = np.concatenate([signal, np.zeros(signal.shape[:-1] + (1,))], axis=-1)
    return signal


def rope(x: np.ndarray, positions: np.ndarray, max_timescale: float = 1e4) -> np.ndarray:
    """RoPE on ``x [B, T, N, H]``: feature ``i`` pairs with ``i + H/2``.

    The pair is rotated by ``position / max_timescale ** (2i / H)``; positions ``[B|1, T]``.
    """
    h = x.shape[-1]
    half = h // 2
    angles = positions[:, :, None, None] / max_timescale ** (2.0 * np.arange(half) / h)
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


# --- attention ----------------------------------------------------------------------
def attention(
    x: np.ndarray,
    p: dict[str, np.ndarray],
    *,
    causal: bool = True,
    paddings: np.ndarray | None = None,
    segment_ids: np.ndarray | None = None,
    logit_cap: float = 0.0,
    use_rope: bool = False,
    window: int | None = None,
    query_scale: float | None = None,
) -> np.ndarray:
    """Multi-head self-attention ``[B, T, D] -> [B, T, D]`` with the DotProductAttention weights.

    Grouped-query heads: each of the ``K`` key/value heads is repeated for its ``N / K``
    consecutive query heads. Queries with no visible key are not used by the tests. With
    ``p['query_norm']``/``p['key_norm']``, q and k are RMS-normalised per head before
    RoPE (Qwen3's); ``window``: query ``t`` sees keys ``t - window < s <= t``.
    """
    if "w_qkv" in p:
        w_q, w_k, w_v = p["w_qkv"]
    else:
        w_q, w_k, w_v = p["w_q"], p["w_k"], p["w_v"]
    q = np.einsum("btd,dnh->btnh", x, w_q)
    k = np.einsum("btd,dkh->btkh", x, w_k)
    v = np.einsum("btd,dkh->btkh", x, w_v)
    if "b_q" in p:
        q, k, v = q + p["b_q"], k + p["b_k"], v + p["b_v"]
    if "query_norm" in p:
        q, k = rms_norm(q, p["query_norm"]["scale"]), rms_norm(k, p["key_norm"]["scale"])
    b, t, n, h = q.shape
    if use_rope:
        positions = np.arange(t, dtype=np.float64)[None, :]
        q, k = rope(q, positions), rope(k, positions)
    if "per_dim_scale" in p:  # praxis's PerDimScale: softplus(s) / softplus(0) per head dim
        q = q * np.log1p(np.exp(p["per_dim_scale"])) / math.log(2.0)
    group = n // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scale = 1 / math.sqrt(h) if query_scale is None else query_scale
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
    if logit_cap > 0:
        logits = logit_cap * np.tanh(logits / logit_cap)
    mask = np.ones((b, t, t), dtype=bool)
    if causal:
        mask &= np.tril(np.ones((t, t), dtype=bool))
    if window is not None:
        mask &= np.arange(t)[:, None] - np.arange(t)[None, :] < window
    if paddings is not None:
        mask &= (paddings < 0.5)[:, None, :]
    if segment_ids is not None:
        mask &= segment_ids[:, :, None] == segment_ids[:, None, :]
    logits = np.where(mask[:, None], logits, -np.inf)
    probs = softmax(logits)
    encoded = np.einsum("bnts,bsnh->btnh", probs, v)
    out = np.einsum("btnh,nhd->btd", encoded, p["w_post"])
    if "b_post" in p:
        out = out + p["b_post"]
    return out


# --- transformer pieces --------------------------------------------------------------
def transformer_ffn(
    x: np.ndarray, p: dict[str, Any], activation: Any = relu, gated: bool = False
) -> np.ndarray:
    """Pre-norm feed-forward with residual, with the TransformerFeedForward weights."""
    h_in = layer_norm(x, p["layer_norm"].get("scale"), p["layer_norm"].get("bias"))
    h = h_in @ p["ffn_layer1"]["w"]
    if "bias1" in p:
        h = h + p["bias1"]["b"]
    h = activation(h)
    if gated:
        h = h * (h_in @ p["ffn_layer1_gate"]["w"])
    out = h @ p["ffn_layer2"]["w"]
    if "bias2" in p:
        out = out + p["bias2"]["b"]
    return x + out
