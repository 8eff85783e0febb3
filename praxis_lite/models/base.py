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
from praxis_lite.decoding import sampling
from praxis_lite.decoding.sampling import DecodePrompt, DecoderParams
from praxis_lite.flops import TrainFlops
from praxis_lite.py_utils import NestedMap

#: ``(mean over the batch, its weight)``: averaged over batches weighted by ``weight``.
WeightedScalar = tuple[jax.Array, jax.Array]


class BaseModel(BaseLayer):
    """What the trainer needs from a model: batch spec, loss and metrics, FLOPs, decoding.

    Subclasses implement ``__call__`` (:func:`loss_metrics` builds the metrics of a token
    loss) and :meth:`batch_spec`; :meth:`train_flops` and decoding are optional. One
    :meth:`decode` serves every model that decodes: the model says where its prompt is
    (:meth:`decode_prompt_keys`, :meth:`decode_prompt`), runs it (``prefill``,
    ``extend_step``) and returns None from :meth:`decode_unsupported`.

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

        A model that decodes implements :meth:`decode_prompt_keys`, ``prefill`` and
        ``extend_step`` (see ``sampling.model_decode_fns``), and :meth:`decode_prompt` where
        its prompt is not the batch's.
        """
        return (
            f"{type(self).__name__} cannot decode: it needs decode_prompt_keys(), prefill() and "
            "extend_step() (LanguageModel and EncoderDecoderModel have them)."
        )

    def decode_prompt_keys(self) -> tuple[str, str]:
        """The decode batch's keys of what is decoded from: ``(ids [B, P], lengths [B])``
        (an LM's prefix, a seq2seq model's inputs); the batch's ``target_ids`` and
        ``target_lengths`` are the references."""
        raise NotImplementedError

    @nn.nowrap
    def decode_prompt(self, prompt_ids: jax.Array, prompt_lengths: jax.Array) -> DecodePrompt:
        """What decoding continues, of the batch's prompt: here the prompt itself (an LM's)."""
        return DecodePrompt(prompt_ids, prompt_lengths)

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
        """New tokens after each prompt (call inside jit, on the unbound model): the model's
        ``prefill`` and ``extend_step`` run by ``praxis_lite.decoding.sampling.decode``.

        Args:
          variables: ``{'params': ...}``.
          prompt_ids: ``[B, P]`` right-padded (the batch's ``decode_prompt_keys()[0]``).
          prompt_lengths: ``[B]``.
          key: the sampling RNG.
          params: how to decode (greedy, sampling or beams; the logits controls).
          max_new_tokens: ``N``.
          stop: ``praxis_lite.decoding.stop_strings.StopStrings`` of ``params.stop_strings``.

        Returns:
          ``sampling.decode``'s NestedMap: ``tokens [B, N]``, ``lengths [B]``,
          ``log_probs [B, N]``, ``scores [B]`` (with ``num_return_sequences = n > 1``,
          ``[B, n, ...]``).
        """
        prompt = self.decode_prompt(prompt_ids, prompt_lengths)
        prefill, step = sampling.model_decode_fns(self, variables)
        return sampling.decode(
            prefill,
            step,
            prompt.ids,
            prompt.lengths,
            key,
            params,
            max_new_tokens,
            context=prompt.context,
            prompt_is_counted=prompt.is_counted,
            stop=stop,
        )


def token_loss_weights(batch: NestedMap) -> jax.Array:
    """``[B, T]`` loss weights: ``weights``, else ``1 - paddings``, else ones."""
    if "weights" in batch:
        return batch["weights"].astype(jnp.float32)
    if "paddings" in batch:
        return 1.0 - batch["paddings"].astype(jnp.float32)
    return jnp.ones(batch["labels"].shape, jnp.float32)


def loss_metrics(
    terms: NestedMap,
    token_weights: jax.Array | None = None,
    target_ids: jax.Array | None = None,
    *,
    names: tuple[str, ...] = ("total_loss", "accuracy", "log_pplx"),
) -> NestedMap:
    """The contract's outputs of a model trained on a token loss: ``terms`` (the softmax's
    ``vocab_loss.loss_terms``) with ``num_tokens``, ``metrics`` and, given the targets,
    ``per_example``.

    Args:
      terms: ``per_token_xent [B, T]``, ``total_weight`` and the scalars named in ``names``.
      token_weights: ``[B, T]`` the loss weights (0: not counted), with ``target_ids``.
      target_ids: ``[B, T]``; None: no ``per_example``.
      names: the metrics, each the term of that name weighted by the counted tokens
        (``total_weight``).

    Returns:
      ``terms`` with ``num_tokens`` (``total_weight``), ``metrics`` ``{name: WeightedScalar}``
      and ``per_example``: ``score [B]`` (the weighted sum of ``-per_token_xent``), ``weight
      [B]``, ``target_ids`` and ``target_lengths [B]`` (just after the last weighted target:
      id 0 may be a token).
    """
    terms.num_tokens = weight = terms.total_weight
    terms.metrics = {name: (terms[name], weight) for name in names}
    if target_ids is not None:
        weighted = token_weights > 0
        last = jnp.max(jnp.where(weighted, jnp.arange(weighted.shape[-1]) + 1, 0), axis=-1)
        terms.per_example = NestedMap(
            score=-jnp.sum(terms.per_token_xent * token_weights, axis=-1),
            weight=jnp.sum(token_weights, axis=-1),
            target_ids=target_ids,
            target_lengths=last,
        )
    return terms
