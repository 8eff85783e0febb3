"""Task-facing models: a layer that takes an input batch and returns its metrics."""

from __future__ import annotations

import jax

from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import template_field
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.py_utils import NestedMap


class LanguageModel(BaseLayer):
    """Next-token prediction over an LM batch.

    The batch is a NestedMap of ``[B, T]`` arrays: ``ids`` (inputs), ``labels``
    (targets), ``paddings`` (1.0 at padding), ``weights`` (loss weights), and
    optionally ``segment_ids`` / ``segment_pos`` for packed sequences.

    Attributes:
      lm_tpl: the language model layer (see TransformerLm).
    """

    lm_tpl: object = template_field(TransformerLm)

    def setup(self) -> None:
        self.lm = self.create_child(self.lm_tpl)

    def __call__(self, batch: NestedMap, *, train: bool = False) -> NestedMap:
        """Returns TransformerLm's metrics plus ``num_tokens`` (sum of weights)."""
        out = self.lm(
            batch["ids"],
            labels=batch["labels"],
            paddings=batch.get("paddings"),
            label_weights=batch.get("weights"),
            segment_ids=batch.get("segment_ids"),
            positions=batch.get("segment_pos"),
            train=train,
        )
        out.num_tokens = out.total_weight
        return out

    def logits(self, batch: NestedMap) -> jax.Array:
        """``[B, T, V]`` next-token logits."""
        return self.lm(batch["ids"], paddings=batch.get("paddings")).logits

    def prefill(
        self, ids: jax.Array, *, paddings: jax.Array, positions: jax.Array, max_len: int
    ) -> jax.Array:
        """Runs a prompt and fills a fresh ``max_len``-slot KV cache.

        Args:
          ids: ``[B, P]`` prompt tokens (shorter prompts left-padded).
          paddings: ``[B, P]``, 1.0 at the padding.
          positions: ``[B, P]`` positions within each prompt.
          max_len: cache slots (``P`` plus the decode steps).

        Returns:
          ``[B, P, V]`` logits; apply with ``mutable=['cache']`` to get the cache.
        """
        return self.lm.extend(ids, positions=positions, paddings=paddings, max_len=max_len)

    def extend_step(self, ids: jax.Array, *, positions: jax.Array) -> jax.Array:
        """One decode step: ``ids [B]`` at ``positions [B]`` -> next-token logits ``[B, V]``.

        Reads and extends the ``'cache'`` collection written by :meth:`prefill`.
        """
        return self.lm.extend(ids[:, None], positions=positions[:, None])[:, 0]
