"""The encoder-decoder (T5) layers against numpy references: cross-attention, the stacks'
relative position bias, and the whole model in both T5 variants; scanned as plain, packed as
unpacked, KV-cache decoding as teacher forcing, and its FLOPs against a hand count."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.flops import FlopsDefinition
from praxis_lite.layers.attentions import DotProductAttention, QueryScale
from praxis_lite.models.t5 import T5Shape, t5_model
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import (
    DEFAULT_RULES,
    filter_rules_for_mesh,
    logical_shardings,
    strip_boxes,
)
from tests.praxis_lite.layers import numpy_refs as ref
from tests.praxis_lite.layers.test_relative_bias import _bucket

D, N, H, F, V = 16, 2, 8, 24, 20
T5_1_1 = dict(mlp_activations=("gelu", "linear"), logits_via_embedding=False)
T5_1_0 = dict(mlp_activations=("relu",), logits_via_embedding=True)


def _attend(xq, xkv, p, mask, bias=None):
    """T5's attention: no 1/sqrt(H) in the forward pass, no biases; ``mask [B, T, S]``."""
    q = np.einsum("btd,dnh->btnh", xq, p["w_q"])
    k = np.einsum("bsd,dnh->bsnh", xkv, p["w_k"])
    v = np.einsum("bsd,dnh->bsnh", xkv, p["w_v"])
    logits = np.einsum("btnh,bsnh->bnts", q, k)
    if bias is not None:
        logits = logits + bias[None]
    probs = ref.softmax(np.where(mask[:, None], logits, -np.inf))
    return np.einsum("btnh,nhd->btd", np.einsum("bnts,bsnh->btnh", probs, v), p["w_post"])


def _bias(table, t, s, bidirectional):
    """``[N, T, S]``: each (query, key) pair's bucket's entry, the scalar way."""
    buckets = [[_bucket(k - q, bidirectional, 32, 128) for k in range(s)] for q in range(t)]
    return table[:, np.array(buckets)]


def _block(x, p, mask, bias, activation, gated, memory=None, memory_mask=None):
    h = x + _attend(
        *(2 * [ref.rms_norm(x, p["layer_norm"]["scale"])]), p["self_attention"], mask, bias
    )
    if memory is not None:
        normed = ref.rms_norm(h, p["cross_layer_norm"]["scale"])
        h = h + _attend(normed, memory, p["cross_attention"], memory_mask)
    ff = p["ff_layer"]
    h_in = ref.rms_norm(h, ff["layer_norm"]["scale"])
    a = activation(h_in @ ff["ffn_layer1"]["w"])
    if gated:
        a = a * (h_in @ ff["ffn_layer1_gate"]["w"])
    return h + a @ ff["ffn_layer2"]["w"]


def _layers(stack):
    """A stack's per-layer weights (plain: ``x_layers_i``; scanned: sliced)."""
    if "repeat" in stack:
        blocks = stack["repeat"]["block"]
        count = len(jax.tree_util.tree_leaves(blocks)[0])
        return [jax.tree_util.tree_map(lambda a, i=i: a[i], blocks) for i in range(count)]
    return [stack[f"x_layers_{i}"] for i in range(len(stack) - 1)]


def t5_logits(p, enc_ids, dec_ids, variant):
    """The reference T5: encoder over ``enc_ids [B, S]`` (0: padding), decoder over
    ``dec_ids [B, T]``, logits ``[B, T, V]``."""
    gated = len(variant["mlp_activations"]) == 2
    activation = ref.gelu_tanh if gated else ref.relu
    table = (
        p["softmax"]["emb_var"] if variant["logits_via_embedding"] else p["embedding"]["emb_var"]
    )
    (b, s), t = enc_ids.shape, dec_ids.shape[1]
    key_mask = np.broadcast_to((enc_ids != 0)[:, None, :], (b, s, s))
    x = table[enc_ids]
    bias = _bias(p["encoder"]["relative_bias"]["rel_embedding"], s, s, True)
    for layer in _layers(p["encoder"]):
        x = _block(x, layer, key_mask, bias, activation, gated)
    memory = ref.rms_norm(x, p["encoder_ln"]["scale"])
    y = table[dec_ids]
    causal = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t))
    cross = np.broadcast_to((enc_ids != 0)[:, None, :], (b, t, s))
    bias = _bias(p["decoder"]["relative_bias"]["rel_embedding"], t, t, False)
    for layer in _layers(p["decoder"]):
        y = _block(y, layer, causal, bias, activation, gated, memory, cross)
    y = ref.rms_norm(y, p["decoder_ln"]["scale"])
    if variant["logits_via_embedding"]:
        return (y / math.sqrt(D)) @ table.T
    return y @ p["softmax"]["w"]


