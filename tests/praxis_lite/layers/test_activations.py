"""Activation layers against numpy definitions, in fp32 and bf16 compute."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import activations
from tests.praxis_lite.layers import numpy_refs as ref

SHAPES = [(7,), (2, 3, 5)]

# (config factory, numpy reference)
ACTIVATIONS = [
    pytest.param(activations.Identity.HParams.config, lambda x: x, id="identity"),
    pytest.param(activations.ReLU.HParams.config, ref.relu, id="relu"),
    pytest.param(
        functools.partial(activations.GELU.HParams.config, approximate=False),
        ref.gelu,
        id="gelu_exact",
    ),
    pytest.param(activations.GELU.HParams.config, ref.gelu_tanh, id="gelu_tanh_default"),
    pytest.param(activations.SiLU.HParams.config, ref.silu, id="silu"),
    pytest.param(activations.Swish.HParams.config, ref.silu, id="swish"),
    pytest.param(activations.Tanh.HParams.config, np.tanh, id="tanh"),
    pytest.param(activations.Sigmoid.HParams.config, ref.sigmoid, id="sigmoid"),
]


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("make_cfg, reference", ACTIVATIONS)
def test_matches_numpy(make_cfg, reference, shape, dtype):
    layer = ref.build(make_cfg(), dtype)
    # Wide range, so saturation and the negative side are covered; exact zeros too.
    x = ref.normal(shape, seed=len(shape), scale=3.0)
    x.flat[0] = 0.0
    x_in = jnp.asarray(x, dtype)
    y = layer.apply({}, x_in)
    assert y.shape == shape and y.dtype == dtype
    # The reference sees the same (possibly bf16-rounded) input as the layer.
    ref.assert_close(y, reference(np.asarray(x_in, np.float64)), dtype)


def test_gelu_approximate_flag_changes_the_function():
    x = jnp.linspace(-3.0, 3.0, 13)
    exact = ref.build(activations.GELU.HParams.config(approximate=False)).apply({}, x)
    approx = ref.build(activations.GELU.HParams.config()).apply({}, x)
    gap = np.max(np.abs(np.asarray(exact) - np.asarray(approx)))
    assert 1e-5 < gap < 1e-2


def test_swish_is_silu():
    assert activations.Swish is activations.SiLU
