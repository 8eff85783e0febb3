"""Routing against praxis 1.4.0 itself (GShard's top-2, fixtures from
tools/pax_fixtures/make_moe.py) and numpy references (dropless top-k and its losses)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.moe import routing
from praxis_lite.moe.routing import SecondExpertPolicy, TopKWeights
from tests import FIXTURES

_GATING = np.load(FIXTURES / "pax" / "moe_gating.npz")
_CASES = sorted({key.rsplit("_", 1)[0] for key in _GATING if key.endswith("_logits")})


def _case(name: str) -> dict[str, np.ndarray]:
    prefix = name + "_"
    return {k[len(prefix) :]: _GATING[k] for k in _GATING if k.startswith(prefix)}


def test_the_fixture_cases_include_overflow_and_padding():
    assert set(_CASES) == {"capped", "overflow", "roomy", "small_factor"}
    overflow = _case("overflow")
    assert overflow["over_capacity"][0] > 0 and overflow["over_capacity"][1] > 0
    assert overflow["paddings"].sum() > 0


@pytest.mark.parametrize("name", _CASES)
def test_top2_gating_is_praxis_exactly(name):
    case = _case(name)
    logits = case["logits"]
    groups, size, experts = logits.shape
    capacity = routing.expert_capacity(size, experts, float(case["capacity_factor"]), 0)
    assert capacity == case["combine"].shape[-1]
    paddings = jnp.asarray(case["paddings"])
    cap = float(case.get("logit_cap", 0.0))
    gate = jax.jit(routing.top2_gating, static_argnums=(2, 3, 5))
    ours = gate(jnp.asarray(logits), paddings, capacity, SecondExpertPolicy.ALL, None, cap)
    np.testing.assert_allclose(ours.combine, case["combine"], atol=1e-6)
    np.testing.assert_array_equal(np.asarray(ours.dispatch), case["dispatch"].astype(bool))
    np.testing.assert_allclose(ours.aux_loss, case["aux_loss"], rtol=1e-6)
    np.testing.assert_allclose(ours.over_capacity, case["over_capacity"], atol=1e-6)
    np.testing.assert_allclose(ours.dispatched, case["dispatched"], atol=1e-6)


@pytest.mark.parametrize("policy", [SecondExpertPolicy.RANDOM, SecondExpertPolicy.SAMPLING])
def test_random_second_experts_route_validly_and_follow_the_key(policy):
    """Each live token: its first choice as 'all' picks it, a second one elsewhere (or none),
    gates renormalised over the two; the same key gives the same routing."""
    case = _case("roomy")
    logits, paddings = jnp.asarray(case["logits"]), jnp.asarray(case["paddings"])
    gate = jax.jit(routing.top2_gating, static_argnums=(2, 3))
    greedy = gate(logits, paddings, 8, SecondExpertPolicy.ALL, None)
    first = np.asarray(greedy.combine).sum(-1).argmax(-1)  # The larger gate is the first.
    runs = [gate(logits, paddings, 8, policy, jax.random.key(seed)) for seed in (0, 0, 1)]
    np.testing.assert_array_equal(runs[0].combine, runs[1].combine)
    per_expert = np.asarray(runs[0].combine).sum(-1)  # [G, S, E]
    assert ((per_expert > 0).sum(-1) <= 2).all()
    np.testing.assert_array_equal(per_expert.argmax(-1), first)
    if policy is SecondExpertPolicy.SAMPLING:  # Gumbel: some second choices differ.
        seconds = [np.argsort(-np.asarray(r.combine).sum(-1), -1)[..., 1] for r in runs]
        greedy_second = np.argsort(-np.asarray(greedy.combine).sum(-1), -1)[..., 1]
        assert any((second != greedy_second).any() for second in seconds)


@pytest.mark.parametrize(
    ("size", "factor", "given", "expected"),
    [
        (32, 2.0, 0, 16),  # int(32 * 2 / 4) = 16, a multiple of 4 already
        (24, 1.0, 0, 8),  # int(6) raised to 8: rounded up only when raised
        (24, 1.0, 5, 8),
        (24, 1.0, 7, 7),
        (24, 1.0, 9, 9),  # the given capacity is more: kept as it is
        (6, 0.5, 0, 0),  # int(0.75) = 0: no slot (the layer refuses it)
    ],
)
def test_capacity_is_praxis_rule(size, factor, given, expected):
    assert routing.expert_capacity(size, 4, factor, given) == expected


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_top_k_weights_match_numpy_for_both_forms():
    logits = np.random.default_rng(1).normal(size=(10, 6)).astype(np.float32)
    k = 3
    experts = np.argsort(-logits, axis=-1)[:, :k]
    probs = _softmax(logits.astype(np.float64))
    softmax_form = np.take_along_axis(probs, experts, -1)  # Qwen, norm_topk_prob=False
    mixtral_form = _softmax(np.take_along_axis(logits.astype(np.float64), experts, -1))
    for weights, expected in (
        (TopKWeights.SOFTMAX, softmax_form),
        (TopKWeights.RENORMALIZED, mixtral_form),
    ):
        ours = routing.top_k_routing(jnp.asarray(logits), k, weights)
        np.testing.assert_array_equal(np.asarray(ours.experts), experts)
        np.testing.assert_allclose(ours.weights, expected, rtol=1e-5)
    assert not np.allclose(softmax_form, mixtral_form)


def test_load_balancing_and_z_losses_match_numpy():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(12, 4)).astype(np.float32) * 2
    live = np.ones(12, np.float32)
    live[-4:] = 0.0
    experts = np.argsort(-logits, axis=-1)[:, :2]
    kept = live > 0
    probs = _softmax(logits.astype(np.float64))[kept]
    routes = np.zeros((kept.sum(), 4))
    for row, chosen in enumerate(experts[kept]):
        routes[row, chosen] += 1
    switch = 4 * np.sum(routes.mean(0) * probs.mean(0))  # Mixtral's load_balancing_loss_func
    ours = routing.load_balancing_loss(jnp.asarray(logits), jnp.asarray(experts), jnp.asarray(live))
    np.testing.assert_allclose(ours, switch, rtol=1e-5)
    z = np.log(np.exp(logits.astype(np.float64)[kept]).sum(-1))
    ours_z = routing.router_z_loss(jnp.asarray(logits), jnp.asarray(live))
    np.testing.assert_allclose(ours_z, np.mean(z**2), rtol=1e-5)
