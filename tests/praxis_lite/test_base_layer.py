"""BaseLayer: weights with logical axes, dtypes, summaries and aux losses, explicit RNG."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import instantiate
from praxis_lite.base_layer import (
    AUX_LOSS,
    SUMMARIES,
    BaseLayer,
    summaries_and_aux_losses,
    summary_scalars,
)
from praxis_lite.layers.linears import Linear


class _Probe(BaseLayer):
    """A layer that records a summary and an aux loss."""

    dims: int = 3

    @nn.compact
    def __call__(self, x):
        w = self.create_variable(
            "w", (self.dims, self.dims), ("embed", "mlp"), nn.initializers.ones
        )
        y = x @ w
        self.add_summary("mean_activation", jnp.mean(y))
        self.add_aux_loss("l2", 0.5 * jnp.sum(w**2))
        return y


def test_summaries_and_aux_losses_are_collected():
    layer = instantiate(_Probe.HParams.config())
    x = jnp.ones((2, 3))
    variables = layer.init(jax.random.key(0), x)
    params_only = {"params": variables["params"]}
    y, mutables = layer.apply(params_only, x, mutable=[SUMMARIES, AUX_LOSS])
    summaries, aux = summaries_and_aux_losses(mutables)
    np.testing.assert_allclose(summaries["mean_activation"][0], 3.0)
    np.testing.assert_allclose(aux, 4.5)
    assert variables["params"]["w"].names == ("embed", "mlp")


def test_summary_scalars_name_by_layer_path_and_average_stacked_values():
    summaries = {
        "lm": {
            "repeat": {"block": {"mean": (jnp.array([1.0, 2.0, 6.0]),)}},  # scanned: [L]
            "final": {"norm": (jnp.array(2.0), jnp.array(4.0))},  # called twice
        }
    }
    got = summary_scalars(summaries)
    assert set(got) == {"lm/repeat/block/mean", "lm/final/norm"}
    np.testing.assert_allclose(got["lm/repeat/block/mean"], 3.0)
    np.testing.assert_allclose(got["lm/final/norm"], 3.0)
    assert all(v.shape == () and v.dtype == jnp.float32 for v in got.values())
    assert summary_scalars({}) == {}


def test_axes_must_match_shape():
    class Bad(BaseLayer):
        @nn.compact
        def __call__(self, x):
            return self.create_variable("w", (2, 2), ("embed",), nn.initializers.ones)

    with pytest.raises(ValueError, match="needs 2 logical axis names"):
        instantiate(Bad.HParams.config()).init(jax.random.key(0), jnp.ones(2))


@pytest.mark.parametrize("fprop", [jnp.float32, jnp.bfloat16])
def test_fp32_weights_with_chosen_compute_dtype(fprop):
    layer = instantiate(Linear.HParams.config(input_dims=4, output_dims=2, fprop_dtype=fprop))
    x = jnp.ones((3, 4), jnp.float32)
    variables = layer.init(jax.random.key(0), x)
    w = variables["params"]["w"].unbox()
    assert w.dtype == jnp.float32
    y = layer.apply(variables, x)
    assert y.dtype == fprop
    np.testing.assert_allclose(
        np.asarray(y, np.float32),
        np.asarray(x) @ np.asarray(w),
        rtol=2e-2 if fprop == jnp.bfloat16 else 1e-6,
    )


def test_bf16_weights_when_asked():
    layer = instantiate(Linear.HParams.config(input_dims=4, output_dims=2, dtype=jnp.bfloat16))
    variables = layer.init(jax.random.key(0), jnp.ones((1, 4)))
    assert variables["params"]["w"].unbox().dtype == jnp.bfloat16
