"""Token embeddings, softmax output layers with cross-entropy, position embeddings.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``V`` vocabulary size,
``N`` heads, ``H`` dims per head.
"""

from __future__ import annotations

import enum
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer
from praxis_lite.layers import vocab_loss
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import EMBED, TABLE_EMBED, VOCAB


class Embedding(BaseLayer):
    """Token lookup: ids ``[...]`` -> ``[..., input_dims]``.

    Attributes:
      num_classes: vocabulary size ``V``.
      input_dims: embedding size ``D``.
      scale_sqrt_depth: multiply looked-up vectors by ``sqrt(D)``.
      lookup_style: 'index' (a gather) or 'matmul' (one-hot ids times the table,
        Pax's choice for TPUs); the same vectors either way.
    """

    num_classes: int
    input_dims: int
    scale_sqrt_depth: bool = False
    lookup_style: str = "index"

    @nn.compact
    def __call__(self, ids: jax.Array) -> jax.Array:
        table = _embedding_table(self, self.num_classes, self.input_dims)
        return _lookup(table, ids, self.scale_sqrt_depth, self.fprop_dtype, self.lookup_style)


def _embedding_table(layer: BaseLayer, num_classes: int, dims: int) -> jax.Array:
    """Declares the ``[V, D]`` table ``emb_var`` (logical axes VOCAB, TABLE_EMBED) on ``layer``."""
    init = nn.initializers.normal(stddev=1.0 / math.sqrt(dims))
    return layer.create_variable("emb_var", (num_classes, dims), (VOCAB, TABLE_EMBED), init)


def _lookup(
    table: jax.Array, ids: jax.Array, scale_sqrt_depth: bool, dtype, style: str = "index"
) -> jax.Array:
    """Rows of ``table [V, D]`` for ``ids [...]`` -> ``[..., D]``, optionally times ``sqrt(D)``.

    ``style`` 'index' gathers the rows; 'matmul' multiplies one-hot ids ``[..., V]`` by
    the table (Pax's ``lookup_style='matmul'``).
    """
    if style == "matmul":
        out = jnp.einsum(
            "...v,vd->...d", jax.nn.one_hot(ids, table.shape[0], dtype=table.dtype), table
        )
    elif style == "index":
        out = jnp.take(table, ids, axis=0)
    else:
        raise ValueError(f"lookup_style must be 'index' or 'matmul', got {style!r}.")
    if scale_sqrt_depth:
        out = out * jnp.asarray(math.sqrt(table.shape[-1]), dtype)
    return out


def softmax_cross_entropy(
    logits: jax.Array,
    labels: jax.Array,
    weights: jax.Array,
    *,
    label_smoothing: float = 0.0,
    z_loss_weight: float = 0.0,
) -> NestedMap:
    """Weighted softmax cross-entropy over the last axis of ``logits [..., V]``, in float32.

    Args:
      logits: ``[..., V]``.
      labels: integer class ids ``[...]``.
      weights: per-example weights ``[...]`` (0 for padding).
      label_smoothing: mass spread uniformly over all ``V`` classes.
      z_loss_weight: weight of ``log(Z)^2`` added per example (PaLM's z-loss).

    Returns:
      ``vocab_loss.loss_terms``: ``per_token_xent [...]``, ``total_loss`` (the objective),
      ``log_pplx``, ``z_loss``, ``accuracy``, ``total_weight``.
    """
    stats = vocab_loss.token_stats(logits, None, labels, 0.0, label_smoothing)
    return vocab_loss.loss_terms(stats, weights, z_loss_weight)


