"""TransformerLm and LanguageModel against numpy: loss, accuracy, per-token xent, the logits
of the whole forward pass; and packed documents give the losses of the documents run alone
(through the scanned and the pipelined stack)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import instantiate
from praxis_lite.layers.embedding_softmax import Embedding, FullSoftmax, PositionalEmbedding
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.lm import LanguageModel
from praxis_lite.py_utils import NestedMap
from tests.praxis_lite.layers import numpy_refs as ref


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


@pytest.mark.slow
@pytest.mark.parametrize("separate_embedding", [False, True])
def test_lm_loss_and_accuracy_match_numpy(separate_embedding):
    model = instantiate(_lm_config(separate_embedding))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 24, (3, 7)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 24, (3, 7)), jnp.int32)
    paddings = jnp.zeros((3, 7)).at[2, 4:].set(1.0)
    variables = model.init(jax.random.key(0), ids)
    logits = np.asarray(model.apply(variables, ids, paddings=paddings).logits, np.float64)
    labels = labels.at[:, ::2].set(logits.argmax(-1)[:, ::2])  # an accuracy in (0, 1)
    out = model.apply(variables, ids, labels=labels, paddings=paddings)
    assert "logits" not in out  # the loss path returns no [B, T, V] array
    xent = -np.take_along_axis(_np_log_softmax(logits), np.asarray(labels)[..., None], -1)[..., 0]
    weights = 1.0 - np.asarray(paddings)
    np.testing.assert_allclose(out.per_token_xent, xent, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.total_loss, (xent * weights).sum() / weights.sum(), rtol=1e-5)
    correct = (logits.argmax(-1) == np.asarray(labels)) * weights
    np.testing.assert_allclose(out.accuracy, correct.sum() / weights.sum(), rtol=1e-6)
    assert 0 < float(out.accuracy) < 1
    assert float(out.total_weight) == weights.sum()
    params = nn.unbox(variables["params"])
    assert ("embedding" in params) == separate_embedding


@pytest.mark.slow
def test_padding_does_not_change_unpadded_logits():
    model = instantiate(_lm_config(False))
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 24
    variables = model.init(jax.random.key(0), ids)
    paddings = jnp.zeros((2, 6)).at[:, 4:].set(1.0)
    changed = ids.at[:, 4:].set(5)
    a = model.apply(variables, ids, paddings=paddings).logits[:, :4]
    b = model.apply(variables, changed, paddings=paddings).logits[:, :4]
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
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
    assert out.per_token_xent.shape == (2, 5) and out.per_example.score.shape == (2,)
    assert model.apply(variables, batch, method="logits").shape == (2, 5, 24)


# --- packed sequences ----------------------------------------------------------------
# Two rows of T = 8 tokens packing four documents (lengths 3 + 5 and 4 + 2, then 2 pads).
_DOC_LENGTHS = ((3, 5), (4, 2))
_PACKED_T = 8


def _packed_lm_config(stack: str):
    """A LanguageModel whose TransformerLm adds sinusoidal positions (so positions matter)."""
    lm = _lm_config(False)
    lm.position_emb_tpl = PositionalEmbedding.HParams.config()
    if stack == "repeated":
        lm.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(num_layers=2)
        block = lm.stacked_transformer_tpl.block_tpl
    else:
        lm.stacked_transformer_tpl = LayerwiseShardablePipelined.HParams.config(
            num_stages=2, num_microbatches=2
        )
        lm.stacked_transformer_tpl.stage_tpl.num_layers = 1
        block = lm.stacked_transformer_tpl.stage_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads = 16, 32, 2
    return LanguageModel.HParams.config(lm_tpl=lm)


def _packed_and_separate_batches(seed: int = 0) -> tuple[NestedMap, NestedMap, np.ndarray]:
    """A packed batch ``[2, T]``, the same documents one per row ``[4, T]``, and the map.

    Returns the two batches and ``where [4, 2]``: document ``i`` starts at row
    ``where[i, 0]``, column ``where[i, 1]`` of the packed batch.
    """
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 24, (2, n)) for lengths in _DOC_LENGTHS for n in lengths]
    shape = (len(_DOC_LENGTHS), _PACKED_T)
    packed = {k: np.zeros(shape, np.int32) for k in ("ids", "labels", "segment_ids", "segment_pos")}
    separate = {k: np.zeros((len(docs), _PACKED_T), np.int32) for k in ("ids", "labels")}
    separate_weights = np.zeros((len(docs), _PACKED_T), np.float32)
    where = []
    for row, lengths in enumerate(_DOC_LENGTHS):
        start = 0
        for n in lengths:
            doc = docs[len(where)]
            cols = slice(start, start + n)
            packed["ids"][row, cols], packed["labels"][row, cols] = doc
            packed["segment_ids"][row, cols] = len(where) + 1
            packed["segment_pos"][row, cols] = np.arange(n)
            separate["ids"][len(where), :n], separate["labels"][len(where), :n] = doc
            separate_weights[len(where), :n] = 1.0
            where.append((row, start))
            start += n
    packed_weights = (packed["segment_ids"] > 0).astype(np.float32)
    packed_batch = NestedMap(
        **{k: jnp.asarray(v) for k, v in packed.items()},
        paddings=jnp.asarray(1.0 - packed_weights),
        weights=jnp.asarray(packed_weights),
    )
    separate_batch = NestedMap(
        **{k: jnp.asarray(v) for k, v in separate.items()},
        paddings=jnp.asarray(1.0 - separate_weights),
        weights=jnp.asarray(separate_weights),
    )
    return packed_batch, separate_batch, np.asarray(where)


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["repeated", "pipelined"])
def test_packed_documents_match_documents_run_one_by_one(stack):
    """No attention across documents and positions restart: per-token xent as if alone."""
    model = instantiate(_packed_lm_config(stack))
    packed, separate, where = _packed_and_separate_batches()
    variables = ref.init_variables(model, separate)
    apply = ref.jit_apply(model)
    packed_xent = np.asarray(apply(variables, packed).per_token_xent)
    separate_xent = np.asarray(apply(variables, separate).per_token_xent)
    lengths = [n for row in _DOC_LENGTHS for n in row]
    for i, ((row, start), n) in enumerate(zip(where, lengths, strict=True)):
        np.testing.assert_allclose(
            packed_xent[row, start : start + n], separate_xent[i, :n], rtol=1e-5, atol=1e-5
        )
    # Without the segment information the packed batch is one long sequence per row: the
    # later documents' losses change, so the comparison above can fail.
    unpacked = NestedMap(
        packed,
        segment_ids=jnp.ones_like(packed.segment_ids),
        segment_pos=jnp.broadcast_to(jnp.arange(_PACKED_T), packed.segment_pos.shape),
    )
    blind = np.asarray(apply(variables, unpacked).per_token_xent)
    row, start = where[1]
    assert not np.allclose(blind[row, start : start + lengths[1]], separate_xent[1, : lengths[1]])


# --- the forward pass against numpy ----------------------------------------------------
def _np_transformer_lm_logits(ids: np.ndarray, params: dict, num_layers: int) -> np.ndarray:
    """``ids [B, T]`` -> logits ``[B, T, V]``: the textbook pre-norm decoder, in float64.

    Shared embedding table ``[V, D]`` (lookup times ``sqrt(D)``, and the output
    projection), sinusoidal positions, per block ``x + attn(ln(x))`` then
    ``x + ffn(ln(x))`` (causal, all tokens real), a final layer norm.
    """
    table = params["softmax"]["emb_var"]
    d = table.shape[1]
    x = table[ids] * np.sqrt(d) + ref.sinusoids(np.arange(ids.shape[1])[None], d)
    for i in range(num_layers):
        block = params["transformer"][f"x_layers_{i}"]
        ln = block["layer_norm"]
        x = x + ref.attention(ref.layer_norm(x, ln["scale"], ln["bias"]), block["self_attention"])
        x = ref.transformer_ffn(x, block["ff_layer"])
    final = params["final_ln"]
    return ref.layer_norm(x, final["scale"], final["bias"]) @ table.T


def test_transformer_lm_logits_match_numpy_composition():
    cfg = _lm_config(False)
    cfg.position_emb_tpl = PositionalEmbedding.HParams.config()
    model = instantiate(cfg)
    ids = np.random.default_rng(3).integers(0, 24, (2, 6)).astype(np.int32)
    variables = ref.init_variables(model, ids)  # noised: generic biases and norm scales
    logits = ref.jit_apply(model)(variables, ids).logits
    want = _np_transformer_lm_logits(ids, ref.to_numpy(variables["params"]), num_layers=2)
    ref.assert_close(logits, want, jnp.float32, tol=1e-4)
