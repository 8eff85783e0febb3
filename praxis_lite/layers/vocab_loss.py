"""Softmax cross-entropy over a vocabulary, reading the ``[..., V]`` logits as few times as
the math needs, or never holding them whole.

Shapes: ``V`` classes (the vocabulary), ``D`` model dims, ``[...]`` the leading (token)
dims, ``T`` the last of them (time), ``C`` chunks.

One pass over the logits finds each token's max; a second sums ``exp(logit - max)``; the
label's logit is gathered (one value per token). The max serves the accuracy too: a token
is correct when its label's logit equals the max (a tie counts as correct), so no separate
argmax reads the logits again. The backward pass is one more pass (a custom VJP): the
softmax is recomputed from the logits and ``log Z``, and the logits' gradient written, so no
``[..., V]`` probabilities are kept between the passes. The softmax bias and the tanh cap
are applied inside those passes, on the projection's raw output. The gradient of the bias
is a product with ones (a column sum that XLA's CPU reduction does several times slower).

With ``num_chunks = C > 1`` the output projection runs inside the loss, over ``C`` chunks
of the time axis in a ``lax.scan`` whose chunks are recomputed in the backward pass: at
most one chunk's ``[..., T / C, V]`` logits exist at a time (MaxText's
``num_vocab_tiling``), for one more projection matmul per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from praxis_lite.py_utils import NestedMap

#: ``project(x [..., D], kernel) -> raw logits [..., V]``: the output projection's matmul.
Projection = Callable[[jax.Array, jax.Array], jax.Array]


def capped_logits(raw: jax.Array, bias: jax.Array | None, cap: float) -> jax.Array:
    """``cap * tanh((raw + bias) / cap)`` (no cap if ``cap <= 0``) in float32: ``[..., V]``."""
    return soft_cap(_biased(raw, bias), cap)


def _biased(raw: jax.Array, bias: jax.Array | None) -> jax.Array:
    """``raw + bias`` in float32 (each value one float32 add, whichever path computes it)."""
    logits = raw.astype(jnp.float32)
    return logits if bias is None else logits + bias.astype(jnp.float32)


def soft_cap(logits: jax.Array, cap: float) -> jax.Array:
    """``cap * tanh(logits / cap)``, in the logits' dtype; the logits as they are if
    ``cap <= 0``."""
    return cap * jnp.tanh(logits / cap) if cap > 0 else logits


def _label_logit(raw: jax.Array, bias: jax.Array | None, labels: jax.Array) -> jax.Array:
    """Each token's uncapped logit of its label, ``[...]`` float32: a gather of one value
    per token (no pass over ``[..., V]``)."""
    picked = jnp.take_along_axis(raw, labels[..., None], axis=-1)[..., 0]
    return _biased(picked, None if bias is None else jnp.take(bias, labels))


def _sum_over_tokens(x: jax.Array) -> jax.Array:
    """``x [..., V] -> [V]``: the sum over the tokens as a product with ones (a column sum;
    XLA's CPU reduction over the leading axes is several times slower)."""
    ones = jnp.ones(x.shape[:-1], x.dtype)
    return jnp.tensordot(ones, x, axes=x.ndim - 1)


def _is_label(labels: jax.Array, num_classes: int) -> jax.Array:
    """``[..., V]`` bool, true at each token's label (no one-hot floats materialised)."""
    classes = lax.broadcasted_iota(jnp.int32, labels.shape + (num_classes,), labels.ndim)
    return labels[..., None] == classes


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def token_stats(
    raw: jax.Array,
    bias: jax.Array | None,
    labels: jax.Array,
    cap: float,
    label_smoothing: float,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per token, from the projection's raw output ``raw [..., V]`` (any float dtype):

    Returns:
      ``(log_z, target_logit, correct)``, each ``[...]`` float32: ``log Z`` of the capped
      logits; the label's logit, or with label smoothing ``a`` the target-weighted logit
      ``(1 - a) * logit[label] + a * mean(logits)`` (so ``xent = log_z - target_logit``);
      1.0 where the label's logit is the max (ties count as correct; no gradient).
    """
    return _token_stats_fwd(raw, bias, labels, cap, label_smoothing)[0]


def _token_stats_fwd(raw, bias, labels, cap, label_smoothing):
    # The cap is monotonic: the max and the accuracy are taken before it, on the same
    # float32 sums for the label and for the max, so a label with the max is counted.
    uncapped = _biased(raw, bias)
    max_uncapped = jnp.max(uncapped, axis=-1)
    label_uncapped = _label_logit(raw, bias, labels)
    correct = (label_uncapped >= max_uncapped).astype(jnp.float32)
    shift = soft_cap(max_uncapped, cap)[..., None]
    logits = soft_cap(uncapped, cap)
    log_z = shift[..., 0] + jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1))
    target_logit = label_logit = soft_cap(label_uncapped, cap)
    if label_smoothing:  # Targets (1 - a) * one_hot + a / V, as optax.smooth_labels.
        mean_logit = jnp.mean(logits, axis=-1)
        target_logit = (1.0 - label_smoothing) * label_logit + label_smoothing * mean_logit
    return (log_z, target_logit, correct), (raw, bias, labels, log_z)


def _token_stats_bwd(cap, label_smoothing, residuals, cotangents):
    raw, bias, labels, log_z = residuals
    d_log_z, d_target, _ = cotangents  # `correct` is piecewise constant: no gradient.
    logits = capped_logits(raw, bias, cap)
    num_classes = raw.shape[-1]
    target = jnp.where(_is_label(labels, num_classes), 1.0 - label_smoothing, 0.0)
    target = target + label_smoothing / num_classes
    probs = jnp.exp(logits - log_z[..., None])
    d_logits = d_log_z[..., None] * probs + d_target[..., None] * target
    if cap > 0:  # d(cap * tanh(z / cap)) / dz = 1 - tanh^2.
        d_logits = d_logits * (1.0 - jnp.square(logits / cap))
    d_bias = None
    if bias is not None:
        d_bias = _sum_over_tokens(d_logits).astype(bias.dtype)
    return d_logits.astype(raw.dtype), d_bias, None


token_stats.defvjp(_token_stats_fwd, _token_stats_bwd)


def chunked_token_stats(
    x: jax.Array,
    kernel: jax.Array,
    project: Projection,
    bias: jax.Array | None,
    labels: jax.Array,
    *,
    cap: float,
    label_smoothing: float,
    num_chunks: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`token_stats` of ``project(x [..., T, D], kernel)``, over ``num_chunks`` chunks
    of ``T`` (one scan step each, recomputed in the backward pass): ``[..., T]`` each.

    The kernel and bias enter the scan in float32, so their gradients sum over the chunks in
    float32.

    Raises:
      ValueError: ``x`` has no time axis, or ``num_chunks`` does not divide ``T``.
    """
    if x.ndim < 3 or x.shape[-2] % num_chunks:
        raise ValueError(
            f"NUM_LOSS_CHUNKS={num_chunks} must divide the sequence length, the time axis of "
            f"the softmax input [..., T, D] of shape {x.shape}; set it to a divisor of "
            f"{x.shape[-2] if x.ndim >= 3 else 'T'} (1: no chunks)."
        )
    time_axis = x.ndim - 2
    compute_dtype = kernel.dtype
    # Closed over by the scan, whose backward pass sums their gradients in their dtype.
    kernel32 = kernel.astype(jnp.float32)
    bias32 = None if bias is None else bias.astype(jnp.float32)

    @jax.checkpoint
    def step(carry: None, xs: tuple[jax.Array, jax.Array]):
        x_chunk, labels_chunk = xs  # Flattened to [tokens, D] as the whole path's.
        raw = project(x_chunk.reshape(-1, x.shape[-1]), kernel32.astype(compute_dtype))
        stats = token_stats(raw, bias32, labels_chunk.reshape(-1), cap, label_smoothing)
        return carry, tuple(s.reshape(labels_chunk.shape) for s in stats)

    chunks = (_split(x, num_chunks, time_axis), _split(labels, num_chunks, time_axis))
    _, stats = lax.scan(step, None, chunks)
    return tuple(_join(s, time_axis) for s in stats)


def _split(a: jax.Array, num_chunks: int, axis: int) -> jax.Array:
    """``[..., T, ...] -> [C, ..., T / C, ...]`` (chunk ``c`` holds times ``c*T/C ...``)."""
    shape = a.shape[:axis] + (num_chunks, a.shape[axis] // num_chunks) + a.shape[axis + 1 :]
    return jnp.moveaxis(a.reshape(shape), axis, 0)


def _join(a: jax.Array, axis: int) -> jax.Array:
    """Inverse of :func:`_split` for ``[C, ..., T / C]`` stats."""
    a = jnp.moveaxis(a, 0, axis)
    return a.reshape(a.shape[:axis] + (-1,) + a.shape[axis + 2 :])


def loss_terms(
    stats: tuple[jax.Array, jax.Array, jax.Array],
    weights: jax.Array,
    z_loss_weight: float = 0.0,
) -> NestedMap:
    """The weighted loss and metrics from :func:`token_stats` and per-token ``weights [...]``,
    under the names of the model contract (``praxis_lite.models.base.loss_metrics``).

    Returns:
      NestedMap with ``per_token_xent [...]``, ``total_weight`` (the summed weights: the
      counted tokens), ``log_pplx`` (weighted mean xent), ``z_loss`` (weighted mean of
      ``log(Z)^2``), ``total_loss`` (``log_pplx + z_loss_weight * z_loss``, the objective)
      and ``accuracy`` (weighted fraction of tokens whose label has the max logit).
    """
    log_z, target_logit, correct = stats
    xent = log_z - target_logit
    weights = weights.astype(jnp.float32)
    total_weight = jnp.sum(weights)
    safe_total = jnp.maximum(total_weight, 1e-8)
    log_pplx = jnp.sum(xent * weights) / safe_total
    z_loss = jnp.sum(jnp.square(log_z) * weights) / safe_total
    return NestedMap(
        per_token_xent=xent,
        total_loss=log_pplx + z_loss_weight * z_loss,
        log_pplx=log_pplx,
        z_loss=z_loss,
        accuracy=jnp.sum(lax.stop_gradient(correct) * weights) / safe_total,
        total_weight=total_weight,
    )
