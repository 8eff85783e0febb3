"""The decoder-only language model: next-token prediction over an LM batch, and its decoding
(``BaseModel.decode`` of its ``prefill`` and ``extend_step``)."""

from __future__ import annotations

from typing import Any

import jax

from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.flops import TrainFlops
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.base import BaseModel, loss_metrics, token_loss_weights
from praxis_lite.py_utils import NestedMap


class LanguageModel(BaseModel):
    """Next-token prediction over an LM batch.

    The batch is a NestedMap of ``[B, T]`` arrays: ``ids`` (inputs), ``labels``
    (targets), ``paddings`` (1.0 at padding), ``weights`` (loss weights), and
    optionally ``segment_ids`` / ``segment_pos`` for packed sequences.

    Attributes:
      lm_tpl: the language model layer (see TransformerLm).
    """

    lm_tpl: LayerTpl = template_field(TransformerLm)

    def setup(self) -> None:
        self.lm = self.create_child(self.lm_tpl)

    def __call__(self, batch: NestedMap, *, train: bool = False) -> NestedMap:
        """TransformerLm's outputs, ``num_tokens``, and the contract's metrics and per_example.

        Metrics (weighted by counted tokens): ``total_loss`` (the objective),
        ``accuracy``, ``log_pplx``.
        """
        out = self.lm(
            batch["ids"],
            labels=batch["labels"],
            paddings=batch.get("paddings"),
            label_weights=batch.get("weights"),
            segment_ids=batch.get("segment_ids"),
            positions=batch.get("segment_pos"),
            train=train,
        )
        return loss_metrics(
            out, token_weights=token_loss_weights(batch), target_ids=batch["labels"]
        )

    def batch_spec(self) -> dict[str, int]:
        return {"ids": 2, "labels": 2}

    def train_flops(self, batch: NestedMap) -> TrainFlops:
        """The Transformer count (``praxis_lite.flops``) for ``T = ids.shape[1]``."""
        return self._lm().train_flops(int(batch["ids"].shape[1]))

    def decode_prompt_keys(self) -> tuple[str, str]:
        return ("prefix_ids", "prefix_lengths")

    def decode_unsupported(self) -> str | None:
        stack = unbound_layer(self._lm().stacked_transformer_tpl)
        if hasattr(stack, "extend"):
            return None
        return (
            f"Decoding is not supported for the {type(stack).__name__} stack (the model's "
            "stacked_transformer_tpl has no extend() for a KV cache). Decode the same "
            "experiment and checkpoint with pipelining off: for the LM experiments, "
            "--set=NUM_STAGES=1 with the 'stage' mesh devices on another axis (e.g. "
            "--set=ICI_MESH_SHAPE=1,1,2,1 for LmSyntheticTinyPipeline); a GPipe "
            "(CIRCULAR_REPEAT=1) checkpoint has the plain repeated stack's weights."
        )

    def _lm(self) -> Any:
        """The unbound TransformerLm of ``lm_tpl`` (its fields and counts, no weights)."""
        return unbound_layer(self.lm_tpl)

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
