"""The encoder-decoder model (T5): targets predicted from inputs, and its decoding."""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.decoding.sampling import DecodePrompt
from praxis_lite.flops import EncoderDecoderShape, LmShape, TrainFlops
from praxis_lite.layers.encoder_decoder import TransformerEncoderDecoder
from praxis_lite.models.base import BaseModel, loss_metrics
from praxis_lite.py_utils import NestedMap

#: T5's decoder start: the id every target is decoded from (Hugging Face's
#: ``decoder_start_token_id``).
DECODER_START_ID = 0


class EncoderDecoderModel(BaseModel):
    """Targets predicted from inputs (T5): an encoder-decoder over a seq2seq batch.

    The batch has seqio's ``EncDecFeatureConverter`` keys (T5X's): ``encoder_input_tokens
    [B, S]``, ``decoder_input_tokens [B, T]`` (the targets shifted right, 0 first),
    ``decoder_target_tokens [B, T]``, optionally ``decoder_loss_weights [B, T]`` (else
    ``targets > 0``) and, packed, ``encoder_segment_ids``, ``decoder_segment_ids``,
    ``decoder_positions``. Id 0 is padding. Decode batches prompt with ``input_ids [B, S]``
    and ``input_lengths [B]``; decoding starts from id 0 (T5's decoder start).

    Attributes:
      encoder_decoder_tpl: the network (``TransformerEncoderDecoder``).
    """

    encoder_decoder_tpl: LayerTpl = template_field(TransformerEncoderDecoder)
    is_encoder_decoder: ClassVar[bool] = True

    def setup(self) -> None:
        self.network = self.create_child(self.encoder_decoder_tpl)

    def __call__(self, batch: NestedMap, *, train: bool = False) -> NestedMap:
        """The network's loss terms, ``num_tokens``, and the contract's metrics and
        per_example (as ``LanguageModel``'s: ``total_loss``, ``accuracy``, ``log_pplx``,
        weighted by the counted target tokens)."""
        labels = batch["decoder_target_tokens"]
        weights = batch.get("decoder_loss_weights")
        weights = (labels > 0) if weights is None else weights
        weights = weights.astype(jnp.float32)
        out = self.network(
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            labels=labels,
            label_weights=weights,
            input_segment_ids=batch.get("encoder_segment_ids"),
            decoder_segment_ids=batch.get("decoder_segment_ids"),
            decoder_positions=batch.get("decoder_positions"),
            train=train,
        )
        return loss_metrics(out, token_weights=weights, target_ids=labels)

    def batch_spec(self) -> dict[str, int]:
        return {"encoder_input_tokens": 2, "decoder_input_tokens": 2, "decoder_target_tokens": 2}

    def train_flops(self, batch: NestedMap) -> TrainFlops:
        """The encoder-decoder count (``flops.EncoderDecoderShape``) for ``S`` =
        ``encoder_input_tokens.shape[1]`` inputs and ``T`` targets."""
        network = unbound_layer(self.encoder_decoder_tpl)
        stacks = [
            unbound_layer(network.encoder_stack_tpl),
            unbound_layer(network.decoder_stack_tpl),
        ]
        layouts = tuple(stack.layout() for stack in stacks)
        sides = [
            LmShape.of_stack(
                layout,
                unbound_layer(layout.block).matmul_shape(),
                None,
                network.model_dims,
                vocab,
            )
            for layout, vocab in zip(layouts, (0, network.vocab_size), strict=True)
        ]
        lengths = (
            int(batch["encoder_input_tokens"].shape[1]),
            int(batch["decoder_target_tokens"].shape[1]),
        )
        return TrainFlops.of_encoder_decoder(EncoderDecoderShape(*sides), lengths, layouts)

    def decode_prompt_keys(self) -> tuple[str, str]:
        return ("input_ids", "input_lengths")

    @nn.nowrap
    def decode_prompt(self, prompt_ids: jax.Array, prompt_lengths: jax.Array) -> DecodePrompt:
        """The start id ``DECODER_START_ID`` (a one-token prompt of every row), after the
        inputs ``prompt_ids [B, S]`` (``context``: encoded once, at the prefill; beams and
        samples of a row share its encoding and cross-attention keys and values)."""
        del prompt_lengths  # The encoder masks the inputs' padding (id 0) itself.
        b = prompt_ids.shape[0]
        start = jnp.full((b, 1), DECODER_START_ID, jnp.int32)
        return DecodePrompt(start, jnp.ones((b,), jnp.int32), prompt_ids, is_counted=False)

    def decode_unsupported(self) -> str | None:
        return None

    def encode(self, input_ids: jax.Array) -> jax.Array:
        """The encoder's outputs ``[B, S, D]`` of ``input_ids [B, S]``."""
        return self.network.encode(input_ids).outputs

    def logits(self, batch: NestedMap) -> jax.Array:
        """``[B, T, V]`` logits of ``batch``'s ``decoder_input_tokens`` given its
        ``encoder_input_tokens`` (teacher forcing)."""
        return self.network(batch["encoder_input_tokens"], batch["decoder_input_tokens"]).logits

    def prefill(
        self,
        decoder_ids: jax.Array,
        input_ids: jax.Array,
        *,
        paddings: jax.Array,
        positions: jax.Array,
        max_len: int,
    ) -> jax.Array:
        """Encodes ``input_ids [B, S]`` and starts the decoder with ``decoder_ids [B, P]``
        in a fresh ``max_len``-slot cache (the cross-attentions cache the encoder's keys
        and values). Returns ``[B, P, V]`` logits; apply with ``mutable=['cache']``.

        ``paddings [B, P]`` are none: :meth:`decode_prompt`'s prompt is one start id.
        """
        del paddings
        memory = self.network.encode(input_ids)
        return self.network.extend(decoder_ids, positions=positions, max_len=max_len, memory=memory)

    def extend_step(self, ids: jax.Array, *, positions: jax.Array) -> jax.Array:
        """One decode step: ``ids [B]`` at ``positions [B]`` -> next-token logits ``[B, V]``."""
        return self.network.extend(ids[:, None], positions=positions[:, None])[:, 0]
