"""MoeFeedForward against independent paths: a numpy reference (dropless), capacity routing
with room for every token (dropless again), one expert (the dense feed-forward), and the same
layer sharded over 8 devices (Pax's experts over 'data', MaxText's 'expert' axis)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from praxis_lite import instantiate
from praxis_lite.base_layer import AUX_LOSS, SUMMARIES
from praxis_lite.layers.activations import SiLU
from praxis_lite.layers.transformers import TransformerFeedForward
from praxis_lite.moe import Dispatch, MoeFeedForward, TopKWeights
from praxis_lite.moe import dispatch as dispatch_lib
from praxis_lite.sharding import (
    EXPERT_AXIS_RULES,
    EXPERTS_OVER_DATA_RULES,
    FSDP_AND_TENSOR_PARALLEL_RULES,
    filter_rules_for_mesh,
    logical_shardings,
    strip_boxes,
)
from tests.praxis_lite.layers import numpy_refs as ref

D, F, E = 8, 12, 4


def _layer(**fields) -> MoeFeedForward:
    fields = (
        dict(
            input_dims=D,
            hidden_dims=F,
            num_experts=E,
            use_gated_activation=True,
            activation_tpl=SiLU.HParams.config(),
        )
        | fields
    )
    return instantiate(MoeFeedForward.HParams.config(**fields))


def _inputs(batch: int = 2, length: int = 6):
    x = jnp.asarray(ref.normal((batch, length, D), seed=1))
    paddings = jnp.zeros((batch, length)).at[1, -2:].set(1.0)
    return x, paddings


def _perturbed_params(layer, x):
    """Initial weights with the norm's scale and bias moved off 1 and 0 (they must matter)."""
    params = layer.init(jax.random.key(0), x)["params"]
    params = nn.unbox(params)
    norm = params["layer_norm"]
    norm["scale"] = norm["scale"] + jnp.asarray(ref.normal((D,), seed=5, scale=0.3))
    norm["bias"] = norm["bias"] + jnp.asarray(ref.normal((D,), seed=6, scale=0.3))
    return params


def _apply(layer, params, x, paddings):
    fn = ref.fast_jit(
        lambda p, x, pad: layer.apply({"params": p}, x, paddings=pad, mutable=[AUX_LOSS, SUMMARIES])
    )
    return fn(params, x, paddings)


def _silu(a):
    return a / (1 + np.exp(-a))


def _numpy_dropless(params, x, paddings, k, weights, shared_gate):
    """The layer by its definition, per token, in float64."""
    p = ref.to_numpy(params)
    x = np.asarray(x, np.float64)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mean) / np.sqrt(var + 1e-6) * p["layer_norm"]["scale"] + p["layer_norm"]["bias"]
    logits = h @ p["gate"]
    out = np.zeros_like(x)
    for b, t in np.ndindex(*x.shape[:2]):
        chosen = np.argsort(-logits[b, t])[:k]
        probs = np.exp(logits[b, t] - logits[b, t].max())
        probs /= probs.sum()
        w = probs[chosen]
        if weights is TopKWeights.RENORMALIZED:
            w = w / w.sum()
        for e, we in zip(chosen, w, strict=True):
            hidden = _silu(h[b, t] @ p["wi_gate_0"][e]) * (h[b, t] @ p["wi_0"][e])
            out[b, t] += we * hidden @ p["wo_0"][e]
        hidden = _silu(h[b, t] @ p["shared_wi_gate_0"]) * (h[b, t] @ p["shared_wi_0"])
        shared = hidden @ p["shared_wo_0"]
        if shared_gate:
            shared = shared / (1 + np.exp(-(h[b, t] @ p["shared_gate"])))
        out[b, t] += shared
    return x + out * (1.0 - np.asarray(paddings, np.float64))[..., None]


@pytest.mark.parametrize(
    ("k", "weights", "shared_gate"),
    [(2, TopKWeights.RENORMALIZED, False), (3, TopKWeights.SOFTMAX, True)],
)
def test_dropless_matches_numpy(k, weights, shared_gate):
    layer = _layer(
        dispatch=Dispatch.DROPLESS,
        num_experts_per_token=k,
        top_k_weights=weights,
        shared_expert_dims=5,
        shared_expert_gate=shared_gate,
    )
    x, paddings = _inputs()
    params = _perturbed_params(layer, x)
    got, _ = _apply(layer, params, x, paddings)
    want = _numpy_dropless(params, x, paddings, k, weights, shared_gate)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow
