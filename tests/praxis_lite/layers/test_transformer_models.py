"""TransformerLm and LanguageModel: loss, accuracy and per-token xent against numpy."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import instantiate
from praxis_lite.layers.embedding_softmax import Embedding, FullSoftmax
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models import LanguageModel
from praxis_lite.py_utils import NestedMap


def _lm_config(separate_embedding: bool):
    cfg = TransformerLm.HParams.config(model_dims=16, vocab_size=24)
    cfg.stacked_transformer_tpl.num_layers = 2
    block = cfg.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads = 16, 32, 2
    if separate_embedding:
        cfg.softmax_tpl = FullSoftmax.HParams.config()
        cfg.embedding_tpl = Embedding.HParams.config()
    return cfg


def _np_log_softmax(logits):
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


@pytest.mark.parametrize("separate_embedding", [False, True])
def test_lm_loss_and_accuracy_match_numpy(separate_embedding):
    model = instantiate(_lm_config(separate_embedding))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 24, (3, 7)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 24, (3, 7)), jnp.int32)
    paddings = jnp.zeros((3, 7)).at[2, 4:].set(1.0)
    variables = model.init(jax.random.key(0), ids)
    out = model.apply(variables, ids, labels=labels, paddings=paddings)
    logits = np.asarray(out.logits, np.float64)
    xent = -np.take_along_axis(_np_log_softmax(logits), np.asarray(labels)[..., None], -1)[..., 0]
    weights = 1.0 - np.asarray(paddings)
    np.testing.assert_allclose(out.per_token_xent, xent, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.total_loss, (xent * weights).sum() / weights.sum(), rtol=1e-5)
    correct = (logits.argmax(-1) == np.asarray(labels)) * weights
    np.testing.assert_allclose(out.accuracy, correct.sum() / weights.sum(), rtol=1e-6)
    assert float(out.total_weight) == weights.sum()
    params = nn.unbox(variables["params"])
    assert ("embedding" in params) == separate_embedding
    logits_only = model.apply(variables, ids, paddings=paddings)
    np.testing.assert_allclose(logits_only.logits, out.logits, rtol=1e-6)


def test_padding_does_not_change_unpadded_logits():
    model = instantiate(_lm_config(False))
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 24
    variables = model.init(jax.random.key(0), ids)
    paddings = jnp.zeros((2, 6)).at[:, 4:].set(1.0)
    changed = ids.at[:, 4:].set(5)
    a = model.apply(variables, ids, paddings=paddings).logits[:, :4]
    b = model.apply(variables, changed, paddings=paddings).logits[:, :4]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_language_model_wraps_batch():
    cfg = LanguageModel.HParams.config(lm_tpl=_lm_config(False))
    model = instantiate(cfg)
    batch = NestedMap(
        ids=jnp.ones((2, 5), jnp.int32),
        labels=jnp.ones((2, 5), jnp.int32),
        paddings=jnp.zeros((2, 5)),
        weights=jnp.ones((2, 5)).at[0, 0].set(0.0),
    )
    variables = model.init(jax.random.key(0), batch)
    out = model.apply(variables, batch)
    assert float(out.num_tokens) == 9.0
    assert out.logits.shape == (2, 5, 24)
