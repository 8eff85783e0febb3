"""The simplest decoder-only LM train step in plain JAX: the baseline paxlite is timed against.

Written here from scratch, sharing no code with paxlite or praxis_lite: a dict of
arrays, one jitted function. Embedding gather scaled by ``sqrt(D)``; a ``lax.scan``
over pre-LayerNorm blocks (LayerNorm gains only, no biases anywhere) with one einsum for
q/k/v, causal softmax attention, the output projection and a GELU MLP (tanh form, as
praxis's); a final LayerNorm; the tied output projection (``x @ table^T``); optax's
integer-label softmax cross-entropy (mean over tokens); ``optax.adam``.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``F`` hidden dims, ``N`` heads, ``H``
dims per head, ``V`` vocabulary, ``L`` layers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
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


def init_params(shape: Shape, seed: int = 0) -> dict[str, Any]:
    """``emb [V, D]``, ``blocks`` (each leaf stacked over ``L``), ``final_ln [D]``; float32."""
    layers, d, f = shape.num_layers, shape.model_dims, shape.hidden_dims
    n, h = shape.num_heads, shape.dims_per_head
    rng = np.random.default_rng(seed)

    def normal(*dims: int, fan_in: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(dims, dtype=np.float32) / math.sqrt(fan_in))

    blocks = {
        "ln1": jnp.ones((layers, d)),
        "qkv": normal(layers, d, 3, n, h, fan_in=d),
        "out": normal(layers, n, h, d, fan_in=n * h),
        "ln2": jnp.ones((layers, d)),
        "w1": normal(layers, d, f, fan_in=d),
        "w2": normal(layers, f, d, fan_in=f),
    }
    return {"emb": normal(shape.vocab_size, d, fan_in=d), "blocks": blocks, "final_ln": jnp.ones(d)}


def _layer_norm(x: jax.Array, gain: jax.Array, eps: float = 1e-6) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gain


def _block(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """One pre-LN block: ``[B, T, D] -> [B, T, D]``."""
    h = _layer_norm(x, p["ln1"])
    q, k, v = jnp.unstack(jnp.einsum("btd,dcnh->cbtnh", h, p["qkv"]))
    logits = jnp.einsum("btnh,bsnh->bnts", q / math.sqrt(q.shape[-1]), k)
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1)
    x = x + jnp.einsum("bnts,bsnh,nhd->btd", probs, v, p["out"])
    h = _layer_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["w1"], approximate=True) @ p["w2"]


def loss_fn(params: dict[str, Any], ids: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy of ``ids [B, T]`` against ``labels [B, T]``."""
    emb = params["emb"]
    x = emb[ids] * math.sqrt(emb.shape[1])
    x, _ = jax.lax.scan(lambda x, p: (_block(x, p), None), x, params["blocks"])
    logits = jnp.einsum("btd,vd->btv", _layer_norm(x, params["final_ln"]), emb)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_train_step(learning_rate: float = 1e-3) -> tuple[optax.GradientTransformation, Any]:
    """``(tx, step)``: ``step(params, opt_state, ids, labels) -> (params, opt_state, loss)``,
    jitted, params and optimizer state donated."""
    tx = optax.adam(learning_rate)

    def step(params, opt_state, ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return tx, jax.jit(step, donate_argnums=(0, 1))


class PlainRunner:
    """Holds the state; :meth:`run` takes steps on the batches ``next_batch()`` gives."""

    def __init__(self, shape: Shape, next_batch: Any, seed: int = 0):
        self.params = init_params(shape, seed)
        tx, self.step = make_train_step()
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
