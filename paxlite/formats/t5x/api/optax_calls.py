"""``optax`` as T5X's gin files see it under paxlite's T5X commands: each function records its
call, ``{"name": "adamw", "learning_rate": {...}, ...}``, instead of running it.

T5X's adamw and lion examples bind ``optimizers.chain.transformations = [@optax.clip(),
@optax.adamw()]`` and ``optax.adamw.learning_rate = @optax.warmup_cosine_decay_schedule()``.
Recorded, the chain becomes the ``OPTAX_CHAIN`` knob (Python literals), which paxlite's
``praxis_lite.optim.optimizers.OptaxChain`` builds with optax itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import optax

_RECORDERS: dict[str, Callable[..., dict[str, Any]]] = {}


def recorder(name: str) -> Callable[..., dict[str, Any]]:
    """The recording stand-in of ``optax.<name>`` (one object per name, as gin needs)."""
    if name not in _RECORDERS:
        real = getattr(optax, name)

        @functools.wraps(real)
        def record(*args: Any, **kwargs: Any) -> dict[str, Any]:
            try:
                inspect.signature(real).bind(*args, **kwargs)
            except TypeError as e:
                raise ValueError(f"optax.{name}: {e}") from None
            if args:
                raise ValueError(f"optax.{name}: give its arguments by name in gin files.")
            return {"name": name, **kwargs}

        _RECORDERS[name] = record
    return _RECORDERS[name]


def __getattr__(name: str) -> Any:
    real = getattr(optax, name)  # AttributeError: gin names the unknown selector.
    return recorder(name) if callable(real) and not isinstance(real, type) else real
