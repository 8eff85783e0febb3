"""Fused attention kernels behind one small API, for ``DotProductAttention``.

Every function here computes what ``DotProductAttention.attend`` computes with einsums
(softmax of the masked, optionally capped logits, then the weighted values), with the
same shapes: q ``[B, T, N, H]``, **already scaled** by the caller (no ``1/sqrt(H)``
inside), k/v ``[B, S, K, H]`` with ``K`` dividing ``N``; query head ``n`` reads kv head
``n // (N // K)`` (``attend``'s ``reshape(b, t, K, N // K, h)`` grouping). The output is
``[B, T, N, H]`` in v's dtype.

- :func:`xla_attention`: ``jax.nn.dot_product_attention`` with a dense boolean mask
  (:func:`dense_mask` converts ``attentions.attention_mask``'s layout); runs anywhere.
- :func:`cudnn_attention`: cuDNN's fused kernel (NVIDIA GPUs only), which takes the
  mask's structure (causal, window, key lengths) instead of a dense mask;
  :func:`cudnn_unsupported` says why a configuration can't use it.
- :func:`splash_attention`: the Pallas TPU splash kernel (``interpret=True`` runs it on
  CPU), optionally under ``jax.shard_map`` over batch and heads;
  :func:`splash_unsupported` says why a configuration can't use it.

A query that may see no key at all never gives NaN, but its output differs by path:
``attend`` and XLA (a large finite negative, never ``-inf``) average all S values; splash
averages the values of the key tiles it visits (it skips tiles its static mask empties);
cuDNN gives zeros. Self-attention with causal masks and packed segments has no such row.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec as P

#: The kernels' tiles are multiples of the TPU's 128 lanes (splash's ``NUM_LANES``).
SPLASH_LANES = 128
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_QUERY_BLOCKS = ("block_q", "block_q_dkv", "block_q_dq")  # The others tile the keys.


def dense_mask(mask5d: jax.Array) -> jax.Array:
    """``attentions.attention_mask``'s ``[B|1, 1, 1, T, S]`` -> ``[B|1, 1, T, S]``, which
    broadcasts to ``jax.nn.dot_product_attention``'s ``[B, N, T, S]``."""
    if mask5d.ndim != 5 or mask5d.shape[1:3] != (1, 1):
        raise ValueError(f"dense_mask expects a [B|1, 1, 1, T, S] mask, got {mask5d.shape}.")
    return mask5d[:, 0]


def xla_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None = None,
    implementation: Literal["xla", "cudnn"] = "xla",
) -> jax.Array:
    """``jax.nn.dot_product_attention`` with ``scale=1``: q ``[B, T, N, H]``, k/v ``[B, S,
    K, H]`` (GQA native) -> ``[B, T, N, H]`` in v's dtype.

    Args:
      mask: bool, broadcastable to ``[B, N, T, S]`` (e.g. ``dense_mask(...)``), True where
        a query may attend a key; ``None``: all. cuDNN accepts a dense mask only in some
        versions and runs slowest with one: prefer :func:`cudnn_attention` there.
      implementation: ``'xla'`` (any backend) or ``'cudnn'`` (NVIDIA GPUs).
    """
    out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=1.0, implementation=implementation)
    return out.astype(v.dtype)


def cudnn_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    window: int | None = None,
    key_lengths: jax.Array | None = None,
) -> jax.Array:
    """cuDNN's fused attention: q ``[B, T, N, H]``, k/v ``[B, S, K, H]`` -> ``[B, T, N, H]``.

    The mask is given by its structure, as cuDNN takes it. Raises where cuDNN is absent (on
    CPU: ``RuntimeError("cuDNN is not detected.")`` while tracing); check
    :func:`cudnn_unsupported` first.

    Args:
      causal: query ``t`` sees keys ``s <= t``.
      window: query ``t`` sees keys ``s > t - window`` (``attention_mask``'s); needs
        ``causal`` (cuDNN has no right window).
      key_lengths: ``[B]`` int, the keys ``s < key_lengths[b]`` are real (right padding:
        ``sum(1 - key_paddings, -1)``); ``None``: all.
    """
    if window is not None and not causal:
        raise ValueError("cudnn_attention: a sliding window needs causal=True.")
    if key_lengths is not None:
        key_lengths = key_lengths.astype(jnp.int32)
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        scale=1.0,
        is_causal=causal,
        local_window_size=None if window is None else (window - 1, 0),
        key_value_seq_lengths=key_lengths,
        implementation="cudnn",
    )
    return out.astype(v.dtype)


