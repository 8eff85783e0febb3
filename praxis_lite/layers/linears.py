"""Linear projections, biases and feed-forward layers."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer, Initializer
from praxis_lite.config import template_field
from praxis_lite.layers.activations import ReLU
from praxis_lite.sharding import EMBED, MLP, LogicalAxes


class Linear(BaseLayer):
    """``y = x @ w`` with no bias: ``[..., input_dims] -> [..., output_dims]``.

    Attributes:
      input_dims: size of the last input dimension.
      output_dims: size of the last output dimension.
      weight_axes: logical names of ``w``'s two axes ``[input_dims, output_dims]``.
      weight_init: initializer of ``w``.
    """

    input_dims: int
    output_dims: int
    weight_axes: LogicalAxes = (EMBED, MLP)
    weight_init: Initializer = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.create_variable(
            "w", (self.input_dims, self.output_dims), self.weight_axes, self.weight_init
        )
        return jnp.einsum("...i,io->...o", self.to_fprop(x), w)


class Bias(BaseLayer):
    """``y = x + b``: ``[..., dims] -> [..., dims]``.

    Attributes:
      dims: size of the last dimension.
      bias_axes: logical name of ``b``'s axis.
      bias_init: initializer of ``b``.
    """

    dims: int
    bias_axes: LogicalAxes = (MLP,)
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b = self.create_variable("b", (self.dims,), self.bias_axes, self.bias_init)
        return self.to_fprop(x) + b


class FeedForward(BaseLayer):
    """``activation(x @ w + b)``: ``[..., input_dims] -> [..., output_dims]``.

    Attributes:
      input_dims: size of the last input dimension.
      output_dims: size of the last output dimension.
      has_bias: add a bias after the projection.
      linear_tpl: template of the projection (any layer taking input/output_dims).
      bias_tpl: template of the bias (given ``dims``).
      activation_tpl: template of the activation (any ``BaseActivation``).
    """

    input_dims: int
    output_dims: int
    has_bias: bool = True
    linear_tpl: object = template_field(Linear)
    bias_tpl: object = template_field(Bias)
    activation_tpl: object = template_field(ReLU)

    def setup(self) -> None:
        self.linear = self.create_child(
            self.linear_tpl, input_dims=self.input_dims, output_dims=self.output_dims
        )
        self.bias = (
            self.create_child(self.bias_tpl, dims=self.output_dims) if self.has_bias else None
        )
        self.activation = self.create_child(self.activation_tpl)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.linear(x)
        if self.bias is not None:
            y = self.bias(y)
        return self.activation(y)
