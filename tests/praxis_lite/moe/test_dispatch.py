"""The dropless grouped feed-forward: blocked (CPU) and ragged_dot (accelerators) against a
numpy loop over the routes, values and gradients, with two groups routed on their own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.moe import dispatch
from tests.praxis_lite.layers import numpy_refs as ref

N, K, E, D, F = 40, 3, 5, 6, 7  # N tokens: 2 groups of 20


def _inputs():
    rng = np.random.default_rng(0)
    experts = np.stack([rng.choice(E, K, replace=False) for _ in range(N)]).astype(np.int32)
    experts[:12] = [0, 1, 2]  # A crowded expert: its run spans several blocks.
    tokens = ref.normal((N, D), seed=1)
    weights = (
        ref.normal((E, D, F), seed=2),
        ref.normal((E, D, F), seed=3),
        ref.normal((E, F, D), seed=4),
    )
    return tokens, experts, weights


def _activate(h, gate):
    return jax.nn.gelu(h) * gate


def _numpy(tokens, experts, weights):
    wi, wg, wo = (np.asarray(w, np.float64) for w in weights)
    out = np.zeros((N * K, D))
    for n, j in np.ndindex(N, K):
        e, x = experts[n, j], np.asarray(tokens[n], np.float64)
        h = np.asarray(jax.nn.gelu(jnp.asarray(x @ wi[e], jnp.float32)), np.float64)
        out[n * K + j] = (h * (x @ wg[e])) @ wo[e]
    return out


def test_blocks_hold_one_expert_and_every_route_once():
    _, experts, _ = _inputs()
    blocks = dispatch.plan_blocks(jnp.asarray(experts), E, block_rows=4)
    position = np.asarray(blocks.position)
    assert len(set(position.tolist())) == N * K  # each route its own row
    block_of = position // 4
    np.testing.assert_array_equal(np.asarray(blocks.expert)[block_of], experts.reshape(-1))


def _grouped_ffn(tokens, experts, weights):
    """Every route's expert output, ``[N k, D]``, through the dispatch module in 2 groups."""
    wi, wg, wo = weights
    groups = 2
    routed = dispatch.route(experts.reshape(groups, -1, K), E)
    rows = dispatch.gather_rows(tokens.reshape(groups, -1, D), routed)
    hidden = _activate(dispatch.project(rows, wi, routed), dispatch.project(rows, wg, routed))
    out = dispatch.route_outputs(dispatch.project(hidden, wo, routed), routed, groups)
    return out.reshape(N * K, D)


@pytest.mark.parametrize("kind", ["blocked", "ragged"])
def test_grouped_ffn_matches_numpy_values_and_gradients(kind, monkeypatch):
    if kind == "ragged":
        monkeypatch.setattr(dispatch, "BLOCKED_PLATFORMS", ())
    monkeypatch.setattr(dispatch, "BLOCK_ROWS", 4)
    assert dispatch.grouped_matmul_kind() == kind
    tokens, experts, weights = _inputs()

    def run(tokens, weights):
        return _grouped_ffn(tokens, jnp.asarray(experts), weights)

    got = ref.fast_jit(run)(tokens, weights)
    np.testing.assert_allclose(got, _numpy(tokens, experts, weights), rtol=1e-4, atol=1e-4)
    grads = ref.fast_jit(jax.grad(lambda t, w: jnp.sum(jnp.sin(run(t, w))), argnums=(0, 1)))(
        tokens, weights
    )
    if kind == "ragged":  # Both kinds' gradients agree (the other is computed just below).
        return
    monkeypatch.setattr(dispatch, "BLOCKED_PLATFORMS", ())
    ragged = ref.fast_jit(jax.grad(lambda t, w: jnp.sum(jnp.sin(run(t, w))), argnums=(0, 1)))(
        tokens, weights
    )
    jax.tree_util.tree_map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), grads, ragged
    )