def _model(variant, scanned, layers=(2, 2)):
    shape = T5Shape(*layers, D, F, N, H, V, **variant)
    return ref.build(t5_model(shape, fprop_dtype=jnp.float32, scanned=scanned))


def _logits(model):
    """``(variables, batch) -> [B, T, V]``, jitted (teacher-forced logits)."""
    return ref.fast_jit(lambda variables, batch: model.apply(variables, batch, method="logits"))


def _batch(seed=0, b=2, s=7, t=5):
    rng = np.random.default_rng(seed)
    enc = rng.integers(2, V, (b, s)).astype(np.int32)
    enc[0, 4:] = 0  # A padded input.
    targets = rng.integers(2, V, (b, t)).astype(np.int32)
    dec = np.concatenate([np.zeros((b, 1), np.int32), targets[:, :-1]], axis=1)
    return NestedMap(
        encoder_input_tokens=enc, decoder_input_tokens=dec, decoder_target_tokens=targets
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant, scanned", [(T5_1_1, False), (T5_1_0, True)], ids=["t5_1_1-plain", "t5_1_0-scanned"]
)
def test_t5_logits_match_the_numpy_reference(variant, scanned):
    model = _model(variant, scanned)
    batch = _batch()
    variables = ref.init_variables(model, batch)
    got = _logits(model)(variables, batch)
    want = t5_logits(
        ref.to_numpy(variables["params"]["network"]),
        *(batch[k] for k in ("encoder_input_tokens", "decoder_input_tokens")),
        variant,
    )
    ref.assert_close(got, want, jnp.float32)


def test_cross_attention_matches_the_reference_with_padding_and_segments():
    """Queries see the memory of their own segment only, never a padded slot; no causal
    mask, no scaling (T5's)."""
    cfg = DotProductAttention.HParams.config(
        input_dims=D, num_heads=N, dims_per_head=H, use_bias=False, query_scale=QueryScale.IN_INIT
    )
    layer = ref.build(cfg)
    x, memory = ref.normal((2, 5, D), seed=1), ref.normal((2, 6, D), seed=2)
    memory_paddings = np.zeros((2, 6), np.float32)
    memory_paddings[1, 4:] = 1.0
    query_segments = np.array([[1, 1, 2, 2, 2], [1, 1, 1, 1, 1]], np.int32)
    memory_segments = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 1]], np.int32)
    variables = ref.init_variables(layer, x, memory, method="cross_attend")
    got = layer.apply(
        variables,
        x,
        memory,
        memory_paddings=memory_paddings,
        segment_ids=query_segments,
        memory_segment_ids=memory_segments,
        method="cross_attend",
    )
    mask = (memory_paddings < 0.5)[:, None, :] & (
        query_segments[:, :, None] == memory_segments[:, None, :]
    )
    p = ref.to_numpy(variables["params"])
    ref.assert_close(got, _attend(x, memory, p, mask), jnp.float32)


def test_query_scale_is_in_the_query_init():
    """w_q starts 1/sqrt(H) smaller than w_k (T5X's and HF's init), and the forward pass
    does not scale."""
    cfg = DotProductAttention.HParams.config(
        input_dims=64,
        num_heads=4,
        dims_per_head=16,
        use_bias=False,
        query_scale=QueryScale.IN_INIT,
    )
    layer = ref.build(cfg)
    variables = ref.init_variables(layer, ref.normal((1, 2, 64)), noise=0.0)
    w_q, w_k = (np.asarray(variables["params"][k]) for k in ("w_q", "w_k"))
    np.testing.assert_allclose(np.std(w_q) * math.sqrt(16), np.std(w_k), rtol=0.1)
    assert float(layer.query_scaling(16)) == 1.0


