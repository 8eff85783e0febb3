"""An optimizer's optax transformation applied step by step, each step jitted, as the trainer
applies it (``paxlite.train.pure_steps``): the one update loop of the optimizer tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
import optax

Params = dict[str, Any]


def apply_steps(
    tx: optax.GradientTransformation,
    params: Params,
    state: optax.OptState,
    steps: Iterable[Any],
    gradient: Callable[[Params, Any], Params],
) -> tuple[dict[str, np.ndarray], optax.OptState]:
    """One jitted update of ``params`` by ``tx`` per item of ``steps``, the gradient of each
    ``gradient(params, item)`` (computed inside the jitted step): the final params as numpy
    arrays, and the final state."""

    @jax.jit
    def step(params: Params, state: optax.OptState, item: Any):
        updates, state = tx.update(gradient(params, item), state, params)
        return optax.apply_updates(params, updates), state

    for item in steps:
        params, state = step(params, state, item)
    return jax.tree.map(np.asarray, params), state
