"""The training state: step, parameters, optimizer state (a pytree)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    """Everything a checkpoint holds about the model.

    Attributes:
      step: int32 scalar, number of updates applied.
      params: the model's ``params`` collection.
      opt_state: the optax optimizer state.
    """

    step: jax.Array
    params: Any
    opt_state: Any
