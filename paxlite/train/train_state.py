"""The training state: step, parameters, optimizer state (a pytree)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
    """Everything a checkpoint holds about the model.

    Attributes:
      step: int32 scalar, number of train steps taken (skipped updates included).
      params: the model's ``params`` collection.
      opt_state: the optax optimizer state.
      nonfinite_steps: int32 scalar, steps whose loss or gradient was not finite
        (their update was not applied).
      first_nonfinite_step: int32 scalar, the first such step, -1 if none.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    nonfinite_steps: jax.Array
    first_nonfinite_step: jax.Array
