"""The simplest decoder-only LM train step in plain JAX: the baseline paxlite is timed against.

Written here from scratch, sharing no code with paxlite or praxis_lite: a dict of
arrays, one jitted function. Embedding gather scaled by ``sqrt(D)``; a ``lax.scan``
over pre-LayerNorm blocks (LayerNorm gains only, no biases anywhere) with one einsum for
q/k/v, causal softmax attention, the output projection and a GELU MLP (tanh form, as
praxis's); a final LayerNorm; the tied output projection (``x @ table^T``); optax's
integer-label softmax cross-entropy (mean over tokens); ``optax.adam``.

A Llama-shaped variant is three fields of :class:`Shape`: ``num_kv_heads`` (grouped
k/v heads), ``gated`` (SwiGLU: ``(silu(h W1) * h W3) W2``) and ``rms_norm``; no rotary
positions in either. ``remat`` recomputes each block in the backward pass (plain
``jax.checkpoint``: only the blocks' inputs are kept). ``compute_dtype``
(``make_train_step``) casts the float32 weights to it inside the step (mixed precision:
the logits go back to float32 for the loss).

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``F`` hidden dims, ``N`` heads, ``H``
dims per head, ``V`` vocabulary, ``L`` layers.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class Shape:
    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    dims_per_head: int
    vocab_size: int
    seq_len: int
    batch: int
    num_kv_heads: int | None = None  # None: num_heads (multi-head attention).
    gated: bool = False
    rms_norm: bool = False
    remat: bool = False  # Recompute each block in the backward pass (jax.checkpoint).

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


def init_params(shape: Shape, seed: int = 0) -> dict[str, Any]:
    """``emb [V, D]``, ``blocks`` (each leaf stacked over ``L``), ``final_ln [D]``; float32.
    Drawn with ``jax.random``, so ``jax.eval_shape`` of it costs nothing."""
    layers, d, f = shape.num_layers, shape.model_dims, shape.hidden_dims
    n, k, h = shape.num_heads, shape.kv_heads, shape.dims_per_head
    keys = iter(jax.random.split(jax.random.key(seed), 8))

    def normal(*dims: int, fan_in: int) -> jax.Array:
        return jax.random.normal(next(keys), dims, jnp.float32) / math.sqrt(fan_in)

    blocks = {
        "ln1": jnp.ones((layers, d)),
        "qkv": normal(layers, d, n + 2 * k, h, fan_in=d),  # q, k and v heads in one.
        "out": normal(layers, n, h, d, fan_in=n * h),
        "ln2": jnp.ones((layers, d)),
        "w1": normal(layers, d, f, fan_in=d),
        "w2": normal(layers, f, d, fan_in=f),
    }
    if shape.gated:
        blocks["w3"] = normal(layers, d, f, fan_in=d)
    return {"emb": normal(shape.vocab_size, d, fan_in=d), "blocks": blocks, "final_ln": jnp.ones(d)}


def _layer_norm(x: jax.Array, gain: jax.Array, eps: float = 1e-6) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gain


def _rms_norm(x: jax.Array, gain: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + eps) * gain


def _norm(shape: Shape) -> Any:
    return _rms_norm if shape.rms_norm else _layer_norm


def _block(x: jax.Array, p: dict[str, jax.Array], shape: Shape) -> jax.Array:
    """One pre-norm block: ``[B, T, D] -> [B, T, D]``."""
    norm = _norm(shape)
    h = norm(x, p["ln1"])
    heads, kv_heads = shape.num_heads, shape.kv_heads
    qkv = jnp.einsum("btd,dnh->btnh", h, p["qkv"])
    q, k, v = jnp.split(qkv, [heads, heads + kv_heads], axis=2)
    groups = heads // kv_heads  # Query heads per k/v head.
    q = q.reshape(*q.shape[:2], kv_heads, groups, q.shape[-1])
    logits = jnp.einsum("btkgh,bskh->bkgts", q / math.sqrt(q.shape[-1]), k)
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9).astype(jnp.float32), axis=-1)
    context = jnp.einsum("bkgts,bskh->btkgh", probs.astype(v.dtype), v)
    out = p["out"].reshape(kv_heads, groups, *p["out"].shape[1:])
    x = x + jnp.einsum("btkgh,kghd->btd", context, out)
    h = norm(x, p["ln2"])
    if shape.gated:
        hidden = jax.nn.silu(h @ p["w1"]) * (h @ p["w3"])
    else:
        hidden = jax.nn.gelu(h @ p["w1"], approximate=True)
    return x + hidden @ p["w2"]


def loss_fn(
    params: dict[str, Any],
    ids: jax.Array,
    labels: jax.Array,
    shape: Shape,
    compute_dtype: Any = jnp.float32,
) -> jax.Array:
    """Mean next-token cross-entropy of ``ids [B, T]`` against ``labels [B, T]``; the
    matmuls in ``compute_dtype``, the softmaxes and the loss in float32."""
    params = jax.tree.map(lambda w: w.astype(compute_dtype), params)
    emb = params["emb"]
    x = emb[ids] * math.sqrt(emb.shape[1])
    block = functools.partial(_block, shape=shape)
    if shape.remat:
        block = jax.checkpoint(block)
    x, _ = jax.lax.scan(lambda x, p: (block(x, p), None), x, params["blocks"])
    logits = jnp.einsum("btd,vd->btv", _norm(shape)(x, params["final_ln"]), emb)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels
    ).mean()


def make_train_step(
    shape: Shape, learning_rate: float = 1e-3, compute_dtype: Any = jnp.float32
) -> tuple[optax.GradientTransformation, Any]:
    """``(tx, step)``: ``step(params, opt_state, ids, labels) -> (params, opt_state, loss)``,
    jitted, params and optimizer state donated."""
    tx = optax.adam(learning_rate)

    def step(params, opt_state, ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, labels, shape, compute_dtype)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return tx, jax.jit(step, donate_argnums=(0, 1))


class PlainRunner:
    """Holds the state; :meth:`run` takes steps on the batches ``next_batch()`` gives."""

    def __init__(
        self, shape: Shape, next_batch: Any, seed: int = 0, compute_dtype: Any = jnp.float32
    ):
        self.params = init_params(shape, seed)
        tx, self.step = make_train_step(shape, compute_dtype=compute_dtype)
        self.opt_state = tx.init(self.params)
        self.next_batch = next_batch
        self.tokens_per_step = shape.batch * shape.seq_len

    def run(self, steps: int) -> float:
        """Takes ``steps`` steps; returns the last loss (waits for it)."""
        for _ in range(steps):
            batch = self.next_batch()
            self.params, self.opt_state, loss = self.step(
                self.params, self.opt_state, batch["ids"], batch["labels"]
            )
        return float(loss)
