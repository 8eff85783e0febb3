"""``t5x.optimizers``: T5X's optax wrappers (``optimizers.chain`` of optax transformations)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class OptaxChain:
    """What ``optimizers.chain`` was given: optax transformations, in order."""

    transformations: Sequence[Any]


def chain(transformations: Sequence[Any]) -> OptaxChain:
    """T5X's ``optimizers.chain``: the optax transformations applied in order."""
    return OptaxChain(tuple(transformations))
