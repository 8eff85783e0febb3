"""Task-facing models and the contract the trainer meets them through: decoder-only
(``LanguageModel``), encoder-decoder (``EncoderDecoderModel``) and classification models.

The trainer (``paxlite``) never reads a model's field or class names: it asks
the methods of :class:`BaseModel`. A new model family is a new subclass.
"""

from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite import decoding
from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.decoding import DecoderParams
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.layers.encoder_decoder import TransformerEncoderDecoder
from praxis_lite.layers.linears import MLPBlock
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.model_flops import EncoderDecoderShape, FlopsDefinition, LmShape, TrainFlops
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import BATCH, EMBED, LENGTH

#: ``(mean over the batch, its weight)``: averaged over batches weighted by ``weight``.
WeightedScalar = tuple[jax.Array, jax.Array]


class BaseModel(BaseLayer):
    """What the trainer needs from a model: batch spec, loss and metrics, FLOPs, decoding.

    Subclasses implement ``__call__`` and :meth:`batch_spec`; :meth:`train_flops`
    and decoding (:meth:`decode_prompt_keys` and :meth:`decode`, with
    :meth:`decode_unsupported` returning None) are optional.

    Attributes:
      is_encoder_decoder: targets come from inputs through an encoder (Hugging Face's
        ``config.is_encoder_decoder``): what ``paxlite.inference`` wraps it in.
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
          stop: ``praxis_lite.stop_strings.StopStrings`` of ``params.stop_strings``.

        Returns:
          ``praxis_lite.decoding.decode``'s NestedMap: ``tokens [B, N]``, ``lengths [B]``,
          ``log_probs [B, N]``, ``scores [B]`` (with ``num_return_sequences = n > 1``,
          ``[B, n, ...]``).
        """
        raise NotImplementedError


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
        out.num_tokens = weight = out.total_weight
        out.metrics = {
            "total_loss": (out.total_loss, weight),
            "accuracy": (out.accuracy, weight),
            "log_pplx": (out.log_pplx, weight),
        }
        token_weights = _token_weights(batch)
        weighted = token_weights > 0
        last = jnp.max(jnp.where(weighted, jnp.arange(weighted.shape[-1]) + 1, 0), axis=-1)
        out.per_example = NestedMap(
            score=-jnp.sum(out.per_token_xent * token_weights, axis=-1),
            weight=jnp.sum(token_weights, axis=-1),
            target_ids=batch["labels"],
            target_lengths=last,  # After the last weighted target: id 0 may be a token.
        )
        return out

    def batch_spec(self) -> dict[str, int]:
        return {"ids": 2, "labels": 2}

    def train_flops(self, batch: NestedMap) -> TrainFlops:
        """The Transformer count (``praxis_lite.model_flops``) for ``T = ids.shape[1]``."""
        return self._lm().train_flops(int(batch["ids"].shape[1]))

    def decode_prompt_keys(self) -> tuple[str, str]:
        return ("prefix_ids", "prefix_lengths")

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
        """Continues each prefix (``decoding.decode_lm``)."""
        return decoding.decode_lm(
            self, variables, prompt_ids, prompt_lengths, key, params, max_new_tokens, stop
        )

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
        out.num_tokens = weight = out.total_weight
        out.metrics = {
            "total_loss": (out.total_loss, weight),
            "accuracy": (out.accuracy, weight),
            "log_pplx": (out.log_pplx, weight),
        }
        weighted = weights > 0
        last = jnp.max(jnp.where(weighted, jnp.arange(weighted.shape[-1]) + 1, 0), axis=-1)
        out.per_example = NestedMap(
            score=-jnp.sum(out.per_token_xent * weights, axis=-1),
            weight=jnp.sum(weights, axis=-1),
            target_ids=labels,
            target_lengths=last,
        )
        return out

    def batch_spec(self) -> dict[str, int]:
        return {"encoder_input_tokens": 2, "decoder_input_tokens": 2, "decoder_target_tokens": 2}

    def train_flops(self, batch: NestedMap) -> TrainFlops:
        """The encoder-decoder count (``model_flops.EncoderDecoderShape``) for ``S`` =
        ``encoder_input_tokens.shape[1]`` inputs and ``T`` targets."""
        network = unbound_layer(self.encoder_decoder_tpl)
        stacks = [
            unbound_layer(network.encoder_stack_tpl),
            unbound_layer(network.decoder_stack_tpl),
        ]
        layouts = tuple(stack.layout() for stack in stacks)
        sides = [
            LmShape(
                num_layers=layout.num_layers,
                model_dims=network.model_dims,
                vocab_size=vocab,
                **unbound_layer(layout.block).matmul_shape(),
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
        """Targets of each input (``decoding.decode_seq2seq``: encoded once, then the
        decoder from id 0)."""
        del prompt_lengths  # The encoder masks the inputs' padding (id 0) itself.
        return decoding.decode_seq2seq(
            self, variables, prompt_ids, key, params, max_new_tokens, stop=stop
        )

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
        self, input_ids: jax.Array, decoder_ids: jax.Array, *, positions: jax.Array, max_len: int
    ) -> jax.Array:
        """Encodes ``input_ids [B, S]`` and starts the decoder with ``decoder_ids [B, P]``
        in a fresh ``max_len``-slot cache (the cross-attentions cache the encoder's keys
        and values). Returns ``[B, P, V]`` logits; apply with ``mutable=['cache']``."""
        memory = self.network.encode(input_ids)
        return self.network.extend(decoder_ids, positions=positions, max_len=max_len, memory=memory)

    def extend_step(self, ids: jax.Array, *, positions: jax.Array) -> jax.Array:
        """One decode step: ``ids [B]`` at ``positions [B]`` -> next-token logits ``[B, V]``."""
        return self.network.extend(ids[:, None], positions=positions[:, None])[:, 0]


def _token_weights(batch: NestedMap) -> jax.Array:
    """``[B, T]`` loss weights: ``weights``, else ``1 - paddings``, else ones."""
    if "weights" in batch:
        return batch["weights"].astype(jnp.float32)
    if "paddings" in batch:
        return 1.0 - batch["paddings"].astype(jnp.float32)
    return jnp.ones(batch["labels"].shape, jnp.float32)


class ClassificationMlpModel(BaseModel):
    """Pax's ``ClassificationMLPModel``: each token's class predicted by an MLP, made trainable.

    The batch is a NestedMap of ``[B, T]`` arrays: ``ids`` (input classes in
    ``[0, V)``), ``labels`` (target classes), and ``weights`` or ``paddings`` (loss
    weights: ``weights``, else ``1 - paddings``, else ones). Every token is classified
    on its own (no mixing over ``T``)::

      ids [B, T] -> softmax table lookup [B, T, D] -> mlp [B, T, D] -> logits [B, T, V]

    with one ``[V, D]`` table for the lookup and the logits (``x @ table^T``).

    Unlike Pax: Pax's ``compute_loss`` reports the accuracy as ``total_loss``, which
    has no gradient, so its model never learns. Here ``total_loss`` is the
    token-weighted softmax cross-entropy of ``labels`` (plus the softmax's z-loss
    term, 0 by default) and ``accuracy`` (the label has the max logit, a tie counting;
    token-weighted) is a metric of its own. The MLP child is named ``mlp`` (Pax's
    ``mlp_layers_0`` is a legacy checkpoint name), and the softmax has no bias (Pax's has
    one).

    Attributes:
      mlp_tpl: the MLP (``MLPBlock``); its dims in and out must both be the
        softmax's ``input_dims`` (``D``).
      softmax_tpl: the shared table (``SharedEmbeddingSoftmax``, with ``input_dims``
        ``D`` and ``num_classes`` ``V`` set).
    """

    mlp_tpl: LayerTpl = template_field(MLPBlock)
    softmax_tpl: LayerTpl = template_field(SharedEmbeddingSoftmax)

    def setup(self) -> None:
        self._check_dims()
        self.mlp = self.create_child(self.mlp_tpl)
        self.softmax = self.create_child(self.softmax_tpl)

    def __call__(self, batch: NestedMap, *, train: bool = False) -> NestedMap:
        """The softmax's loss terms (``vocab_loss.loss_terms``) and the metrics.

        Metrics (weighted by counted tokens): ``total_loss`` (the objective) and
        ``accuracy``. ``train`` changes nothing (no dropout).
        """
        del train
        labels = batch["labels"]
        x = self.constrain(self.softmax.emb_lookup(batch["ids"]), (BATCH, LENGTH, EMBED))
        x = self.mlp(x)
        token_weights = _token_weights(batch)
        out = self.softmax(x, labels, token_weights)
        weight = out.total_weight
        out.metrics = {"total_loss": (out.avg_loss, weight), "accuracy": (out.accuracy, weight)}
        return out

    def batch_spec(self) -> dict[str, int]:
        return {"ids": 2, "labels": 2}

    def train_flops(self, batch: NestedMap) -> TrainFlops:
        """Per example of ``T = ids.shape[1]`` tokens: ``6N``: ``6 * N_mlp * T``; ``palm``
        and ``causal`` (no attention): ``6 * (N_mlp + D*V) * T``.

        ``N_mlp``: the MLP's matmul weights (biases left out); ``D*V``: the logits
        projection (the table lookup is not a matmul).
        """
        seq_len = int(batch["ids"].shape[1])
        mlp, softmax = unbound_layer(self.mlp_tpl), unbound_layer(self.softmax_tpl)
        n_mlp = mlp.matmul_params()
        with_logits = 6.0 * (n_mlp + softmax.input_dims * softmax.num_classes) * seq_len
        per_example = {
            FlopsDefinition.SIX_N.value: 6.0 * n_mlp * seq_len,
            FlopsDefinition.PALM.value: with_logits,
            FlopsDefinition.CAUSAL.value: with_logits,
        }
        return TrainFlops(
            per_example=per_example,
            tokens_per_example=seq_len,
            description=(
                f"MLP L={mlp.num_layers} D={softmax.input_dims} F={mlp.hidden_dims} "
                f"V={softmax.num_classes}"
            ),
            non_embedding_params=n_mlp,
        )

    def _check_dims(self) -> None:
        """The MLP reads and writes vectors of the softmax's ``input_dims``."""
        dims = unbound_layer(self.mlp_tpl).layer_dims()
        d = unbound_layer(self.softmax_tpl).input_dims
        if dims[0] != d or dims[-1] != d:
            raise ValueError(
                f"ClassificationMlpModel: the MLP maps {dims[0]} -> {dims[-1]} dims but the "
                f"softmax table has input_dims={d}; set mlp_tpl.ff_tpl.input_dims and "
                f"output_dims to {d}."
            )