def cudnn_unsupported(
    dtype: jnp.dtype,
    head_dim: int,
    logit_cap: float,
    dropout: float,
    has_segments: bool,
    has_bias: bool,
) -> str | None:
    """Why cuDNN's fused attention can't run this configuration (one sentence), or None."""
    if jnp.dtype(dtype) not in _CUDNN_DTYPES:
        return f"cuDNN flash attention takes bfloat16 or float16, not {jnp.dtype(dtype).name}."
    if head_dim > 256 or head_dim % 8:
        return f"cuDNN flash attention needs a head dim <= 256 and a multiple of 8, not {head_dim}."
    if logit_cap > 0:
        return "cuDNN flash attention has no logit cap (atten_logit_cap > 0)."
    if dropout > 0:
        return "cuDNN flash attention is used without attention dropout here."
    if has_segments:
        return "cuDNN flash attention takes no packed-sequence segment ids."
    if has_bias:
        return "cuDNN flash attention is used without an additive attention bias here."
    return None


@dataclasses.dataclass(frozen=True)
class SplashBlockSizes:
    """Splash attention's tiles (MaxText's ``sa_block_*``): ``q`` sizes tile the ``T``
    queries, ``kv`` sizes the ``S`` keys, for the forward pass, the dk/dv pass (``_dkv``)
    and the dq pass (``_dq``); a ``_compute`` size splits its ``kv`` tile further."""

    block_q: int = 512
    block_kv: int = 512
    block_kv_compute: int = 512
    block_q_dkv: int = 512
    block_kv_dkv: int = 512
    block_kv_dkv_compute: int = 512
    block_q_dq: int = 512
    block_kv_dq: int = 512

    def capped(self, q_len: int, kv_len: int) -> SplashBlockSizes:
        """Each query tile at most ``q_len`` (``T``), each key tile at most ``kv_len``."""
        sizes = dataclasses.asdict(self)
        return SplashBlockSizes(
            **{n: min(b, q_len if n in _QUERY_BLOCKS else kv_len) for n, b in sizes.items()}
        )

    def to_kernel(self) -> splash.BlockSizes:
        """The kernel's ``BlockSizes`` (separate dq and dkv backward kernels)."""
        return splash.BlockSizes(**dataclasses.asdict(self))


def splash_unsupported(
    t: int,
    s: int,
    block_sizes: SplashBlockSizes,
    dropout: float,
    has_bias: bool,
    kv_heads: int,
    head_shards: int,
) -> str | None:
    """Why splash attention can't run this configuration (one sentence), or None.

    Args:
      t / s: query / key lengths.
      block_sizes: as given (capped here at ``t`` and ``s``, as :func:`splash_attention`
        caps them).
      kv_heads: ``K``; ``head_shards``: how many ways heads are split (1: not).
    """
    if dropout > 0:
        return "splash attention has no attention dropout."
    if has_bias:
        return "splash attention takes no additive attention bias."
    if kv_heads % head_shards:
        return f"splash attention needs kv heads ({kv_heads}) to split evenly {head_shards} ways."
    sizes = dataclasses.asdict(block_sizes.capped(t, s))
    for name, size in sizes.items():
        which, length = ("query", t) if name in _QUERY_BLOCKS else ("key", s)
        if size % SPLASH_LANES or length % size:
            return (
                f"splash attention needs {name}={size} (capped) to be a multiple of "
                f"{SPLASH_LANES} dividing the {which} length {length}."
            )
    for tile in ("block_kv", "block_kv_dkv"):
        compute = f"{tile}_compute"
        if sizes[tile] % sizes[compute]:
            return f"splash attention needs {compute} to divide {tile} ({sizes[tile]})."
    return None


