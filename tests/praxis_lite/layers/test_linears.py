"""Linear, Bias and FeedForward against numpy, in fp32 and bf16 compute (fp32 weights)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import activations, linears
from tests.praxis_lite.layers import numpy_refs as ref

# (input shape [..., input_dims], output_dims)
SHAPES = [((4, 6), 5), ((2, 3, 8), 16)]


def _assert_fp32_weights(variables):
    assert all(w.dtype == jnp.float32 for w in jax.tree_util.tree_leaves(variables))


@functools.cache
def _variables(layer_cls, **fields):
    """Weights of a float32 layer, shared by the tests of every input shape and dtype."""
    layer = ref.build(layer_cls.HParams.config(**fields))
    in_dims = fields["input_dims"]
    return ref.init_variables(layer, np.zeros((1, in_dims), np.float32))


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("in_shape, out_dims", SHAPES)
def test_linear(in_shape, out_dims, dtype):
    cfg = linears.Linear.HParams.config(input_dims=in_shape[-1], output_dims=out_dims)
    layer = ref.build(cfg, dtype)
    x = ref.normal(in_shape)
    variables = _variables(linears.Linear, input_dims=in_shape[-1], output_dims=out_dims)
    _assert_fp32_weights(variables)
    p = ref.to_numpy(variables["params"])
    assert set(p) == {"w"} and p["w"].shape == (in_shape[-1], out_dims)

    y = layer.apply(variables, x)
    assert y.shape == in_shape[:-1] + (out_dims,) and y.dtype == dtype
    ref.assert_close(y, x @ p["w"], dtype)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("in_shape", [s for s, _ in SHAPES])
def test_bias(in_shape, dtype):
    layer = ref.build(linears.Bias.HParams.config(input_dims=in_shape[-1]), dtype)
    x = ref.normal(in_shape)
    variables = _variables(linears.Bias, input_dims=in_shape[-1])
    _assert_fp32_weights(variables)
    p = ref.to_numpy(variables["params"])
    assert set(p) == {"b"} and p["b"].shape == (in_shape[-1],)

    y = layer.apply(variables, x)
    assert y.shape == in_shape and y.dtype == dtype
    ref.assert_close(y, x + p["b"], dtype)


def test_bias_initializes_to_zero():
    layer = ref.build(linears.Bias.HParams.config(input_dims=3))
    variables = ref.init_variables(layer, np.ones((2, 3), np.float32), noise=0.0)
    np.testing.assert_array_equal(variables["params"]["b"], np.zeros(3))


# (use_bias, activation config factory or None for the default ReLU, numpy activation)
FF_VARIANTS = [
    pytest.param(True, None, ref.relu, id="bias-relu"),
    pytest.param(False, None, ref.relu, id="nobias-relu"),
    pytest.param(
        True,
        functools.partial(activations.GELU.HParams.config, approximate=False),
        ref.gelu,
        id="bias-gelu_exact",
    ),
    pytest.param(False, activations.GELU.HParams.config, ref.gelu_tanh, id="nobias-gelu_tanh"),
    pytest.param(True, activations.Identity.HParams.config, lambda h: h, id="bias-identity"),
]


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("in_shape, out_dims", SHAPES)
@pytest.mark.parametrize("use_bias, activation_cfg, activation", FF_VARIANTS)
def test_feedforward(use_bias, activation_cfg, activation, in_shape, out_dims, dtype):
    cfg = linears.FeedForward.HParams.config(
        input_dims=in_shape[-1], output_dims=out_dims, use_bias=use_bias
    )
    if activation_cfg is not None:
        cfg.activation_tpl = activation_cfg()
    layer = ref.build(cfg, dtype)
    x = ref.normal(in_shape)
    variables = _variables(
        linears.FeedForward, input_dims=in_shape[-1], output_dims=out_dims, use_bias=use_bias
    )
    _assert_fp32_weights(variables)
    p = ref.to_numpy(variables["params"])
    assert set(p) == ({"linear", "bias"} if use_bias else {"linear"})

    y = layer.apply(variables, x)
    assert y.shape == in_shape[:-1] + (out_dims,) and y.dtype == dtype
    pre = x @ p["linear"]["w"] + (p["bias"]["b"] if use_bias else 0.0)
    ref.assert_close(y, activation(pre), dtype)


def test_feedforward_linear_template_fields_reach_the_child():
    """A field set on ``linear_tpl`` (here the initializer) is used by the built child."""
    cfg = linears.FeedForward.HParams.config(input_dims=3, output_dims=2)
    cfg.linear_tpl.weight_init = jax.nn.initializers.constant(0.5)
    layer = ref.build(cfg)
    variables = ref.init_variables(layer, np.ones((1, 3), np.float32), noise=0.0)
    np.testing.assert_array_equal(variables["params"]["linear"]["w"], np.full((3, 2), 0.5))


# (input shape [..., D_in], hidden_dims, D_out, num_layers)
MLP_SHAPES = [((4, 6), 8, 5, 3), ((2, 3, 8), 16, 4, 1)]


@pytest.mark.parametrize("activate_final", [True, False])
@pytest.mark.parametrize("in_shape, hidden_dims, out_dims, num_layers", MLP_SHAPES)
def test_mlp_block(in_shape, hidden_dims, out_dims, num_layers, activate_final):
    """relu(h @ w_i + b_i) per layer, the last one without relu unless activate_final."""
    cfg = linears.MLPBlock.HParams.config(
        num_layers=num_layers, hidden_dims=hidden_dims, activate_final=activate_final
    )
    cfg.ff_tpl.input_dims, cfg.ff_tpl.output_dims = in_shape[-1], out_dims
    layer = ref.build(cfg)
    x = ref.normal(in_shape)
    variables = ref.init_variables(layer, x)
    p = ref.to_numpy(variables["params"])
    assert list(p) == [f"mlp_layers_{i}" for i in range(num_layers)]
    dims = [in_shape[-1]] + [hidden_dims] * (num_layers - 1) + [out_dims]
    assert [p[f"mlp_layers_{i}"]["linear"]["w"].shape for i in range(num_layers)] == list(
        zip(dims[:-1], dims[1:], strict=True)
    )
    assert layer.matmul_params() == sum(a * b for a, b in zip(dims[:-1], dims[1:], strict=True))

    want = x.astype(np.float64)
    for i in range(num_layers):
        ff = p[f"mlp_layers_{i}"]
        want = want @ ff["linear"]["w"] + ff["bias"]["b"]
        if i < num_layers - 1 or activate_final:
            want = ref.relu(want)
    y = layer.apply(variables, x)
    assert y.shape == in_shape[:-1] + (out_dims,)
    ref.assert_close(y, want, jnp.float32)


def test_mlp_block_needs_dims_on_its_template():
    layer = ref.build(linears.MLPBlock.HParams.config(num_layers=2, hidden_dims=4))
    with pytest.raises(TypeError, match="ff_tpl.input_dims"):
        layer.layer_dims()