class _SoftmaxBase(BaseLayer):
    """Shared fields and the loss of the softmax layers.

    The loss never returns ``[..., V]`` arrays: it reads the logits in the passes
    ``vocab_loss`` describes, the bias and the cap applied inside them.

    Attributes:
      input_dims: ``D``.
      num_classes: ``V``.
      soft_cap_logits: if > 0, logits become ``cap * tanh(logits / cap)``.
      label_smoothing: see :func:`softmax_cross_entropy`.
      z_loss_weight: see :func:`softmax_cross_entropy`.
      num_chunks: ``C > 1`` runs the projection and the loss over ``C`` chunks of the time
        axis (``vocab_loss.chunked_token_stats``): the whole float32 ``[..., T, V]``
        logits never exist at once. ``C`` must divide ``T``.
      logits_scale: the logits are multiplied by it before the bias and the cap (T5 1.0's
        tied embedding: ``1 / sqrt(D)``); applied to ``x``, the cheaper side.
    """

    input_dims: int
    num_classes: int
    soft_cap_logits: float = 0.0
    label_smoothing: float = 0.0
    z_loss_weight: float = 0.0
    num_chunks: int = 1
    logits_scale: float = 1.0

    #: ``x [..., D]`` and the kernel -> raw logits ``[..., V]``.
    logits_einsum: ClassVar[str] = ""

    def projection(self) -> tuple[jax.Array, jax.Array | None]:
        """``(kernel, bias or None)`` of the output projection, in the compute dtype."""
        raise NotImplementedError

    def _project(self, x: jax.Array, kernel: jax.Array) -> jax.Array:
        if self.logits_scale != 1.0:
            x = x * jnp.asarray(self.logits_scale, x.dtype)
        return jnp.einsum(self.logits_einsum, x, kernel)

    def get_logits(self, x: jax.Array) -> jax.Array:
        """``x [..., D]`` -> capped logits ``[..., V]`` in the compute dtype."""
        kernel, bias = self.projection()
        logits = self._project(self.to_fprop(x), kernel)
        if bias is not None:
            logits = logits + bias
        return vocab_loss.soft_cap(logits, self.soft_cap_logits)

    def __call__(
        self, x: jax.Array, class_ids: jax.Array, class_weights: jax.Array | None = None
    ) -> NestedMap:
        """``x [..., D]`` and ids ``[...]`` -> the loss terms of ``vocab_loss.loss_terms``
        (``per_token_xent [...]``, the weighted means ``total_loss``, ``log_pplx``, ...)."""
        kernel, bias = self.projection()
        x = self.to_fprop(x)
        if class_weights is None:
            class_weights = jnp.ones(class_ids.shape, jnp.float32)
        if self.num_chunks > 1:
            stats = vocab_loss.chunked_token_stats(
                x,
                kernel,
                self._project,
                bias,
                class_ids,
                cap=self.soft_cap_logits,
                label_smoothing=self.label_smoothing,
                num_chunks=self.num_chunks,
            )
        else:  # Tokens flattened: [N, D] -> [N, V], no reshapes between the passes.
            raw = self._project(x.reshape(-1, x.shape[-1]), kernel)
            stats = vocab_loss.token_stats(
                raw, bias, class_ids.reshape(-1), self.soft_cap_logits, self.label_smoothing
            )
            stats = tuple(s.reshape(class_ids.shape) for s in stats)
        return vocab_loss.loss_terms(stats, class_weights, self.z_loss_weight)


class FullSoftmax(_SoftmaxBase):
    """A separate ``[D, V]`` projection (plus a bias): ``[..., D] -> logits [..., V]``.

    Attributes:
      use_bias: add a bias ``b [V]`` to the logits (before the cap).
    """

    use_bias: bool = True

    logits_einsum: ClassVar[str] = "...d,dv->...v"

    def setup(self) -> None:
        self.w = self.create_variable(
            "w",
            (self.input_dims, self.num_classes),
            (EMBED, VOCAB),
            nn.initializers.lecun_normal(),
        )
        if self.use_bias:
            self.b = self.create_variable("b", (self.num_classes,), (VOCAB,), nn.initializers.zeros)

    def projection(self) -> tuple[jax.Array, jax.Array | None]:
        return self.w, self.b if self.use_bias else None


class SharedEmbeddingSoftmax(_SoftmaxBase):
    """One ``[V, D]`` table for the input lookup and the output logits.

    ``emb_lookup(ids [...]) -> [..., D]`` (times ``sqrt(D)`` if ``scale_sqrt_depth``);
    ``get_logits(x [..., D]) -> [..., V]`` is ``x @ table^T``.

    Attributes:
      scale_sqrt_depth: scale looked-up vectors by ``sqrt(D)``.
      lookup_style: 'index' or 'matmul', as :class:`Embedding`'s.
      use_bias: add a bias ``b [V]`` to the logits (before the cap), as praxis's
        shared softmax does by default.
    """

    scale_sqrt_depth: bool = True
    lookup_style: str = "index"
    use_bias: bool = False

    logits_einsum: ClassVar[str] = "...d,vd->...v"

    def setup(self) -> None:
        self.emb_var = _embedding_table(self, self.num_classes, self.input_dims)
        if self.use_bias:
            self.b = self.create_variable("b", (self.num_classes,), (VOCAB,), nn.initializers.zeros)

    def emb_lookup(self, ids: jax.Array) -> jax.Array:
        return _lookup(
            self.emb_var, ids, self.scale_sqrt_depth, self.fprop_dtype, self.lookup_style
        )

    def projection(self) -> tuple[jax.Array, jax.Array | None]:
        return self.emb_var, self.b if self.use_bias else None


def _timing_signal(
    positions: jax.Array, dims: int, min_timescale: float, max_timescale: float
) -> jax.Array:
    """Sinusoids ``[..., dims]`` (sin half then cos half) of float positions ``[...]``."""
    num_timescales = dims // 2
    log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    # Timescales run geometrically from min_timescale to max_timescale.
    inv_timescales = jnp.exp(jnp.arange(num_timescales, dtype=jnp.float32) * -log_increment) / (
        min_timescale
    )
    scaled = positions[..., None].astype(jnp.float32) * inv_timescales
    signal = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=-1)
    if dims % 2:
        signal = jnp.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, 1)])
    return signal


def _default_positions(seq_length: int) -> jax.Array:
    return jnp.arange(seq_length)[None, :]


