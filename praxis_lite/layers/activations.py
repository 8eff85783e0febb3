"""Elementwise activation layers: ``[...] -> [...]`` with the same shape and dtype.

Activations are layers (not free strings) so that a template such as
``FeedForward.activation_tpl`` can be swapped for another class in a config.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from praxis_lite.base_layer import BaseLayer


class BaseActivation(BaseLayer):
    """An elementwise function of its input."""

    def __call__(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError


class Identity(BaseActivation):
    """``f(x) = x``."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return x


class ReLU(BaseActivation):
    """``f(x) = max(x, 0)``."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x)


class GELU(BaseActivation):
    """Gaussian error linear unit.

    Attributes:
      approximate: use the tanh approximation instead of the exact erf form (praxis's
        default, so Pax's ``layers.GELU`` computes the same function here).
    """

    approximate: bool = True

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.gelu(x, approximate=self.approximate)


class SiLU(BaseActivation):
    """``f(x) = x * sigmoid(x)`` (Swish with beta = 1)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.silu(x)


Swish = SiLU


class Tanh(BaseActivation):
    """``f(x) = tanh(x)``."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.tanh(x)


class Sigmoid(BaseActivation):
    """``f(x) = 1 / (1 + exp(-x))``."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return jax.nn.sigmoid(x)