def _splash_mask(
    heads: int, t: int, s: int, causal: bool, window: int | None
) -> splash.MultiHeadMask:
    """The same ``[T, S]`` static mask for each of ``heads`` query heads."""
    if window is not None:
        one = splash.LocalMask((t, s), window_size=(window - 1, 0 if causal else None), offset=0)
    elif causal:
        one = splash.CausalMask((t, s))
    else:
        one = splash.FullMask((t, s))
    return splash.MultiHeadMask([one] * heads)


def _splash_local(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *segment_ids: jax.Array,
    causal: bool,
    window: int | None,
    logit_cap: float,
    block_sizes: SplashBlockSizes,
    interpret: bool,
) -> jax.Array:
    """Splash on one device's data: q ``[B, T, N, H]``, k/v ``[B, S, K, H]``, segment ids
    none or ``[B, T], [B, S]`` -> ``[B, T, N, H]``; the kernel runs per example on q ``[N, T,
    H]``, k/v ``[K, S, H]`` (GQA native: ``make_splash_mha`` maps head n to n // (N/K))."""
    _, t, n, _ = q.shape
    s = k.shape[1]
    kernel = splash.make_splash_mha(
        mask=_splash_mask(n, t, s, causal, window),
        block_sizes=block_sizes.capped(t, s).to_kernel(),
        head_shards=1,
        q_seq_shards=1,
        attn_logits_soft_cap=logit_cap if logit_cap > 0 else None,
        interpret=interpret,
    )
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, L, heads, H] <-> [B, heads, L, H]
    ids = (splash.SegmentIds(*(i.astype(jnp.int32) for i in segment_ids)),) if segment_ids else ()
    out = jax.vmap(kernel)(heads_first(q), heads_first(k), heads_first(v), *ids)
    return heads_first(out).astype(v.dtype)


def _axes_size(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh, axes: Sequence[str]) -> int:
    return math.prod(mesh.shape[a] for a in axes)


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    window: int | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    logit_cap: float = 0.0,
    block_sizes: SplashBlockSizes = SplashBlockSizes(),
    interpret: bool = False,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    batch_axes: Sequence[str] = (),
    head_axes: Sequence[str] = (),
) -> jax.Array:
    """Splash attention: q ``[B, T, N, H]``, k/v ``[B, S, K, H]`` -> ``[B, T, N, H]``.

    Args:
      causal / window: as ``attentions.attention_mask`` (window: ``s > t - window``).
      q_segment_ids / kv_segment_ids: ``[B, T]`` / ``[B, S]`` int ids, both or neither;
        a query sees keys of its own id only. Splash has no key paddings: give padded
        keys an id no real query has (a padded query then sees only padding). Every
        query should see at least one key (else its row is the uniform average).
      logit_cap: if > 0, logits become ``cap * tanh(logits / cap)``.
      block_sizes: the kernel's tiles, capped at ``T`` and ``S`` (see
        :func:`splash_unsupported` for what they must divide).
      interpret: run the Pallas kernel in the interpreter (CPU; slow).
      mesh: run under ``jax.shard_map`` on it: the batch split over ``batch_axes``, query
        and kv heads over ``head_axes`` (K must divide by their size), sequences whole.
    """
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("splash_attention: give q_segment_ids and kv_segment_ids, or neither.")
    local = functools.partial(
        _splash_local,
        causal=causal,
        window=window,
        logit_cap=logit_cap,
        block_sizes=block_sizes,
        interpret=interpret,
    )
    ids = () if q_segment_ids is None else (q_segment_ids, kv_segment_ids)
    if mesh is None:
        return local(q, k, v, *ids)
    head_shards = _axes_size(mesh, head_axes)
    if k.shape[2] % head_shards:
        raise ValueError(
            f"splash_attention: kv heads ({k.shape[2]}) must divide by the {head_shards} "
            f"shards of mesh axes {tuple(head_axes)}."
        )
    batch, heads = tuple(batch_axes) or None, tuple(head_axes) or None
    qkv_spec, ids_spec = P(batch, None, heads, None), P(batch, None)
    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(qkv_spec,) * 3 + (ids_spec,) * len(ids),
        out_specs=qkv_spec,
        check_vma=False,
    )
    return sharded(q, k, v, *ids)


__all__ = [
    "SplashBlockSizes",
    "cudnn_attention",
    "cudnn_unsupported",
    "dense_mask",
    "splash_attention",
    "splash_unsupported",
    "xla_attention",
]
