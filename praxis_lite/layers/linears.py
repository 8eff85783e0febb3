"""Linear projections, biases and feed-forward layers."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer, Initializer
from praxis_lite.config import LayerTpl, template_field
from praxis_lite.layers import lora as lora_lib
from praxis_lite.layers.activations import Identity, ReLU
from praxis_lite.layers.lora import LoraSettings
from praxis_lite.sharding import EMBED, MLP, LogicalAxes


class Linear(BaseLayer):
    """``y = x @ w`` with no bias: ``[..., input_dims] -> [..., output_dims]``.

    With ``lora``, ``y = x @ w + scale * (dropout(x) @ w_lora_a) @ w_lora_b`` with
    ``w_lora_a [input_dims, r]`` and ``w_lora_b [r, output_dims]`` (see ``layers.lora``).

    Attributes:
      input_dims: size of the last input dimension.
      output_dims: size of the last output dimension.
      weight_axes: logical names of ``w``'s two axes ``[input_dims, output_dims]``.
      weight_init: initializer of ``w``.
      lora: a LoRA adapter on ``w`` when set (its ``targets`` are not read here).
    """

    input_dims: int
    output_dims: int
    weight_axes: LogicalAxes = (EMBED, MLP)
    weight_init: Initializer = nn.initializers.lecun_normal()
    lora: LoraSettings | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        """``[..., input_dims] -> [..., output_dims]``; ``train`` enables LoRA dropout."""
        w = self.create_variable(
            "w", (self.input_dims, self.output_dims), self.weight_axes, self.weight_init
        )
        x = self.to_fprop(x)
        y = jnp.einsum("...i,io->...o", x, w)
        if self.lora is None:
            return y
        in_axes, out_axes = self.weight_axes[:1], self.weight_axes[1:]
        a = lora_lib.create_lora_a(self, "w", self.lora, (self.input_dims,), in_axes)
        b = lora_lib.create_lora_b(self, "w", self.lora, (self.output_dims,), out_axes)
        dropout = nn.Dropout(self.lora.dropout_prob, name="lora_dropout")
        x_in = lora_lib.adapter_input(x, self.lora, dropout, train)
        return y + lora_lib.lora_delta(x_in, a, b, self.lora.scale, y.dtype)


class Bias(BaseLayer):
    """``y = x + b``: ``[..., input_dims] -> [..., input_dims]``.

    Attributes:
      input_dims: size of the last dimension.
      bias_axes: logical name of ``b``'s axis.
      bias_init: initializer of ``b``.
    """

    input_dims: int
    bias_axes: LogicalAxes = (MLP,)
    bias_init: Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b = self.create_variable("b", (self.input_dims,), self.bias_axes, self.bias_init)
        return self.to_fprop(x) + b


class FeedForward(BaseLayer):
    """``activation(x @ w + b)``: ``[..., input_dims] -> [..., output_dims]``.

    Attributes:
      input_dims: size of the last input dimension.
      output_dims: size of the last output dimension.
      use_bias: add a bias after the projection.
      linear_tpl: template of the projection (any layer taking input/output_dims).
      bias_tpl: template of the bias (given ``input_dims``).
      activation_tpl: template of the activation (any ``BaseActivation``).
    """

    input_dims: int
    output_dims: int
    use_bias: bool = True
    linear_tpl: LayerTpl = template_field(Linear)
    bias_tpl: LayerTpl = template_field(Bias)
    activation_tpl: LayerTpl = template_field(ReLU)

    def setup(self) -> None:
        self.linear = self.create_child(
            self.linear_tpl, input_dims=self.input_dims, output_dims=self.output_dims
        )
        self.bias = (
            self.create_child(self.bias_tpl, input_dims=self.output_dims) if self.use_bias else None
        )
        self.activation = self.create_child(self.activation_tpl)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.linear(x)
        if self.bias is not None:
            y = self.bias(y)
        return self.activation(y)


class MLPBlock(BaseLayer):
    """``num_layers`` FeedForward layers in a row: ``[..., D_in] -> [..., D_out]``.

    As Pax's ``MLPBlock``: the block's dims are ``ff_tpl``'s ``input_dims`` (``D_in``)
    and ``output_dims`` (``D_out``). The first layer maps ``D_in -> hidden_dims``,
    the middle ones ``hidden_dims -> hidden_dims``, the last ``hidden_dims -> D_out``
    (one layer: ``D_in -> D_out``). Every layer is a copy of ``ff_tpl`` (same weight
    axes, bias and activation); the weights of layer ``i`` live under ``mlp_layers_{i}``
    (Pax's names).

    Attributes:
      num_layers: number of FeedForward layers (at least 1).
      hidden_dims: output dims of every layer but the last.
      activate_final: apply the last layer's activation; if False, the last layer
        ends with its bias (an identity activation).
      ff_tpl: the template of every layer; its ``input_dims``/``output_dims`` are the
        block's ``D_in``/``D_out``.
    """

    num_layers: int
    hidden_dims: int
    activate_final: bool = True
    ff_tpl: LayerTpl = template_field(FeedForward)

    def setup(self) -> None:
        dims = self.layer_dims()
        layers = []
        for i in range(self.num_layers):
            overrides = dict(input_dims=dims[i], output_dims=dims[i + 1])
            if i == self.num_layers - 1 and not self.activate_final:
                overrides["activation_tpl"] = Identity.HParams.config()
            layers.append(self.stamp_child(self.ff_tpl, **overrides))
        self.mlp_layers = layers

    def layer_dims(self) -> list[int]:
        """``[D_in, hidden_dims, ..., hidden_dims, D_out]``: the dims between the layers."""
        if self.num_layers < 1:
            raise ValueError(f"MLPBlock: num_layers must be >= 1, got {self.num_layers}.")
        ff = self.ff_tpl.value
        try:
            d_in, d_out = ff.input_dims, ff.output_dims
        except AttributeError:
            raise TypeError(
                "MLPBlock: its dims come from ff_tpl; set cfg.ff_tpl.input_dims "
                "and cfg.ff_tpl.output_dims."
            ) from None
        return [d_in] + [self.hidden_dims] * (self.num_layers - 1) + [d_out]

    def matmul_params(self) -> int:
        """Weights of the layers' projections (biases left out): ``sum_i d_i * d_{i+1}``."""
        dims = self.layer_dims()
        return sum(a * b for a, b in zip(dims[:-1], dims[1:], strict=True))

    def __call__(self, x: jax.Array) -> jax.Array:
        """``[..., D_in] -> [..., D_out]``."""
        for layer in self.mlp_layers:
            x = layer(x)
        return x
