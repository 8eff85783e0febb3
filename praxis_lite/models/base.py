"""The contract the trainer meets every model through: :class:`BaseModel`.

The trainer (``paxlite``) never reads a model's field or class names: it asks
the methods of :class:`BaseModel`. A new model family is a new subclass (``lm``,
``encoder_decoder``, ``classification`` in this package).
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.flops import TrainFlops
from praxis_lite.py_utils import NestedMap

#: ``(mean over the batch, its weight)``: averaged over batches weighted by ``weight``.
WeightedScalar = tuple[jax.Array, jax.Array]


class BaseModel(BaseLayer):
    """What the trainer needs from a model: batch spec, loss and metrics, FLOPs, decoding.

    Subclasses implement ``__call__`` and :meth:`batch_spec`; :meth:`train_flops`
    and decoding (:meth:`decode_prompt_keys` and :meth:`decode`, with
    :meth:`decode_unsupported` returning None) are optional.

    Attributes:
      is_encoder_decoder: targets come from inputs through an encoder (Hugging Face's
        ``config.is_encoder_decoder``): what ``paxlite.pretrained.loading`` wraps it in.
    """

    is_encoder_decoder: ClassVar[bool] = False

    def __call__(self, batch: NestedMap, *, train: bool = False) -> NestedMap:
        """Loss and metrics of ``batch``.

        Returns:
          A NestedMap with ``metrics``: ``{name: WeightedScalar}``, the means over
          the batch with their weights; the learner's ``loss_name`` is one of them
          (the objective), and its weight is what throughput counts (tokens, or
          examples for a model without sequences). Optionally ``per_example``:
          ``score [B]`` (summed log-likelihood of the targets), ``weight [B]`` (0
          for padded examples), ``target_ids [B, T]`` and optionally ``target_lengths
          [B]`` (the targets' ends; else the nonzero ids are counted), for eval score
          metrics.
          Other fields are the model's own.
        """
        raise NotImplementedError

    def batch_spec(self) -> dict[str, int]:
        """``{key: rank}`` of the arrays the model reads from a batch (all with batch dim 0)."""
        raise NotImplementedError

    def example_batch(self) -> NestedMap:
        """``init``'s example batch, shapes only: int32 ``[1, 8, ...]`` of each key of
        :meth:`batch_spec` (for abstract parameters: ``jax.eval_shape`` of ``init``)."""
        return NestedMap(
            {
                key: jax.ShapeDtypeStruct((1,) + (8,) * (rank - 1), jnp.int32)
                for key, rank in self.batch_spec().items()
            }
        )

    def train_flops(self, batch: NestedMap) -> TrainFlops | None:
        """Training FLOPs of one example like ``batch``'s (arrays or shapes); None: uncounted."""
        del batch
        return None

    def decode_unsupported(self) -> str | None:
        """Why this model cannot decode (one sentence with the fix), or None if it can.

        A model that decodes implements :meth:`decode_prompt_keys` and :meth:`decode`.
        """
        return (
            f"{type(self).__name__} cannot decode: it needs decode_prompt_keys() and decode() "
            "(LanguageModel and EncoderDecoderModel have them)."
        )

    def decode_prompt_keys(self) -> tuple[str, str]:
        """The decode batch's keys of what is decoded from: ``(ids [B, P], lengths [B])``
        (an LM's prefix, a seq2seq model's inputs); the batch's ``target_ids`` and
        ``target_lengths`` are the references."""
        raise NotImplementedError

    @nn.nowrap
    def decode(
        self,
        variables: dict[str, Any],
        prompt_ids: jax.Array,
        prompt_lengths: jax.Array,
        key: jax.Array,
        params: DecoderParams,
        max_new_tokens: int,
        stop: Any = None,
    ) -> NestedMap:
        """New tokens after each prompt (call inside jit, on the unbound model).

        Args:
          variables: ``{'params': ...}``.
          prompt_ids: ``[B, P]`` right-padded (the batch's ``decode_prompt_keys()[0]``).
          prompt_lengths: ``[B]``.
          key: the sampling RNG.
          params: how to decode (greedy, sampling or beams; the logits controls).
          max_new_tokens: ``N``.
          stop: ``praxis_lite.decoding.stop_strings.StopStrings`` of ``params.stop_strings``.

        Returns:
          ``praxis_lite.decoding.sampling.decode``'s NestedMap: ``tokens [B, N]``, ``lengths [B]``,
          ``log_probs [B, N]``, ``scores [B]`` (with ``num_return_sequences = n > 1``,
          ``[B, n, ...]``).
        """
        raise NotImplementedError


def token_loss_weights(batch: NestedMap) -> jax.Array:
    """``[B, T]`` loss weights: ``weights``, else ``1 - paddings``, else ones."""
    if "weights" in batch:
        return batch["weights"].astype(jnp.float32)
    if "paddings" in batch:
        return 1.0 - batch["paddings"].astype(jnp.float32)
    return jnp.ones(batch["labels"].shape, jnp.float32)
