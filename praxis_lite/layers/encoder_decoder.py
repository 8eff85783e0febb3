"""TransformerEncoderDecoder: an encoder-decoder Transformer (T5's shape).

Shapes: ``B`` batch, ``S`` input (encoder) time, ``T`` target (decoder) time, ``D`` model
dims, ``V`` vocabulary size. Token id 0 is padding on both sides (T5's and seqio's).

::

  input ids [B, S] -> embed -> encoder stack -> norm -> memory [B, S, D]
  decoder ids [B, T] -> embed -> decoder stack (self-attention, cross-attention over the
      memory, feed-forward) -> norm -> logits [B, T, V] / the next-token loss

Which norms, activations, position terms and logits a family uses are the templates'
(``tasks.t5.t5_model`` builds T5's).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import LayerTpl, template_field
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.layers.normalizations import LayerNorm
from praxis_lite.layers.transformers import Memory, StackedTransformer
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import ACTIVATION_EMBED, LENGTH, LM_BATCH, VOCAB


class TransformerEncoderDecoder(BaseLayer):
    """Input ids ``[B, S]`` and decoder ids ``[B, T]`` -> logits ``[B, T, V]`` and the loss.

    Attributes:
      model_dims: ``D``.
      vocab_size: ``V``, shared by inputs and targets.
      softmax_tpl: the output layer (given ``input_dims``/``num_classes``); with
        ``embedding_tpl`` None its table is also the token embedding (T5 1.0: a
        ``SharedEmbeddingSoftmax`` without ``sqrt(D)`` scaling and ``logits_scale`` ``1 /
        sqrt(D)``); T5 1.1: a ``FullSoftmax`` without bias.
      embedding_tpl: a token embedding of its own (given ``num_classes``/``input_dims``),
        shared by the encoder and the decoder; ``None``: the softmax's table.
      encoder_stack_tpl: the encoder's stack (its blocks not causal).
      decoder_stack_tpl: the decoder's stack (causal blocks with ``cross_atten_tpl``).
      encoder_ln_tpl / decoder_ln_tpl: each stack's final norm (given ``input_dims``).
      dropout_prob: T5's dropout on the embeddings and on each stack's normed output
        (the blocks' own dropouts are their templates').
    """

    model_dims: int
    vocab_size: int
    softmax_tpl: LayerTpl = template_field(SharedEmbeddingSoftmax)
    embedding_tpl: LayerTpl = template_field(None)
    encoder_stack_tpl: LayerTpl = template_field(StackedTransformer)
    decoder_stack_tpl: LayerTpl = template_field(StackedTransformer)
    encoder_ln_tpl: LayerTpl = template_field(LayerNorm)
    decoder_ln_tpl: LayerTpl = template_field(LayerNorm)
    dropout_prob: float = 0.0

    def setup(self) -> None:
        d, v = self.model_dims, self.vocab_size
        self.softmax = self.create_child(self.softmax_tpl, input_dims=d, num_classes=v)
        if self.embedding_tpl is not None:
            self.embedding = self.create_child(self.embedding_tpl, num_classes=v, input_dims=d)
        elif not hasattr(self.softmax, "emb_lookup"):
            raise ValueError(
                f"{type(self.softmax).__name__} has no embedding table to share; set "
                "TransformerEncoderDecoder.embedding_tpl (e.g. Embedding.HParams.config()) or "
                "use SharedEmbeddingSoftmax."
            )
        self.encoder = self.create_child(self.encoder_stack_tpl)
        self.decoder = self.create_child(self.decoder_stack_tpl)
        self.encoder_ln = self.create_child(self.encoder_ln_tpl, input_dims=d)
        self.decoder_ln = self.create_child(self.decoder_ln_tpl, input_dims=d)
        self.dropout = nn.Dropout(self.dropout_prob)

    def embed(self, ids: jax.Array, train: bool = False) -> jax.Array:
        """Token embeddings ``[B, L, D]`` of ``ids [B, L]`` (dropout when training)."""
        if self.embedding_tpl is not None:
            x = self.embedding(ids)
        else:
            x = self.softmax.emb_lookup(ids)
        x = self.dropout(self.to_fprop(x), deterministic=not train)
        return self.constrain(x, (LM_BATCH, LENGTH, ACTIVATION_EMBED))

    def encode(
        self, ids: jax.Array, *, segment_ids: jax.Array | None = None, train: bool = False
    ) -> Memory:
        """The encoder over ``ids [B, S]`` (0: padding, never attended).

        Args:
          ids: input token ids ``[B, S]``.
          segment_ids: ``[B, S]`` ids of packed inputs (attention stays within one).
          train: enables dropout.

        Returns:
          ``Memory(outputs [B, S, D], paddings [B, S], segment_ids)``: what the decoder's
          cross-attention reads.
        """
        paddings = (ids == 0).astype(jnp.float32)
        x = self.encoder(
            self.embed(ids, train), paddings=paddings, segment_ids=segment_ids, train=train
        )
        x = self.dropout(self.encoder_ln(x), deterministic=not train)
        x = self.constrain(x, (LM_BATCH, LENGTH, ACTIVATION_EMBED))
        return Memory(x, paddings, segment_ids)

    def run_decoder(
        self,
        ids: jax.Array,
        memory: Memory,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """The decoder's normed outputs ``[B, T, D]`` for ``ids [B, T]`` (teacher forcing:
        causal self-attention, cross-attention over ``memory``)."""
        x = self.decoder(
            self.embed(ids, train),
            segment_ids=segment_ids,
            positions=positions,
            memory=memory,
            train=train,
        )
        x = self.dropout(self.decoder_ln(x), deterministic=not train)
        return self.constrain(x, (LM_BATCH, LENGTH, ACTIVATION_EMBED))

    def __call__(
        self,
        input_ids: jax.Array,
        decoder_ids: jax.Array,
        *,
        labels: jax.Array | None = None,
        label_weights: jax.Array | None = None,
        input_segment_ids: jax.Array | None = None,
        decoder_segment_ids: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        train: bool = False,
    ) -> NestedMap:
        """Runs the model; with ``labels``, also the loss.

        Args:
          input_ids: ``[B, S]`` encoder tokens (0: padding).
          decoder_ids: ``[B, T]`` decoder tokens (the targets shifted right, 0 first).
          labels: ``[B, T]`` target ids; ``None`` for logits only.
          label_weights: ``[B, T]`` loss weights; default ``labels > 0``.
          input_segment_ids / decoder_segment_ids: ``[B, S]`` / ``[B, T]`` ids of packed
            examples: attention stays within one, on both sides and across.
          decoder_positions: ``[B, T]`` positions within each target (for position terms
            of the blocks that have them).
          train: enables dropout (needs the 'dropout' RNG).

        Returns:
          Without labels, NestedMap(logits ``[B, T, V]``). With labels, the softmax's loss
          terms (``vocab_loss.loss_terms``, as ``TransformerLm``'s): ``per_token_xent [B, T]``,
          ``total_loss``, ``log_pplx``, ``z_loss``, ``accuracy``, ``total_weight``.
        """
        memory = self.encode(input_ids, segment_ids=input_segment_ids, train=train)
        x = self.run_decoder(
            decoder_ids,
            memory,
            segment_ids=decoder_segment_ids,
            positions=decoder_positions,
            train=train,
        )
        if labels is None:
            logits = self.softmax.get_logits(x)
            return NestedMap(logits=self.constrain(logits, (LM_BATCH, LENGTH, VOCAB)))
        if label_weights is None:
            label_weights = (labels > 0).astype(jnp.float32)
        return self.softmax(x, labels, label_weights)

    def extend(
        self,
        ids: jax.Array,
        *,
        positions: jax.Array,
        max_len: int | None = None,
        memory: Memory | None = None,
    ) -> jax.Array:
        """Incremental decoding: decoder ids ``[B, T]`` -> logits ``[B, T, V]`` (float32).

        The first call passes ``max_len`` (the self-attention cache's slots) and the
        encoder's ``memory``, whose keys and values each cross-attention computes once and
        caches; every later call (``T = 1``) passes neither. Apply with
        ``mutable=['cache']``.
        """
        x = self.embed(ids)
        x = self.decoder.extend(x, positions=positions, max_len=max_len, memory=memory)
        logits = self.softmax.get_logits(self.decoder_ln(x)).astype(jnp.float32)
        return self.constrain(logits, (LM_BATCH, LENGTH, VOCAB))