def test_dropless_equals_capacity_routing_with_room_for_every_token():
    """GShard's top-2 renormalised over the two, nothing dropped, is dropless top-2."""
    x, paddings = _inputs()
    capacity = _layer(num_groups=2, capacity_factor=float(E))
    dropless = _layer(dispatch=Dispatch.DROPLESS, top_k_weights=TopKWeights.RENORMALIZED)
    params = _perturbed_params(capacity, x)
    (want, mutables) = _apply(capacity, params, x, paddings)
    assert float(mutables[SUMMARIES]["over_capacity_2_ratio"][0]) == 0.0
    got, _ = _apply(dropless, params, x, paddings)
    np.testing.assert_allclose(got, want, atol=1e-5)
    tight, _ = _apply(_layer(capacity_factor=0.5), params, x, paddings)
    assert not np.allclose(tight, want, atol=1e-3)  # Dropped tokens change the output.


@pytest.mark.slow
def test_decoding_routes_without_capacity():
    """extend (a decode step's few tokens): top-2 with nothing dropped, whatever the mode;
    with room for every token, the same as the forward pass."""
    x, paddings = _inputs()
    layer = _layer(num_groups=2, capacity_factor=float(E), shared_expert_dims=3)
    params = _perturbed_params(layer, x)
    want, _ = _apply(layer, params, x, paddings)
    extend = ref.fast_jit(
        lambda p, x, pad: layer.apply({"params": p}, x, paddings=pad, method=layer.extend)
    )
    np.testing.assert_allclose(extend(params, x, paddings), want, atol=1e-5)
    tiny = _layer(num_groups=2, capacity_factor=0.1, shared_expert_dims=3)
    one_token = extend(params, x[:, :1], None)  # 2 tokens: capacity routing has no slot
    np.testing.assert_allclose(
        tiny.apply({"params": params}, x[:, :1], method=tiny.extend), one_token, atol=1e-6
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        dict(top_k_weights=TopKWeights.SOFTMAX, num_experts_per_token=3),
        dict(gating_logit_cap=0.5, num_groups=3),
    ],
)
def test_dropless_decoding_equals_its_forward_pass(fields):
    """Its weights, its logit cap; and any number of groups (a decode step's tokens: 2)."""
    x, paddings = _inputs()
    layer = _layer(dispatch=Dispatch.DROPLESS, **fields)
    params = _perturbed_params(layer, x)
    want, _ = _apply(layer, params, x, paddings)
    got = layer.apply({"params": params}, x, paddings=paddings, method=layer.extend)
    np.testing.assert_allclose(got, want, atol=1e-5)
    step = layer.apply({"params": params}, x[:, :1], method=layer.extend)
    np.testing.assert_allclose(step, want[:, :1], atol=1e-5)


def test_one_expert_top1_is_the_dense_feed_forward():
    x, paddings = _inputs()
    moe = _layer(num_experts=1, num_experts_per_token=1, dispatch=Dispatch.DROPLESS)
    params = _perturbed_params(moe, x)
    dense = instantiate(
        TransformerFeedForward.HParams.config(
            input_dims=D,
            hidden_dims=F,
            use_bias=False,
            use_gated_activation=True,
            activation_tpl=SiLU.HParams.config(),
        )
    )
    dense_params = {
        "layer_norm": params["layer_norm"],
        "ffn_layer1": {"w": params["wi_gate_0"][0]},  # The activated projection
        "ffn_layer1_gate": {"w": params["wi_0"][0]},
        "ffn_layer2": {"w": params["wo_0"][0]},
    }
    got, _ = _apply(moe, params, x, None)
    want = dense.apply({"params": dense_params}, x)
    np.testing.assert_allclose(got, want, atol=1e-5)