class PositionalEmbedding(BaseLayer):
    """Fixed sinusoidal position embedding: positions ``[B, T]`` -> ``[B, T, D]``.

    Attributes:
      input_dims: ``D``.
      min_timescale: shortest wavelength.
      max_timescale: longest wavelength.
    """

    input_dims: int
    min_timescale: float = 1.0
    max_timescale: float = 10_000.0

    def __call__(self, seq_length: int, positions: jax.Array | None = None) -> jax.Array:
        if positions is None:
            positions = _default_positions(seq_length)
        signal = _timing_signal(positions, self.input_dims, self.min_timescale, self.max_timescale)
        return signal.astype(self.fprop_dtype)


class TrainablePositionalEmbedding(BaseLayer):
    """Learned position table ``[max_seq_length, D]``: positions ``[B, T]`` -> ``[B, T, D]``.

    Attributes:
      max_seq_length: number of positions in the table.
      input_dims: ``D``.
    """

    max_seq_length: int
    input_dims: int

    @nn.compact
    def __call__(self, seq_length: int, positions: jax.Array | None = None) -> jax.Array:
        if seq_length > self.max_seq_length:
            raise ValueError(
                f"Sequence length {seq_length} exceeds max_seq_length={self.max_seq_length}; "
                "raise TrainablePositionalEmbedding.max_seq_length."
            )
        table = self.create_variable(
            "emb_var",
            (self.max_seq_length, self.input_dims),
            (None, EMBED),
            nn.initializers.normal(stddev=0.02),
        )
        if positions is None:
            positions = _default_positions(seq_length)
        return jnp.take(table, positions, axis=0)


class RopeScaling(enum.Enum):
    """How RoPE's frequencies are stretched for contexts longer than training's.

    NONE: as trained. LINEAR: every frequency divided by ``scaling_factor`` (positions
    interpolated). LLAMA3: Llama 3.1's: frequencies whose wavelength is above
    ``original_max_position / low_freq_factor`` are divided by ``scaling_factor``, those
    below ``original_max_position / high_freq_factor`` kept, the ones between blended.
    """

    NONE = "none"
    LINEAR = "linear"
    LLAMA3 = "llama3"


class RotaryPositionalEmbedding(BaseLayer):
    """RoPE: rotates feature pairs ``(i, i + H/2)`` of ``[B, T, N, H]`` by position.

    Feature ``i < H/2`` pairs with ``i + H/2`` and is rotated by angle
    ``position / (min_timescale * (max_timescale/min_timescale)^(2i/H))``, its
    frequency then scaled as ``scaling`` says.

    Attributes:
      input_dims: ``H`` (must be even).
      min_timescale: see above.
      max_timescale: the RoPE "base" (10000 in most models; HF's ``rope_theta``).
      scaling: see :class:`RopeScaling`.
      scaling_factor: how many times longer the context is than trained (LINEAR, LLAMA3).
      low_freq_factor, high_freq_factor, original_max_position: LLAMA3's wavelength
        bounds (HF's ``low_freq_factor``, ``high_freq_factor``,
        ``original_max_position_embeddings``).
    """

    input_dims: int
    min_timescale: float = 1.0
    max_timescale: float = 10_000.0
    scaling: RopeScaling = RopeScaling.NONE
    scaling_factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def frequencies(self) -> jax.Array:
        """``[H/2]`` float32 angles per position (radians), after the scaling."""
        half = self.input_dims // 2
        fraction = 2 * jnp.arange(half, dtype=jnp.float32) / self.input_dims
        timescale = self.min_timescale * (self.max_timescale / self.min_timescale) ** fraction
        frequency = 1.0 / timescale
        if self.scaling is RopeScaling.NONE:
            return frequency
        scaled = frequency / self.scaling_factor
        if self.scaling is RopeScaling.LINEAR:
            return scaled
        wavelength = 2 * math.pi / frequency
        low, high = self.low_freq_factor, self.high_freq_factor
        # 0 at the long-wavelength bound (all scaled), 1 at the short one (all kept).
        blend = (self.original_max_position / wavelength - low) / (high - low)
        blended = (1 - blend) * scaled + blend * frequency
        out = jnp.where(wavelength > self.original_max_position / low, scaled, frequency)
        between = (wavelength >= self.original_max_position / high) & (
            wavelength <= self.original_max_position / low
        )
        return jnp.where(between, blended, out)

    def __call__(self, x: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        if self.input_dims % 2 or x.shape[-1] != self.input_dims:
            raise ValueError(
                f"RoPE needs an even last dim equal to input_dims={self.input_dims}, "
                f"got input shape {x.shape}."
            )
        if positions is None:
            positions = _default_positions(x.shape[1])
        angles = positions[..., None, None].astype(jnp.float32) * self.frequencies()  # [B,T,1,H/2]
        sin, cos = jnp.sin(angles), jnp.cos(angles)
        x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
        out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out.astype(x.dtype)
