"""Normalization layers: ``[..., input_dims] -> [..., input_dims]``.

Statistics are computed in float32 whatever the compute dtype, then the result
is cast back to ``fprop_dtype`` (the usual bf16-training practice).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer
from praxis_lite.sharding import EMBED


class LayerNorm(BaseLayer):
    """``(x - mean) / sqrt(var + epsilon) * scale + bias`` over the last axis.

    Attributes:
      input_dims: size of the normalized (last) dimension.
      epsilon: added to the variance.
      use_scale: learn a per-channel scale (initialized to 1).
      use_bias: learn a per-channel bias (initialized to 0).
    """

    input_dims: int
    epsilon: float = 1e-6
    use_scale: bool = True
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = ((x32 - mean) * jax.lax.rsqrt(var + self.epsilon)).astype(self.fprop_dtype)
        if self.use_scale:
            y = y * self.create_variable(
                "scale", (self.input_dims,), (EMBED,), nn.initializers.ones
            )
        if self.use_bias:
            y = y + self.create_variable(
                "bias", (self.input_dims,), (EMBED,), nn.initializers.zeros
            )
        return y


class RmsNorm(BaseLayer):
    """``x / sqrt(mean(x^2) + epsilon) * scale`` over the last axis (no centering).

    Attributes:
      input_dims: size of the normalized (last) dimension.
      epsilon: added to the mean square.
      direct_scale: the weight is the scale (initialised to 1; the product is taken in the
        compute dtype, as Llama's); False: the scale is ``1 + weight`` (initialised to 0;
        the product taken in float32 before the cast, as Gemma's).
    """

    input_dims: int
    epsilon: float = 1e-6
    direct_scale: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        ms = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
        normalized = x32 * jax.lax.rsqrt(ms + self.epsilon)
        init = nn.initializers.ones if self.direct_scale else nn.initializers.zeros
        scale = self.create_variable("scale", (self.input_dims,), (EMBED,), init)
        if not self.direct_scale:
            return (normalized * (1.0 + scale.astype(jnp.float32))).astype(self.fprop_dtype)
        return normalized.astype(self.fprop_dtype) * scale