def test_scanned_stacks_are_the_plain_stacks_with_weights_stacked():
    batch = _batch(seed=3)
    plain, scanned = _model(T5_1_1, False), _model(T5_1_1, True)
    variables = ref.init_variables(plain, batch)
    params = variables["params"]["network"]
    stacked = dict(params)
    for side in ("encoder", "decoder"):
        layers = _layers(params[side])
        stacked[side] = {
            "relative_bias": params[side]["relative_bias"],
            "repeat": {"block": jax.tree_util.tree_map(lambda *a: np.stack(a), *layers)},
        }
    want = _logits(plain)(variables, batch)
    got = _logits(scanned)({"params": {"network": stacked}}, batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_packed_rows_give_each_example_its_unpacked_loss():
    """Two examples packed into one row (segment ids on both sides, positions restarting)
    have the per-token losses they have alone."""
    model = _model(T5_1_1, True, layers=(1, 1))
    alone = _batch(seed=4, b=2, s=4, t=3)
    alone.encoder_input_tokens[0, 3:] = 0  # Example 0: 3 input tokens; example 1: 4.
    variables = ref.init_variables(model, alone)
    packed = NestedMap({k: np.concatenate([alone[k][0, :3], alone[k][1]])[None] for k in alone})
    packed.encoder_segment_ids = np.array([[1, 1, 1, 2, 2, 2, 2]], np.int32)
    packed.decoder_segment_ids = np.array([[1, 1, 1, 2, 2, 2]], np.int32)
    packed.decoder_positions = np.array([[0, 1, 2, 0, 1, 2]], np.int32)
    apply = ref.jit_apply(model)
    want = np.asarray(apply(variables, alone).per_token_xent).reshape(-1)
    got = np.asarray(apply(variables, packed).per_token_xent).reshape(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cached_decoding_scores_its_tokens_as_teacher_forcing_does():
    """Greedy decoding (encoder once, the cross-attentions' keys and values cached at the
    first step, scanned stacks) gives each token the log-probability the teacher-forced
    model gives it."""
    model = _model(T5_1_0, True)
    batch = _batch(seed=5, b=3)
    variables = ref.init_variables(model, batch)
    out = ref.fast_jit(
        lambda v, ids: model.decode(v, ids, None, jax.random.key(0), DecoderParams(), 6)
    )(variables, batch.encoder_input_tokens)
    tokens = np.asarray(out.tokens)
    forced = NestedMap(
        encoder_input_tokens=batch.encoder_input_tokens,
        decoder_input_tokens=np.concatenate([np.zeros((3, 1), np.int32), tokens[:, :-1]], 1),
    )
    log_probs = jax.nn.log_softmax(_logits(model)(variables, forced))
    want = np.take_along_axis(np.asarray(log_probs), tokens[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.log_probs), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tokens, np.argmax(np.asarray(log_probs), -1))


def test_train_flops_are_the_hand_count():
    """One small T5 1.1 (gated, 2 encoder + 3 decoder layers), S = 7 inputs, T = 5 targets,
    counted by hand."""
    model = _model(T5_1_1, True, layers=(2, 3))
    flops = model.train_flops(_batch(s=7, t=5))
    s, t = 7, 5
    attn = 4 * D * N * H  # q, k, v, output
    ffn = 3 * D * F  # gated
    encoder = 2 * (attn + ffn) * s
    decoder = 3 * (attn + ffn) * t + 3 * (2 * D * N * H * t + 2 * D * N * H * s)  # + cross
    six_n = 6 * (encoder + decoder)
    maps = 12 * N * H * (2 * s * s + 3 * t * s)  # encoder self, cross: full maps
    logits = 6 * D * V * t
    assert flops.per_example[FlopsDefinition.SIX_N.value] == six_n
    assert (
        flops.per_example[FlopsDefinition.PALM.value]
        == six_n + logits + maps + 12 * N * H * 3 * t * t
    )
    assert (
        flops.per_example[FlopsDefinition.CAUSAL.value]
        == six_n + logits + maps + 6 * N * H * 3 * t * t
    )
    assert flops.tokens_per_example == t
    assert flops.non_embedding_params == 2 * (attn + ffn) + 3 * (2 * attn + ffn)


@pytest.mark.slow
def test_sharded_loss_and_gradients_are_one_devices():
    """On 8 devices (data 4 x model 2, the default rules: heads, MLP and vocabulary over
    'mdl') the loss and every gradient are the one-device ones; the cross-attention's
    weights are split too."""
    model = _model(T5_1_1, True, layers=(1, 1))
    batch = _batch(seed=6, b=8)
    variables = ref.init_variables(model, batch)

    def loss(params, batch):
        return model.apply({"params": params}, batch).total_loss

    step = jax.value_and_grad(loss)
    want_loss, want_grads = ref.fast_jit(step)(variables["params"], batch)
    mesh = Mesh(np.array(jax.devices()).reshape(1, 4, 2), ("replica", "data", "mdl"))
    rules = filter_rules_for_mesh(DEFAULT_RULES, mesh)
    with nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"]
        shardings = strip_boxes(logical_shardings(abstract, mesh, rules))
    params = jax.device_put(variables["params"], shardings)
    w_q = params["network"]["decoder"]["repeat"]["block"]["cross_attention"]["w_q"]
    assert w_q.sharding.spec == PartitionSpec(None, None, "mdl", None)
    rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got_loss, got_grads = ref.fast_jit(step)(params, jax.device_put(batch, rows))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    jax.tree_util.tree_map(
        lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6),
        jax.device_get(got_grads),
        jax.device_get(want_grads),
    )
