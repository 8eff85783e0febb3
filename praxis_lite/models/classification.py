"""Pax's classification MLP model: each token's class predicted by an MLP."""

from __future__ import annotations

from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.flops import FlopsDefinition, TrainFlops
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.layers.linears import MLPBlock
from praxis_lite.models.base import BaseModel, loss_metrics, token_loss_weights
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import BATCH, EMBED, LENGTH


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
        """The softmax's loss terms (``vocab_loss.loss_terms``), ``num_tokens`` and the metrics.

        Metrics (weighted by counted tokens): ``total_loss`` (the objective) and
        ``accuracy``. ``train`` changes nothing (no dropout).
        """
        del train
        labels = batch["labels"]
        x = self.constrain(self.softmax.emb_lookup(batch["ids"]), (BATCH, LENGTH, EMBED))
        x = self.mlp(x)
        token_weights = token_loss_weights(batch)
        out = self.softmax(x, labels, token_weights)
        return loss_metrics(out, names=("total_loss", "accuracy"))

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