_MESHES = {
    "experts over data (Pax)": (
        ((4, 2), ("data", "mdl")),
        EXPERTS_OVER_DATA_RULES + FSDP_AND_TENSOR_PARALLEL_RULES,
    ),
    "expert axis (MaxText)": (
        ((4, 2), ("expert", "data")),
        EXPERT_AXIS_RULES + FSDP_AND_TENSOR_PARALLEL_RULES,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("dispatch", list(Dispatch))
@pytest.mark.parametrize("mesh_name", sorted(_MESHES))
def test_sharded_equals_one_device(mesh_name, dispatch):
    """4 routing groups: each device's tokens are routed the same way on one device."""
    _check_sharded(mesh_name, dispatch)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_name", sorted(_MESHES))
def test_sharded_ragged_dropless_equals_one_device(mesh_name, monkeypatch):
    """The accelerators' path (ragged_dot under shard_map, each device sorting its own
    routes), run on the CPU's devices."""
    monkeypatch.setattr(dispatch_lib, "BLOCKED_PLATFORMS", ())
    _check_sharded(mesh_name, Dispatch.DROPLESS)


def _check_sharded(mesh_name: str, dispatch: Dispatch) -> None:
    (shape, names), rules = _MESHES[mesh_name]
    layer = _layer(dispatch=dispatch, num_groups=4, capacity_factor=1.0)
    x, paddings = _inputs(batch=4, length=8)
    params = _perturbed_params(layer, x)

    def loss(p, x, pad):
        out, mutables = layer.apply({"params": p}, x, paddings=pad, mutable=[AUX_LOSS])
        aux = sum(jnp.sum(a) for a in jax.tree_util.tree_leaves(mutables))
        return jnp.sum(jnp.sin(out)) + aux, out

    want = ref.fast_jit(jax.value_and_grad(loss, has_aux=True))(params, x, paddings)
    mesh = Mesh(np.array(jax.devices()).reshape(shape), names)
    filtered = filter_rules_for_mesh(rules, mesh)
    with nn.logical_axis_rules(filtered):
        abstract = jax.eval_shape(lambda: layer.init(jax.random.key(0), x))["params"]
        shardings = strip_boxes(logical_shardings(abstract, mesh, rules))
    experts = shardings["wi_0"].spec[0]
    assert experts == ("data" if "Pax" in mesh_name else "expert")
    rows = NamedSharding(mesh, PartitionSpec("data"))
    with jax.set_mesh(mesh), nn.logical_axis_rules(filtered):
        got = ref.fast_jit(jax.value_and_grad(loss, has_aux=True))(
            jax.device_put(params, shardings), jax.device_put(x, rows), paddings
        )
    np.testing.assert_allclose(got[0][0], want[0][0], rtol=1e-5)
    np.testing.assert_allclose(got[0][1], want[0][1], atol=1e-5)
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), got[1], want[1]
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(num_experts_per_token=5, dispatch=Dispatch.DROPLESS), "between 1 and num_experts=4"),
        (dict(num_experts_per_token=3), "capacity dispatch is GShard's top-2"),
        (dict(gating_func="expert_choice"), "'expert_choice' (experts choosing tokens) is not"),
        (dict(num_groups=5), "num_groups=5 does not divide the 12 tokens"),
        (dict(num_groups=2, capacity_factor=0.1), "expert capacity rounds to 0"),
    ],
)
def test_bad_settings_are_one_line(fields, message):
    layer = _layer(**fields)
    x, _ = _inputs()
    with pytest.raises(ValueError) as e:
        layer.init(jax.random.key(0), x)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_input_jitter_acts_in_training_only():
    """Mixtral's router jitter: the 'dropout' RNG's noise in training (the same key, the same
    output; another key, another), none in eval."""
    plain = _layer(dispatch=Dispatch.DROPLESS)
    jittered = _layer(dispatch=Dispatch.DROPLESS, input_jitter=0.3)
    x, paddings = _inputs()
    params = _perturbed_params(plain, x)

    def train(layer, seed):
        rngs = {"dropout": jax.random.key(seed)}
        return layer.apply({"params": params}, x, paddings=paddings, train=True, rngs=rngs,
                           mutable=[AUX_LOSS, SUMMARIES])[0]  # fmt: skip

    np.testing.assert_array_equal(_apply(jittered, params, x, paddings)[0],
                                  _apply(plain, params, x, paddings)[0])  # fmt: skip
    np.testing.assert_array_equal(train(plain, 1), _apply(plain, params, x, paddings)[0])
    np.testing.assert_array_equal(train(jittered, 1), train(jittered, 1))
    assert np.abs(train(jittered, 1) - train(plain, 1)).max() > 1e-2
    assert np.abs(train(jittered, 1) - train(jittered, 2)).max() > 1e-2
