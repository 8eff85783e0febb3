"""``t5x.examples.t5.network``: T5X's example encoder-decoder, described by ``T5Config``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5X's ``network.T5Config`` (its fields and defaults): sizes in units of features."""

    vocab_size: int
    dtype: Any = "float32"
    emb_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = False
    float32_attention_logits: bool = False


@dataclasses.dataclass(frozen=True)
class Transformer:
    """T5X's ``network.Transformer``: the encoder-decoder that ``config`` describes."""

    config: T5Config
