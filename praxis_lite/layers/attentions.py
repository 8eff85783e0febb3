"""Multi-head dot-product self-attention with grouped-query / multi-query heads.

Shapes: ``B`` batch, ``T`` query time, ``S`` key time, ``D`` input dims,
``N`` query heads, ``K`` key/value heads (``N % K == 0``), ``G = N // K``,
``H`` dims per head.

Incremental decoding: :meth:`DotProductAttention.extend` keeps the keys and
values of every token seen so far in the ``cache`` variable collection (``S``
slots, filled left to right) and attends new queries to them. ``__call__`` (the
training path) never touches the cache.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from jax.ad_checkpoint import checkpoint_name

from praxis_lite.base_layer import CACHE, BaseLayer
from praxis_lite.config import LayerTpl, renamed_fields, template_field
from praxis_lite.layers import attention_kernels as kernels
from praxis_lite.layers import lora as lora_lib
from praxis_lite.layers.embedding_softmax import RotaryPositionalEmbedding
from praxis_lite.layers.lora import LoraSettings
from praxis_lite.sharding import ACTIVATION_EMBED, BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, LENGTH

CACHE_KV_AXES = (BATCH, LENGTH, KV_HEADS, HEAD_DIM)

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class AttentionImpl(enum.StrEnum):
    """How training and eval attend (decoding's KV-cache steps always use the einsums).

    EINSUM: float32 logits ``[B, K, G, T, S]``. XLA: ``jax.nn.dot_product_attention``'s XLA
    path. CUDNN: its cuDNN flash attention (NVIDIA GPUs, bf16/fp16, no logit cap, no dropout,
    no packing or additive bias). SPLASH: TPU splash attention (on a CPU in Pallas' interpret
    mode; no dropout or additive bias, sequences a multiple of the block size).
    """

    EINSUM = "einsum"
    XLA = "xla"
    CUDNN = "cudnn"
    SPLASH = "splash"


class QueryScale(enum.StrEnum):
    """How the queries are scaled before the logits (a float instead: a fixed multiplier).

    RSQRT_HEAD_DIM: by ``1 / sqrt(H)``. PER_DIM: learned per head dim (praxis's
    ``PerDimScale``, on in Pax's experiments): ``q * 1.442695041 / sqrt(H) * softplus(s)``
    with ``s [H]`` (variable ``per_dim_scale``) starting at 0, i.e. at ``1 / sqrt(H)``.
    IN_INIT: T5's: not in the forward pass; ``w_q``'s initial values are ``1 / sqrt(H)``
    smaller instead (T5X and Hugging Face initialise it so).
    """

    RSQRT_HEAD_DIM = "rsqrt_head_dim"
    PER_DIM = "per_dim"
    IN_INIT = "in_init"


class AttentionImplError(ValueError):
    """An attention implementation asked for explicitly cannot honour a call."""


@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """Which keys each query may attend, as the kernels take it (see :func:`attention_mask`).

    Attributes:
      causal: query ``t`` sees keys ``s <= t``.
      window: and only ``s > t - window`` (None: all).
      key_paddings: ``[B, S]``, 1.0 at padded keys.
      query_segment_ids / key_segment_ids: ``[B, T]`` / ``[B, S]`` packed-sequence ids.
      query_paddings: ``[B, T]``, 1.0 at padded queries (self-attention's key paddings;
        only the kernels use it: their outputs there are not read).
    """

    causal: bool
    window: int | None = None
    key_paddings: jax.Array | None = None
    query_segment_ids: jax.Array | None = None
    key_segment_ids: jax.Array | None = None
    query_paddings: jax.Array | None = None

    def dense(self, query_len: int, key_len: int) -> jax.Array:
        """The boolean ``[B or 1, 1, 1, T, S]`` mask."""
        return attention_mask(
            query_len,
            key_len,
            causal=self.causal,
            key_paddings=self.key_paddings,
            query_segment_ids=self.query_segment_ids,
            key_segment_ids=self.key_segment_ids,
            window=self.window,
        )

    @property
    def packed(self) -> bool:
        return self.query_segment_ids is not None and self.key_segment_ids is not None


#: DotProductAttention's LoRA targets and the weight each adapts ('qkv': the A shared by
#: w_q, w_k and w_v).
LORA_TARGETS = {"query": "w_q", "key": "w_k", "value": "w_v", "post": "w_post", "qkv": "w_qkv"}

#: The query-scale flags of earlier versions (old job dirs: ``praxis_lite.moved``).
_RENAMED = {
    "per_dim_scale": "query_scale=QueryScale.PER_DIM, or query_scale='per_dim' in --fdl_set",
    "query_scale_in_init": "query_scale=QueryScale.IN_INIT, or query_scale='in_init' in --fdl_set",
}


def attention_mask(
    query_len: int,
    key_len: int,
    *,
    causal: bool,
    key_paddings: jax.Array | None = None,
    query_segment_ids: jax.Array | None = None,
    key_segment_ids: jax.Array | None = None,
    window: int | None = None,
) -> jax.Array:
    """Boolean ``[B or 1, 1, 1, T, S]`` mask, True where a query may attend a key.

    Args:
      query_len: ``T``.
      key_len: ``S``.
      causal: query ``t`` may only see keys ``s <= t``.
      key_paddings: ``[B, S]``, 1.0 at padded keys (never attended).
      query_segment_ids / key_segment_ids: ``[B, T]`` / ``[B, S]`` ids of packed
        sequences; attention stays within a segment.
      window: query ``t`` sees only keys ``s > t - window`` (itself and the
        ``window - 1`` before it: Mistral's sliding window); ``None``: all.
    """
    mask = jnp.ones((1, 1, 1, query_len, key_len), dtype=bool)
    behind = jnp.arange(query_len)[:, None] - jnp.arange(key_len)[None, :]  # t - s
    if causal:
        mask = mask & (behind >= 0)
    if window is not None:
        mask = mask & (behind < window)
    if key_paddings is not None:
        mask = mask & (key_paddings < 0.5)[:, None, None, None, :]
    if query_segment_ids is not None and key_segment_ids is not None:
        same = query_segment_ids[:, :, None] == key_segment_ids[:, None, :]
        mask = mask & same[:, None, None, :, :]
    return mask


@renamed_fields(_RENAMED, why="one field scales the queries")
class DotProductAttention(BaseLayer):
    """Self-attention ``[B, T, D] -> [B, T, D]``.

    Attributes:
      input_dims: ``D``.
      num_heads: ``N``, query heads.
      num_kv_heads: ``K``, key/value heads; ``None`` means ``N`` (multi-head),
        1 is multi-query, anything dividing ``N`` is grouped-query.
      dims_per_head: ``H``; ``None`` means ``D // N``.
      is_causal: mask future keys.
      combine_qkv: one ``[3, D, N, H]`` weight for q, k and v (needs ``K == N``).
      use_bias: add biases to the q/k/v projections (and to the output projection, unless
        ``use_post_bias`` says otherwise).
      use_post_bias: a bias on the output projection; ``None``: as ``use_bias`` (Qwen2 has
        q/k/v biases and none on the output).
      qk_norm_tpl: a norm applied to each head of q and k after their projections and
        before RoPE (given ``input_dims=H``; Qwen3's RmsNorm); ``None`` for none.
      sliding_window: each query sees itself and the ``sliding_window - 1`` keys before it
        (Mistral's), in training and in KV-cache decoding; ``None``: every earlier key.
      atten_dropout_prob: dropout on the attention probabilities (when training).
      atten_logit_cap: if > 0, logits become ``cap * tanh(logits / cap)``.
      rotary_tpl: template of a RoPE layer applied to q and k; ``None`` for none.
      query_scale: how the queries are scaled: a :class:`QueryScale` (``1 / sqrt(H)``,
        learned per head dim, or in ``w_q``'s init) or a float multiplier (Gemma 2's
        ``query_pre_attn_scalar ** -0.5``).
      lora: LoRA adapters (see ``layers.lora``) on the projections its ``targets`` name:
        ``'query'``, ``'key'``, ``'value'`` (``w_q_lora_a [D, r]``, ``w_q_lora_b [r, N, H]``;
        k and v with ``K`` heads), ``'post'`` (``w_post_lora_a [N, H, r]``,
        ``w_post_lora_b [r, D]``) and ``'qkv'``: one A ``w_qkv_lora_a [D, r]`` shared by
        q, k and v, with their own B's (PEFT's adapter on GPT-2's fused ``c_attn``; not
        with ``'query'``/``'key'``/``'value'``). Not with ``combine_qkv``. KV-cache
        decoding (``extend``) includes the adapters.
      attention_impl: how training and eval attend (an :class:`AttentionImpl`; decoding's
        KV-cache steps always use the einsums).
      attention_fallback: the implementation was chosen by default (for the platform):
        a call it cannot honour uses the einsums, with one logged line saying why;
        False (asked for explicitly): such a call is an :class:`AttentionImplError`.
      splash_block_sizes: splash's block sizes (None: MaxText's, 512, capped at the
        sequence lengths).
      splash_interpret: run splash in Pallas' interpret mode (what a CPU runs); None: when
        this process's devices are no TPUs. A job sets it from its mesh's devices, so a
        ``--compile_topology`` compile on a CPU host compiles the TPU kernel.
    """

    input_dims: int
    num_heads: int
    num_kv_heads: int | None = None
    dims_per_head: int | None = None
    is_causal: bool = True
    combine_qkv: bool = False
    use_bias: bool = True
    use_post_bias: bool | None = None
    qk_norm_tpl: LayerTpl = template_field(None)
    sliding_window: int | None = None
    atten_dropout_prob: float = 0.0
    atten_logit_cap: float = 0.0
    rotary_tpl: LayerTpl = template_field(None)
    query_scale: float | QueryScale = QueryScale.RSQRT_HEAD_DIM
    lora: LoraSettings | None = None
    attention_impl: AttentionImpl = AttentionImpl.EINSUM
    attention_fallback: bool = False
    splash_block_sizes: kernels.SplashBlockSizes | None = None
    splash_interpret: bool | None = None

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dims_per_head or self.input_dims // self.num_heads

    @property
    def post_bias(self) -> bool:
        """Whether the output projection has a bias."""
        return self.use_bias if self.use_post_bias is None else self.use_post_bias

    def _query_scale(self) -> float | QueryScale:
        """``query_scale`` as its type: a member's value or name (``--fdl_set`` gives a
        string), None (praxis' spelling of the default: ``RSQRT_HEAD_DIM``), or a number."""
        scale = self.query_scale
        if scale is None:
            return QueryScale.RSQRT_HEAD_DIM
        if isinstance(scale, str) and scale.lower() in set(QueryScale):  # Names: values' caps.
            return QueryScale(scale.lower())
        if isinstance(scale, int | float) and not isinstance(scale, bool | str):
            return float(scale)
        raise ValueError(
            f"query_scale={scale!r}: give a number (a fixed multiplier) or one of "
            f"{', '.join(q.value for q in QueryScale)} (QueryScale)."
        )

    def setup(self) -> None:
        n, k, h, d = self.num_heads, self.kv_heads, self.head_dim, self.input_dims
        if self.dims_per_head is None and d % n:
            raise ValueError(
                f"input_dims={d} is not divisible by num_heads={n}; set dims_per_head or pick "
                "num_heads dividing input_dims."
            )
        if n % k:
            raise ValueError(f"num_heads={n} must be a multiple of num_kv_heads={k}.")
        if self.combine_qkv and k != n:
            raise ValueError("combine_qkv needs num_kv_heads == num_heads (or None).")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}.")
        init = nn.initializers.lecun_normal(in_axis=0, out_axis=(1, 2))
        if self.combine_qkv:
            self.w_qkv = self.create_variable(
                "w_qkv",
                (3, d, n, h),
                (None, EMBED, HEADS, HEAD_DIM),
                nn.initializers.lecun_normal(in_axis=1, out_axis=(2, 3), batch_axis=(0,)),
            )
        else:
            query_init = init
            if self._query_scale() is QueryScale.IN_INIT:
                query_init = nn.initializers.variance_scaling(
                    1.0 / h, "fan_in", "truncated_normal", in_axis=0, out_axis=(1, 2)
                )
            self.w_q = self.create_variable("w_q", (d, n, h), (EMBED, HEADS, HEAD_DIM), query_init)
            self.w_k = self.create_variable("w_k", (d, k, h), (EMBED, KV_HEADS, HEAD_DIM), init)
            self.w_v = self.create_variable("w_v", (d, k, h), (EMBED, KV_HEADS, HEAD_DIM), init)
        self.w_post = self.create_variable(
            "w_post",
            (n, h, d),
            (HEADS, HEAD_DIM, EMBED),
            nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
        )
        if self.use_bias:
            zeros = nn.initializers.zeros
            self.b_q = self.create_variable("b_q", (n, h), (HEADS, HEAD_DIM), zeros)
            self.b_k = self.create_variable("b_k", (k, h), (KV_HEADS, HEAD_DIM), zeros)
            self.b_v = self.create_variable("b_v", (k, h), (KV_HEADS, HEAD_DIM), zeros)
        if self.post_bias:
            self.b_post = self.create_variable("b_post", (d,), (EMBED,), nn.initializers.zeros)
        if self.qk_norm_tpl is not None:
            self.query_norm = self.create_child(self.qk_norm_tpl, input_dims=h)
            self.key_norm = self.create_child(self.qk_norm_tpl, input_dims=h)
        if self._query_scale() is QueryScale.PER_DIM:
            self.dim_scale = self.create_variable(
                "per_dim_scale", (h,), (HEAD_DIM,), nn.initializers.zeros
            )
        self.rotary = self.create_child(self.rotary_tpl, input_dims=h) if self.rotary_tpl else None
        self.dropout = nn.Dropout(self.atten_dropout_prob)
        self._setup_lora()

    def _setup_lora(self) -> None:
        """The targeted projections' adapters: ``lora_a`` and ``lora_b``, keyed by the base
        weight's name (the shared A by ``'w_qkv'``); empty without ``lora``."""
        targets = lora_lib.checked_targets(type(self).__name__, self.lora, tuple(LORA_TARGETS))
        if targets and self.combine_qkv:
            raise ValueError(
                "DotProductAttention: LoRA with combine_qkv=True is unsupported; set "
                "combine_qkv=False (the same model with separate q/k/v weights)."
            )
        if "qkv" in targets and {"query", "key", "value"} & set(targets):
            raise ValueError(
                "DotProductAttention: the LoRA target 'qkv' (one A shared by q, k and v) "
                f"excludes 'query', 'key' and 'value'; got {targets}."
            )
        n, k, h, d = self.num_heads, self.kv_heads, self.head_dim, self.input_dims
        inputs = {"w_post": ((n, h), (HEADS, HEAD_DIM))}  # The others': ((D,), (EMBED,)).
        outputs = {
            "w_q": ((n, h), (HEADS, HEAD_DIM)),
            "w_k": ((k, h), (KV_HEADS, HEAD_DIM)),
            "w_v": ((k, h), (KV_HEADS, HEAD_DIM)),
            "w_post": ((d,), (EMBED,)),
        }
        a, b = {}, {}
        for name in (LORA_TARGETS[target] for target in targets):
            in_shape, in_axes = inputs.get(name, ((d,), (EMBED,)))
            a[name] = lora_lib.create_lora_a(self, name, self.lora, in_shape, in_axes)
            for base in lora_lib.SHARED_A.get(name, (name,)):
                b[base] = lora_lib.create_lora_b(self, base, self.lora, *outputs[base])
        self.lora_a, self.lora_b = a, b
        if targets:
            self.lora_dropout = nn.Dropout(self.lora.dropout_prob)

    def project_qkv(
        self, x: jax.Array, *, train: bool = False
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``x [B, T, D]`` -> q ``[B, T, N, H]``, k and v ``[B, T, K, H]`` (with their
        adapters and biases, and q and k normalised per head with ``qk_norm_tpl``);
        ``train`` enables the adapters' dropout.

        The projections are named for remat policies as in praxis:
        'combined_qkv_proj', or 'query_proj', 'key_proj' and 'value_proj'.
        """
        if self.combine_qkv:
            qkv = jnp.einsum("btd,cdnh->cbtnh", x, self.w_qkv)
            q, k, v = checkpoint_name(qkv, "combined_qkv_proj")
        else:
            q = jnp.einsum("btd,dnh->btnh", x, self.w_q)
            k = jnp.einsum("btd,dkh->btkh", x, self.w_k)
            v = jnp.einsum("btd,dkh->btkh", x, self.w_v)
            q, k, v = self._add_qkv_lora(x, (q, k, v), train)
            q = checkpoint_name(q, "query_proj")
            k = checkpoint_name(k, "key_proj")
            v = checkpoint_name(v, "value_proj")
        if self.use_bias:
            q, k, v = q + self.b_q, k + self.b_k, v + self.b_v
        if self.qk_norm_tpl is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        return q, k, v

    def _add_qkv_lora(
        self, x: jax.Array, qkv: tuple[jax.Array, ...], train: bool
    ) -> tuple[jax.Array, ...]:
        """q, k and v plus their adapters' additions (unchanged where none): ``x [B, T, D]``,
        q ``[B, T, N, H]``, k/v ``[B, T, K, H]``. A shared A sees one dropout mask of ``x``
        (PEFT's one module); separate adapters draw one each."""
        if not self.lora_b:
            return qkv
        shared = None
        if "w_qkv" in self.lora_a:
            x_in = lora_lib.adapter_input(x, self.lora, self.lora_dropout, train)
            shared = lora_lib.lora_down(x_in, self.lora_a["w_qkv"])
        out = []
        for name, y in zip(("w_q", "w_k", "w_v"), qkv, strict=True):
            if name in self.lora_b:
                h = shared
                if h is None:
                    x_in = lora_lib.adapter_input(x, self.lora, self.lora_dropout, train)
                    h = lora_lib.lora_down(x_in, self.lora_a[name])
                y = y + lora_lib.lora_up(h, self.lora_b[name], self.lora.scale, y.dtype)
            out.append(y)
        return tuple(out)

    def query_scaling(self, h: int) -> jax.Array:
        """What the queries are multiplied by (see :class:`QueryScale`): a scalar, or ``[H]``
        with ``PER_DIM`` (praxis's: ``1 / softplus(0) = 1.442695041`` makes it start at
        ``1 / sqrt(H)``)."""
        scale = self._query_scale()
        if scale is QueryScale.IN_INIT:
            return jnp.asarray(1.0, jnp.float32)
        if scale is QueryScale.RSQRT_HEAD_DIM:
            return jnp.asarray(1.0 / math.sqrt(h), jnp.float32)
        if scale is QueryScale.PER_DIM:
            learned = jax.nn.softplus(self.dim_scale.astype(jnp.float32))
            return learned * jnp.asarray(1.442695041 / math.sqrt(h), jnp.float32)
        return jnp.asarray(scale, jnp.float32)

    def attend(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        mask: jax.Array,
        train: bool,
        bias: jax.Array | None = None,
    ) -> jax.Array:
        """Scaled dot-product attention: q ``[B,T,N,H]``, k/v ``[B,S,K,H]`` -> ``[B,T,N,H]``;
        ``bias`` ``[N, T, S]`` is added to the logits (after the cap, before the mask)."""
        b, t, n, h = q.shape
        kv_heads = k.shape[2]
        q = q * self.query_scaling(h).astype(q.dtype)
        q = q.reshape(b, t, kv_heads, n // kv_heads, h)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32)
        if self.atten_logit_cap > 0:
            cap = self.atten_logit_cap
            logits = cap * jnp.tanh(logits / cap)
        if bias is not None:
            logits = logits + bias.astype(jnp.float32).reshape(kv_heads, n // kv_heads, t, -1)
        logits = jnp.where(mask, logits, _MASK_VALUE)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        probs = self.dropout(probs, deterministic=not train)
        encoded = jnp.einsum("bkgts,bskh->btkgh", probs, v)
        return checkpoint_name(encoded.reshape(b, t, n, h), "context")

    def attend_fused(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        spec: MaskSpec,
        train: bool,
        bias: jax.Array | None = None,
    ) -> jax.Array:
        """:meth:`attend` by ``attention_impl`` (the training and eval path): q ``[B, T, N,
        H]``, k/v ``[B, S, K, H]`` -> ``[B, T, N, H]``, named 'context' like the einsums'."""
        impl = self._usable_impl(q, k, spec, train, bias)
        if impl is AttentionImpl.EINSUM:
            return self.attend(q, k, v, spec.dense(q.shape[1], k.shape[1]), train, bias)
        q = q * self.query_scaling(q.shape[-1]).astype(q.dtype)
        if impl is AttentionImpl.XLA:
            mask = kernels.dense_mask(spec.dense(q.shape[1], k.shape[1]))
            encoded = kernels.xla_attention(q, k, v, mask=mask, implementation="xla")
        elif impl is AttentionImpl.CUDNN:
            encoded = kernels.cudnn_attention(
                q, k, v, causal=spec.causal, window=spec.window, key_lengths=_lengths(spec)
            )
        else:
            encoded = self._splash(q, k, v, spec)
        return checkpoint_name(encoded, "context")

    def _splash(self, q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec) -> jax.Array:
        """Splash attention, under ``shard_map`` over the mesh's batch and head axes."""
        q_segments, kv_segments = _segment_ids(spec, q.shape[:2])
        mesh, batch_axes, head_axes = _mesh_axes()
        return kernels.splash_attention(
            q,
            k,
            v,
            causal=spec.causal,
            window=spec.window,
            q_segment_ids=q_segments,
            kv_segment_ids=kv_segments,
            logit_cap=self.atten_logit_cap,
            block_sizes=self.splash_block_sizes or kernels.SplashBlockSizes(),
            interpret=self._splash_interpret(),
            mesh=mesh,
            batch_axes=batch_axes,
            head_axes=head_axes,
        )

    def _splash_interpret(self) -> bool:
        """Whether splash runs in interpret mode (see ``splash_interpret``)."""
        if self.splash_interpret is not None:
            return self.splash_interpret
        return jax.devices()[0].platform != "tpu"

    def _usable_impl(
        self, q: jax.Array, k: jax.Array, spec: MaskSpec, train: bool, bias: jax.Array | None
    ) -> AttentionImpl:
        """``attention_impl``, or the einsums where it cannot honour this call (with one
        logged line when it was a default; an :class:`AttentionImplError` when asked for)."""
        impl = AttentionImpl(self.attention_impl)  # --fdl_set gives a member's value.
        reason = self._unsupported(impl, q, k, spec, train, bias)
        if reason is None:
            return impl
        where = self.name or type(self).__name__
        message = f"ATTENTION_IMPL={impl} cannot run {where}: {reason.rstrip('.')}"
        if not self.attention_fallback:
            raise AttentionImplError(f"{message}; pick another ATTENTION_IMPL (e.g. einsum).")
        _warn_fallback(message)
        return AttentionImpl.EINSUM

    def _unsupported(
        self,
        impl: AttentionImpl,
        q: jax.Array,
        k: jax.Array,
        spec: MaskSpec,
        train: bool,
        bias: jax.Array | None,
    ) -> str | None:
        """Why ``impl`` cannot run this call, or None."""
        dropout = self.atten_dropout_prob if train else 0.0
        if impl is AttentionImpl.CUDNN:
            return kernels.cudnn_unsupported(
                q.dtype, q.shape[-1], self.atten_logit_cap, dropout, spec.packed, bias is not None
            )
        if impl is AttentionImpl.SPLASH:
            mesh, _, head_axes = _mesh_axes()
            return kernels.splash_unsupported(
                q.shape[1],
                k.shape[1],
                self.splash_block_sizes or kernels.SplashBlockSizes(),
                dropout,
                bias is not None,
                k.shape[2],
                math.prod(mesh.shape[a] for a in head_axes),
            )
        return None

    def __call__(
        self,
        x: jax.Array,
        *,
        paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        attention_bias: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """Self-attention over ``x [B, T, D]``.

        Args:
          x: inputs ``[B, T, D]``.
          paddings: ``[B, T]``, 1.0 at padded positions (not attended to).
          segment_ids: ``[B, T]`` packed-sequence ids; attention stays within one.
          positions: ``[B, T]`` positions for RoPE (default ``0..T-1``).
          attention_bias: ``[N, T, T]`` added to the logits (T5's relative position bias).
          train: enables attention dropout (needs the 'dropout' RNG).

        Returns:
          ``[B, T, D]`` in ``fprop_dtype``.
        """
        x = self.to_fprop(self.constrain(x, (BATCH, LENGTH, EMBED)))
        q, k, v = self.project_qkv(x, train=train)
        q = self.constrain(q, (BATCH, LENGTH, HEADS, HEAD_DIM))
        k = self.constrain(k, (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
        v = self.constrain(v, (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
        if self.rotary is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        spec = MaskSpec(
            causal=self.is_causal,
            window=self.sliding_window,
            key_paddings=paddings,
            query_segment_ids=segment_ids,
            key_segment_ids=segment_ids,
            query_paddings=paddings,
        )
        encoded = self.attend_fused(q, k, v, spec, train, attention_bias)
        return self.post_project(encoded, train=train)

    def cross_attend(
        self,
        x: jax.Array,
        memory: jax.Array,
        *,
        memory_paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        memory_segment_ids: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """Cross-attention: queries from ``x [B, T, D]``, keys and values from ``memory [B, S,
        D]`` (an encoder's output); no causal mask, no position terms.

        Args:
          memory_paddings: ``[B, S]``, 1.0 at padded memory slots (never attended).
          segment_ids / memory_segment_ids: ``[B, T]`` / ``[B, S]`` packed-sequence ids; a
            query attends the memory of its own segment only.

        Returns:
          ``[B, T, D]``.
        """
        x = self.to_fprop(self.constrain(x, (BATCH, LENGTH, EMBED)))
        q, k, v = self._cross_projections(x, memory, train)
        spec = MaskSpec(
            causal=False,
            key_paddings=memory_paddings,
            query_segment_ids=segment_ids,
            key_segment_ids=memory_segment_ids,
        )
        return self.post_project(self.attend_fused(q, k, v, spec, train), train=train)

    def _cross_projections(
        self, x: jax.Array, memory: jax.Array, train: bool
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q of ``x [B, T, D]``, k and v of ``memory [B, S, D]``. Each source goes through
        ``project_qkv`` (with the adapters); the projections not used are dead code that
        XLA removes."""
        q, _, _ = self.project_qkv(x, train=train)
        _, k, v = self.project_qkv(self.to_fprop(memory), train=train)
        q = self.constrain(q, (BATCH, LENGTH, HEADS, HEAD_DIM))
        k = self.constrain(k, (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
        v = self.constrain(v, (BATCH, LENGTH, KV_HEADS, HEAD_DIM))
        return q, k, v

    def post_project(self, encoded: jax.Array, *, train: bool = False) -> jax.Array:
        """Heads back to model dims: ``[B, T, N, H] -> [B, T, D]`` (named 'out_proj', as
        sharded: a remat policy keeping it keeps the split copy), with its adapter;
        ``train`` enables the adapter's dropout."""
        out = jnp.einsum("btnh,nhd->btd", encoded, self.w_post)
        if "w_post" in self.lora_b:
            x_in = lora_lib.adapter_input(encoded, self.lora, self.lora_dropout, train)
            a, b = self.lora_a["w_post"], self.lora_b["w_post"]
            out = out + lora_lib.lora_delta(x_in, a, b, self.lora.scale, out.dtype)
        if self.post_bias:
            out = out + self.b_post
        return checkpoint_name(self.constrain(out, (BATCH, LENGTH, ACTIVATION_EMBED)), "out_proj")

    @nn.compact
    def extend(
        self,
        x: jax.Array,
        *,
        positions: jax.Array,
        paddings: jax.Array | None = None,
        max_len: int | None = None,
        attention_bias: jax.Array | None = None,
    ) -> jax.Array:
        """Appends ``T`` tokens to the key/value cache and attends them to everything cached.

        The first call (prefill: the whole prompt) creates the cache with
        ``max_len`` slots; later calls (one token each while decoding) write the
        next slots. Query ``t`` sees cached slots up to its own and never a slot
        whose padding is 1 (e.g. the left padding of a shorter prompt). With the
        same tokens, prefill plus steps give the logits of one ``__call__``.

        Cache (collection ``'cache'``, pass it ``mutable``): ``key``/``value``
        ``[B, S, K, H]`` (logical axes batch, length, kv_heads, head_dim),
        ``paddings [B, S]`` (1.0 at padding and unwritten slots) and ``index``
        (int32 scalar, slots written).

        Args:
          x: ``[B, T, D]`` inputs of the new tokens.
          positions: ``[B, T]`` positions of the new tokens (for RoPE).
          paddings: ``[B, T]``, 1.0 at padding tokens; default none.
          max_len: ``S``, the cache size; needed on the first call only.
          attention_bias: ``[N, T, S]`` added to the logits (queries by cache slot).

        Returns:
          ``[B, T, D]``.
        """
        b, t = x.shape[:2]
        x = self.to_fprop(self.constrain(x, (BATCH, LENGTH, EMBED)))
        q, k, v = self.project_qkv(x)
        q = self.constrain(q, (BATCH, LENGTH, HEADS, HEAD_DIM))
        if self.rotary is not None:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if not self.has_variable(CACHE, "index") and max_len is None:
            raise ValueError(
                "DotProductAttention.extend: no cache yet; the first call (prefill) must pass "
                "max_len, the number of cache slots."
            )
        kv_shape = (b, max_len or 0, self.kv_heads, self.head_dim)
        zeros = nn.with_logical_partitioning(jnp.zeros, CACHE_KV_AXES)
        ones = nn.with_logical_partitioning(jnp.ones, (BATCH, LENGTH))
        cached_k = self.variable(CACHE, "key", zeros, kv_shape, self.fprop_dtype)
        cached_v = self.variable(CACHE, "value", zeros, kv_shape, self.fprop_dtype)
        cached_pad = self.variable(CACHE, "paddings", ones, kv_shape[:2], jnp.float32)
        index = self.variable(CACHE, "index", lambda: jnp.zeros((), jnp.int32))
        start = index.value
        if paddings is None:
            paddings = jnp.zeros((b, t), jnp.float32)

        def write(cache: jax.Array, new: jax.Array) -> jax.Array:
            at = (0, start) + (0,) * (cache.ndim - 2)
            return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), at)

        keys = self.constrain(write(cached_k.value, k), CACHE_KV_AXES)
        values = self.constrain(write(cached_v.value, v), CACHE_KV_AXES)
        key_paddings = write(cached_pad.value, paddings)
        cached_k.value, cached_v.value, cached_pad.value = keys, values, key_paddings
        index.value = start + t
        behind = start + jnp.arange(t)[:, None] - jnp.arange(keys.shape[1])[None, :]  # [T, S]
        visible = behind >= 0
        if self.sliding_window is not None:  # Slots are contiguous after the left padding.
            visible = visible & (behind < self.sliding_window)
        mask = visible[None, None, None] & (key_paddings < 0.5)[:, None, None, None, :]
        encoded = self.attend(q, keys, values, mask, train=False, bias=attention_bias)
        return self.post_project(encoded)

    @nn.compact
    def cross_extend(
        self,
        x: jax.Array,
        memory: jax.Array | None = None,
        memory_paddings: jax.Array | None = None,
    ) -> jax.Array:
        """Cross-attention while decoding: the memory's keys and values are computed once,
        on the first call (which passes ``memory [B, S, D]`` and ``memory_paddings [B,
        S]``), kept in the ``'cache'`` collection (``key``/``value`` ``[B, S, K, H]``,
        ``paddings [B, S]``), and read by every later call (``memory`` None).

        Args:
          x: ``[B, T, D]`` queries of the new tokens.

        Returns:
          ``[B, T, D]``.
        """
        x = self.to_fprop(self.constrain(x, (BATCH, LENGTH, EMBED)))
        if memory is None:
            if not self.has_variable(CACHE, "key"):
                raise ValueError(
                    "DotProductAttention.cross_extend: no cached memory yet; the first call "
                    "passes memory (the encoder's output)."
                )
            q, _, _ = self.project_qkv(x)
            keys, values, paddings = (
                self.get_variable(CACHE, n) for n in ("key", "value", "paddings")
            )
        else:
            q, keys, values = self._cross_projections(x, memory, train=False)
            b, s = memory.shape[:2]
            paddings = (
                jnp.zeros((b, s), jnp.float32) if memory_paddings is None else memory_paddings
            )
            keys = self.constrain(keys.astype(self.fprop_dtype), CACHE_KV_AXES)
            values = self.constrain(values.astype(self.fprop_dtype), CACHE_KV_AXES)
            paddings = paddings.astype(jnp.float32)
            for name, value in (("key", keys), ("value", values), ("paddings", paddings)):
                self.put_variable(CACHE, name, value)
        mask = (paddings < 0.5)[:, None, None, None, :]
        return self.post_project(self.attend(q, keys, values, mask, train=False))


@functools.cache  # One line a process for each message.
def _warn_fallback(message: str) -> None:
    """Logs ``message`` (a layer cannot use its implementation) and that it uses the einsums."""
    logging.warning("%s; it uses the einsums (and so does any layer like it).", message)


def _lengths(spec: MaskSpec) -> jax.Array | None:
    """Real keys per row ``[B]`` of a right-padded batch (cuDNN's key lengths), or None."""
    if spec.key_paddings is None:
        return None
    return jnp.sum(spec.key_paddings < 0.5, axis=1).astype(jnp.int32)


def _segment_ids(
    spec: MaskSpec, q_shape: tuple[int, int]
) -> tuple[jax.Array | None, jax.Array | None]:
    """Splash's segment ids ``([B, T], [B, S])``: the packed ones shifted up by 1, padding
    (queries and keys) in segment 0 of its own; padding alone: 1 real, 0 padded."""
    q_seg, kv_seg = spec.query_segment_ids, spec.key_segment_ids
    if spec.key_paddings is None:
        return q_seg, kv_seg
    kv_real = (spec.key_paddings < 0.5).astype(jnp.int32)
    q_real = jnp.ones(q_shape, jnp.int32)
    if spec.query_paddings is not None:
        q_real = (spec.query_paddings < 0.5).astype(jnp.int32)
    if q_seg is None or kv_seg is None:
        return q_real, kv_real
    return (q_seg + 1) * q_real, (kv_seg + 1) * kv_real


def _mesh_axes() -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """The current mesh (None without one) and the mesh axes the batch and the heads are
    split over by the current logical axis rules."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return None, (), ()
    spec = nn.logical_to_mesh_axes((BATCH, HEADS))

    def names(entry: Any) -> tuple[str, ...]:
        if entry is None:
            return ()
        named = entry if isinstance(entry, tuple) else (entry,)
        return tuple(n for n in named if n in mesh.axis_names and mesh.shape[n] > 1)

    return mesh, names(spec[0]), names(spec[1])


__all__ = [
    "CACHE",
    "LORA_TARGETS",
    "AttentionImpl",
    "AttentionImplError",
    "DotProductAttention",
    "MaskSpec",
    "QueryScale",
    "RotaryPositionalEmbedding",
    "attention_mask",
]
