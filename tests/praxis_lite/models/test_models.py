"""The task-facing models against numpy: ClassificationMlpModel's loss, accuracy and FLOPs."""

import jax
import numpy as np
import pytest

from praxis_lite.flops import FlopsDefinition
from praxis_lite.layers.embedding_softmax import SharedEmbeddingSoftmax
from praxis_lite.models.classification import ClassificationMlpModel
from praxis_lite.py_utils import NestedMap
from tests.praxis_lite.layers import numpy_refs as ref

# L layers, D model dims, F hidden dims, V classes; B x T tokens.
L, D, F, V = 3, 6, 10, 11
B, T = 3, 5


def _config(num_layers=L, model_dims=D, hidden_dims=F, num_classes=V, out_dims=None):
    cfg = ClassificationMlpModel.HParams.config()
    cfg.mlp_tpl.num_layers, cfg.mlp_tpl.hidden_dims = num_layers, hidden_dims
    cfg.mlp_tpl.ff_tpl.input_dims = model_dims
    cfg.mlp_tpl.ff_tpl.output_dims = model_dims if out_dims is None else out_dims
    cfg.softmax_tpl = SharedEmbeddingSoftmax.HParams.config(
        input_dims=model_dims, num_classes=num_classes, scale_sqrt_depth=False
    )
    return cfg


def _batch(weights_key: str) -> NestedMap:
    """Random ids and labels with some tokens padded (by ``paddings`` or zero ``weights``)."""
    rng = np.random.default_rng(0)
    padded = np.zeros((B, T), np.float32)
    padded[0, 3:] = padded[2, 1:] = 1.0
    batch = NestedMap(
        ids=rng.integers(0, V, (B, T)).astype(np.int32),
        labels=rng.integers(0, V, (B, T)).astype(np.int32),
    )
    batch[weights_key] = padded if weights_key == "paddings" else 1.0 - padded
    return batch


def _numpy_logits(p, ids):
    """``[B, T, V]``: table lookup, relu(h @ w + b) per MLP layer, then ``h @ table^T``."""
    table = p["softmax"]["emb_var"]
    h = table[ids]
    for i in range(L):
        ff = p["mlp"][f"mlp_layers_{i}"]
        h = ref.relu(h @ ff["linear"]["w"] + ff["bias"]["b"])
    return h @ table.T


def _numpy_metrics(logits, labels, weights):
    """``(loss, accuracy)``: weighted softmax cross-entropy and accuracy of ``labels``."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    xent = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    correct = logits.argmax(-1) == labels
    return (xent * weights).sum() / weights.sum(), (correct * weights).sum() / weights.sum()


@pytest.mark.parametrize("weights_key", ["paddings", "weights"])
def test_classification_mlp_loss_and_accuracy(weights_key):
    model = ref.build(_config())
    batch = _batch(weights_key)
    variables = ref.init_variables(model, batch)
    weights = 1.0 - batch["paddings"] if weights_key == "paddings" else batch["weights"]
    logits = _numpy_logits(ref.to_numpy(variables["params"]), batch["ids"])
    # Every other token's label is the model's own prediction: an accuracy between 0 and 1.
    batch["labels"][:, ::2] = logits.argmax(-1)[:, ::2]
    loss, accuracy = _numpy_metrics(logits, batch["labels"], weights)
    assert 0.3 < accuracy < 1.0

    out = ref.jit_apply(model)(variables, batch, train=True)
    assert set(out.metrics) == {"total_loss", "accuracy"}
    for name, want in (("total_loss", loss), ("accuracy", accuracy)):
        mean, weight = out.metrics[name]
        ref.assert_close(mean, want, np.float32)
        assert float(weight) == weights.sum() == 9.0


def test_classification_mlp_train_flops_hand_counted():
    model = ref.build(_config())
    batch = _batch("paddings")
    n_mlp = D * F + F * F + F * D  # 220 matmul weights; biases not counted.
    flops = model.train_flops(batch)
    assert flops.per_example == {
        FlopsDefinition.SIX_N.value: 6 * n_mlp * T,
        FlopsDefinition.PALM.value: 6 * (n_mlp + D * V) * T,
        FlopsDefinition.CAUSAL.value: 6 * (n_mlp + D * V) * T,
    }
    assert flops.per_example["6N"] == 6600 and flops.per_example["palm"] == 8580
    assert flops.tokens_per_example == T and flops.non_embedding_params == n_mlp
    assert flops.description == "MLP L=3 D=6 F=10 V=11"

    # N_mlp is the model's own kernels: every MLP weight matrix ("w"), from an abstract init.
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch)["params"]
    kernels = [
        leaf.value.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(
            shapes, is_leaf=lambda x: hasattr(x, "value")
        )[0]
        if path[0].key == "mlp" and path[-1].key == "w"
    ]
    assert len(kernels) == L and sum(np.prod(s) for s in kernels) == n_mlp


def test_classification_mlp_contract():
    model = ref.build(_config())
    assert model.batch_spec() == {"ids": 2, "labels": 2}
    assert "cannot decode" in model.decode_unsupported()


def test_classification_mlp_dims_must_match_the_softmax():
    model = ref.build(_config(out_dims=D + 1))
    with pytest.raises(ValueError, match="output_dims to 6"):
        jax.eval_shape(model.init, jax.random.key(0), _batch("paddings"))
