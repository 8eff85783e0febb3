"""A decoder-only LM train step in plain JAX: the baseline the framework is timed against.

Written here from scratch and sharing no code with paxlite or praxis_lite: a
dict of arrays for parameters, a Python loop over layers, hand-written Adam.
The same architecture as ``tasks.lm`` builds with a plain (not scanned) stack:
pre-norm blocks (LayerNorm with scale and bias), multi-head causal attention
with biases and rotary position embeddings, a GELU feed-forward with biases,
a final LayerNorm, one ``[V, D]`` table for the input lookup (times sqrt(D)) and
the output logits, mean cross-entropy, Adam with weight decay, global-norm
gradient clipping and a linear warm-up.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``F`` hidden dims, ``N``
heads, ``H`` dims per head, ``V`` vocabulary, ``L`` layers.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Shape:
    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    vocab_size: int
    seq_len: int
    batch: int
    dtype: str = "float32"

    @property
    def head_dims(self) -> int:
        return self.model_dims // self.num_heads


def init_params(shape: Shape, seed: int = 0) -> dict:
    """``{'emb': [V, D], 'layers': [per-layer dict], 'final_ln': ...}`` (float32)."""
    d, f, n, h = shape.model_dims, shape.hidden_dims, shape.num_heads, shape.head_dims
    rng = np.random.default_rng(seed)

    def normal(*dims, fan_in):
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32) / math.sqrt(fan_in))

    def ln():
        return {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))}

    layers = []
    for _ in range(shape.num_layers):
        layers.append(
            {
                "ln1": ln(),
                "wq": normal(d, n, h, fan_in=d),
                "wk": normal(d, n, h, fan_in=d),
                "wv": normal(d, n, h, fan_in=d),
                "bq": jnp.zeros((n, h)),
                "bk": jnp.zeros((n, h)),
                "bv": jnp.zeros((n, h)),
                "wo": normal(n, h, d, fan_in=d),
                "bo": jnp.zeros((d,)),
                "ln2": ln(),
                "w1": normal(d, f, fan_in=d),
                "b1": jnp.zeros((f,)),
                "w2": normal(f, d, fan_in=f),
                "b2": jnp.zeros((d,)),
            }
        )
    return {"emb": normal(shape.vocab_size, d, fan_in=d), "layers": layers, "final_ln": ln()}


def _layer_norm(x, p, eps=1e-6):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * p["scale"] + p["bias"]


def _rotary(x, positions, max_timescale=10_000.0):
    """``x [B, T, N, H]`` rotated by position (halves: x1, x2)."""
    half = x.shape[-1] // 2
    timescale = max_timescale ** (2.0 * jnp.arange(half) / x.shape[-1])
    angle = positions[:, :, None, None] / timescale
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _block(x, p, positions, mask):
    h = _layer_norm(x, p["ln1"])
    q = jnp.einsum("btd,dnh->btnh", h, p["wq"]) + p["bq"]
    k = jnp.einsum("btd,dnh->btnh", h, p["wk"]) + p["bk"]
    v = jnp.einsum("btd,dnh->btnh", h, p["wv"]) + p["bv"]
    q, k = _rotary(q, positions), _rotary(k, positions)
    q = q / math.sqrt(q.shape[-1])
    logits = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32)
    logits = jnp.where(mask, logits, -1e30)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    attended = jnp.einsum("bnts,bsnh->btnh", probs, v)
    x = x + jnp.einsum("btnh,nhd->btd", attended, p["wo"]) + p["bo"]
    h = _layer_norm(x, p["ln2"])
    h = jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=False)
    return x + h @ p["w2"] + p["b2"]


def loss_fn(params, ids, labels):
    """Mean next-token cross-entropy of ``ids [B, T]`` against ``labels [B, T]``."""
    t = ids.shape[1]
    emb = params["emb"]
    x = emb[ids] * math.sqrt(emb.shape[1])
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.float32), ids.shape)
    mask = jnp.tril(jnp.ones((t, t), bool))[None, None]
    for layer in params["layers"]:
        x = _block(x, layer, positions, mask)
    x = _layer_norm(x, params["final_ln"])
    logits = jnp.einsum("btd,vd->btv", x, emb).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    return -picked.mean()


def make_train_step(lr=1e-3, b1=0.9, b2=0.99, eps=1e-6, weight_decay=1e-3, clip=1.0, warmup=100):
    """``step(params, mu, nu, count, ids, labels) -> (params, mu, nu, count, loss)``, jitted."""

    def step(params, mu, nu, count, ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, labels)
        leaves = jax.tree_util.tree_leaves(grads)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
        scale = jnp.minimum(1.0, clip / (norm + 1e-6))
        count = count + 1
        rate = lr * jnp.minimum(1.0, count / warmup)
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g * scale, mu, grads)
        nu = jax.tree_util.tree_map(
            lambda v, g: b2 * v + (1 - b2) * jnp.square(g * scale), nu, grads
        )
        fix1, fix2 = 1 - b1**count, 1 - b2**count

        def update(p, m, v):
            return p - rate * ((m / fix1) / (jnp.sqrt(v / fix2) + eps) + weight_decay * p)

        params = jax.tree_util.tree_map(update, params, mu, nu)
        return params, mu, nu, count, loss

    return jax.jit(step, donate_argnums=(0, 1, 2))


class PlainRunner:
    """Holds the state; :meth:`run` takes steps on fresh random tokens (made on the host)."""

    def __init__(self, shape: Shape, seed: int = 0):
        self.shape = shape
        self.params = init_params(shape, seed)
        self.mu = jax.tree_util.tree_map(jnp.zeros_like, self.params)
        self.nu = jax.tree_util.tree_map(jnp.zeros_like, self.params)
        self.count = jnp.zeros((), jnp.float32)
        self.step = make_train_step()
        self.rng = np.random.default_rng(seed)

    def _batch(self):
        s = self.shape
        tokens = self.rng.integers(0, s.vocab_size, size=(s.batch, s.seq_len + 1))
        return jnp.asarray(tokens[:, :-1], jnp.int32), jnp.asarray(tokens[:, 1:], jnp.int32)

    def run(self, steps: int) -> float:
        """Takes ``steps`` steps; returns the last loss (waits for it)."""
        for _ in range(steps):
            ids, labels = self._batch()
            self.params, self.mu, self.nu, self.count, loss = self.step(
                self.params, self.mu, self.nu, self.count, ids, labels
            )
        return float(loss)

    @property
    def tokens_per_step(self) -> int:
        return self.shape.batch * self.shape.seq_len
