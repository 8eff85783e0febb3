"""TransformerLm: a decoder-only language model.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``V`` vocabulary size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.flops import LmShape, StackLayout, TrainFlops
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.layers.normalizations import LayerNorm
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import ACTIVATION_EMBED, LENGTH, LM_BATCH, VOCAB


class TransformerLm(BaseLayer):
    """Token ids ``[B, T]`` -> logits ``[B, T, V]`` and the next-token loss.

    Attributes:
      model_dims: ``D``.
      vocab_size: ``V``.
      softmax_tpl: output layer (given ``input_dims``/``num_classes``). If it is a
        ``SharedEmbeddingSoftmax`` and ``embedding_tpl`` is None, its table is
        also the input embedding.
      embedding_tpl: a separate input embedding (given ``num_classes``/``input_dims``);
        ``None`` to share the softmax's table.
      position_emb_tpl: absolute position embedding (given ``input_dims``);
        ``None`` for none (e.g. with RoPE in attention).
      stacked_transformer_tpl: the stack (plain or repeated), dims set by the user.
      final_ln_tpl: norm after the stack (given ``input_dims``).
    """

    model_dims: int
    vocab_size: int
    softmax_tpl: LayerTpl = template_field(SharedEmbeddingSoftmax)
    embedding_tpl: LayerTpl = template_field(None)
    position_emb_tpl: LayerTpl = template_field(None)
    stacked_transformer_tpl: LayerTpl = template_field(StackedTransformer)
    final_ln_tpl: LayerTpl = template_field(LayerNorm)

    def setup(self) -> None:
        d, v = self.model_dims, self.vocab_size
        self.softmax = self.create_child(self.softmax_tpl, input_dims=d, num_classes=v)
        if self.embedding_tpl is not None:
            self.embedding = self.create_child(self.embedding_tpl, num_classes=v, input_dims=d)
        elif not hasattr(self.softmax, "emb_lookup"):
            raise ValueError(
                f"{type(self.softmax).__name__} has no embedding table to share; set "
                "TransformerLm.embedding_tpl (e.g. Embedding.HParams.config()) or use "
                "SharedEmbeddingSoftmax."
            )
        if self.position_emb_tpl is not None:
            self.position_emb = self.create_child(self.position_emb_tpl, input_dims=d)
        self.transformer = self.create_child(self.stacked_transformer_tpl)
        self.final_ln = self.create_child(self.final_ln_tpl, input_dims=d)

    def stack_layout(self) -> StackLayout:
        """How the stack runs its blocks (asked of the stack layer itself)."""
        return unbound_layer(self.stacked_transformer_tpl).layout()

    def lm_shape(self) -> LmShape:
        """The sizes the model FLOPs depend on (see ``praxis_lite.flops``)."""
        layout = self.stack_layout()
        block = unbound_layer(layout.block).matmul_shape()
        moe_block = None
        if layout.moe_block is not None:
            moe_block = unbound_layer(layout.moe_block).matmul_shape()
        return LmShape.of_stack(layout, block, moe_block, self.model_dims, self.vocab_size)

    def train_flops(self, seq_len: int) -> TrainFlops:
        """Training FLOPs of one example of ``seq_len`` tokens, by definition."""
        return TrainFlops.of_lm(self.lm_shape(), seq_len, self.stack_layout())

    def embed(self, ids: jax.Array, positions: jax.Array | None) -> jax.Array:
        """Token (and position) embeddings ``[B, T, D]``."""
        if self.embedding_tpl is not None:
            x = self.embedding(ids)
        else:
            x = self.softmax.emb_lookup(ids)
        if self.position_emb_tpl is not None:
            x = x + self.position_emb(ids.shape[1], positions)
        return self.constrain(self.to_fprop(x), (LM_BATCH, LENGTH, ACTIVATION_EMBED))

    def __call__(
        self,
        inputs: jax.Array,
        *,
        labels: jax.Array | None = None,
        paddings: jax.Array | None = None,
        label_weights: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        train: bool = False,
    ) -> NestedMap:
        """Runs the model; with ``labels``, also the loss.

        Args:
          inputs: token ids ``[B, T]``.
          labels: next-token ids ``[B, T]``; ``None`` for logits only.
          paddings: ``[B, T]``, 1.0 at padding (not attended, no loss).
          label_weights: ``[B, T]`` loss weights; default ``1 - paddings``.
          segment_ids: ``[B, T]`` ids of packed sequences (attention stays within one).
          positions: ``[B, T]`` positions within each sequence (default ``0..T-1``).
          train: enables dropout (needs the 'dropout' RNG).

        Returns:
          Without labels, NestedMap(logits ``[B, T, V]``). With labels, the loss only (no
          ``[B, T, V]`` array: see ``vocab_loss``), the softmax's ``vocab_loss.loss_terms``:
          ``per_token_xent [B, T]``, ``total_loss`` (weighted mean xent plus the softmax's
          z-loss term: the training objective), ``log_pplx`` (weighted mean xent),
          ``z_loss``, ``accuracy`` (weighted, scalar; a tie for the max logit counts as
          correct), ``total_weight`` (counted tokens).
        """
        x = self.embed(inputs, positions)
        x = self.transformer(
            x, paddings=paddings, segment_ids=segment_ids, positions=positions, train=train
        )
        x = self.constrain(self.final_ln(x), (LM_BATCH, LENGTH, ACTIVATION_EMBED))
        if labels is None:
            logits = self.softmax.get_logits(x)
            return NestedMap(logits=self.constrain(logits, (LM_BATCH, LENGTH, VOCAB)))
        if label_weights is None:
            label_weights = (
                jnp.ones(labels.shape, jnp.float32)
                if paddings is None
                else 1.0 - paddings.astype(jnp.float32)
            )
        return self.softmax(x, labels, label_weights)

    def extend(
        self,
        ids: jax.Array,
        *,
        positions: jax.Array,
        paddings: jax.Array | None = None,
        max_len: int | None = None,
    ) -> jax.Array:
        """Incremental decoding: ids ``[B, T]`` -> logits ``[B, T, V]`` (float32).

        Prefill is one call over the whole (left-padded) prompt with ``max_len``
        (the cache size: prompt plus decode steps); each decode step is a call
        with ``T = 1``. Every attention layer keeps its keys and values in the
        ``'cache'`` collection (apply with ``mutable=['cache']``). See
        ``DotProductAttention.extend``.

        Args:
          ids: token ids ``[B, T]``.
          positions: ``[B, T]`` position of each token within its sequence.
          paddings: ``[B, T]``, 1.0 at padding tokens (never attended to).
          max_len: cache slots, on the first call only.
        """
        x = self.embed(ids, positions)
        x = self.transformer.extend(x, positions=positions, paddings=paddings, max_len=max_len)
        logits = self.softmax.get_logits(self.final_ln(x)).astype(jnp.float32)
        return self.constrain(logits, (LM_BATCH, LENGTH, VOCAB))
