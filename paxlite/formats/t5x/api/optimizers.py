"""``t5x.optimizers``: T5X's optax wrappers: ``optimizers.chain`` of optax transformations
and each optax optimizer by its name (``optimizers.adamw``), recorded (``optax_calls``)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

from paxlite.formats.t5x.api import optax_calls


@dataclasses.dataclass(frozen=True)
class OptaxChain:
    """What ``optimizers.chain`` was given: optax transformations, in order."""

    transformations: Sequence[Any]


def chain(transformations: Sequence[Any]) -> OptaxChain:
    """T5X's ``optimizers.chain``: the optax transformations applied in order."""
    return OptaxChain(tuple(transformations))


_ONE: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``optimizers.adamw`` and the like: one optax optimizer, as a chain of one."""
    if name.startswith("_"):
        raise AttributeError(name)
    if name not in _ONE:
        record = optax_calls.recorder(name)

        def chain_of_one(**kwargs: Any) -> OptaxChain:
            return OptaxChain((record(**kwargs),))

        chain_of_one.__name__ = chain_of_one.__qualname__ = name
        chain_of_one.__signature__ = inspect.signature(record)
        _ONE[name] = chain_of_one
    return _ONE[name]
