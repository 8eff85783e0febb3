"""LayerNorm and RmsNorm against numpy, in fp32 and bf16 compute (fp32 weights)."""

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import normalizations
from tests.praxis_lite.layers import numpy_refs as ref

SHAPES = [(4, 8), (2, 3, 16)]


@functools.cache
def _variables(layer_cls, **fields):
    """Weights of a float32 layer, shared by the tests of every input shape and dtype."""
    layer = ref.build(layer_cls.HParams.config(**fields))
    return ref.init_variables(layer, np.zeros((1, fields["input_dims"]), np.float32))


def _inputs(shape):
    # An offset and a spread per row, so that centering and scaling both matter.
    return ref.normal(shape, scale=2.0) + ref.normal(shape[:-1] + (1,), seed=1, scale=3.0)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "use_scale, use_bias", [(True, True), (True, False), (False, True), (False, False)]
)
def test_layer_norm(use_scale, use_bias, shape, dtype):
    cfg = normalizations.LayerNorm.HParams.config(
        input_dims=shape[-1], use_scale=use_scale, use_bias=use_bias
    )
    layer = ref.build(cfg, dtype)
    x = _inputs(shape)
    variables = _variables(
        normalizations.LayerNorm, input_dims=shape[-1], use_scale=use_scale, use_bias=use_bias
    )
    p = ref.to_numpy(variables.get("params", {}))
    assert set(p) == {n for n, on in (("scale", use_scale), ("bias", use_bias)) if on}

    y = layer.apply(variables, x)
    assert y.shape == shape and y.dtype == dtype
    ref.assert_close(y, ref.layer_norm(x, p.get("scale"), p.get("bias")), dtype)


def test_layer_norm_fresh_weights_are_identity_affine():
    layer = ref.build(normalizations.LayerNorm.HParams.config(input_dims=8))
    x = _inputs((3, 8))
    variables = ref.init_variables(layer, x, noise=0.0)
    y = np.asarray(layer.apply(variables, x), np.float64)
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1.0, rtol=1e-4)


@pytest.mark.parametrize("epsilon", [1e-6, 0.5])
def test_layer_norm_epsilon(epsilon):
    layer = ref.build(normalizations.LayerNorm.HParams.config(input_dims=8, epsilon=epsilon))
    x = _inputs((3, 8)) * 0.3
    variables = _variables(normalizations.LayerNorm, input_dims=8, use_scale=True, use_bias=True)
    p = ref.to_numpy(variables["params"])
    want = ref.layer_norm(x, p["scale"], p["bias"], epsilon=epsilon)
    ref.assert_close(layer.apply(variables, x), want, jnp.float32)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("epsilon", [1e-6, 0.5])
def test_rms_norm(epsilon, shape, dtype):
    cfg = normalizations.RmsNorm.HParams.config(input_dims=shape[-1], epsilon=epsilon)
    layer = ref.build(cfg, dtype)
    x = _inputs(shape)
    variables = _variables(normalizations.RmsNorm, input_dims=shape[-1])
    p = ref.to_numpy(variables["params"])
    assert set(p) == {"scale"}

    y = layer.apply(variables, x)
    assert y.shape == shape and y.dtype == dtype
    ref.assert_close(y, ref.rms_norm(x, p["scale"], epsilon=epsilon), dtype)


def test_rms_norm_does_not_center():
    """Unlike LayerNorm, a constant row keeps its sign: x / |x| = 1."""
    layer = ref.build(normalizations.RmsNorm.HParams.config(input_dims=4))
    x = np.full((1, 4), 3.0, np.float32)
    variables = ref.init_variables(layer, x, noise=0.0)
    np.testing.assert_allclose(layer.apply(variables, x), np.ones((1, 4)), rtol=1e-5)


def test_rms_norm_scale_plus_one():
    """``direct_scale=False`` (Gemma's): the weight starts at 0 and scales by ``1 + w``."""
    cfg = normalizations.RmsNorm.HParams.config(input_dims=6, direct_scale=False)
    layer = ref.build(cfg)
    x = _inputs((2, 3, 6))
    fresh = ref.init_variables(layer, x, noise=0.0)
    np.testing.assert_array_equal(fresh["params"]["scale"], np.zeros(6))
    variables = ref.init_variables(layer, x)
    w = ref.to_numpy(variables["params"])["scale"]
    ref.assert_close(layer.apply(variables, x), ref.rms_norm(x, 1.0 + w), jnp.float32)
