"""A user's own experiments, outside tasks/; only the registry tests import this module."""

from __future__ import annotations

from typing import Any

from paxlite import experiment_registry
from paxlite.experiments.base_experiment import BaseExperiment


class TinyLmBase(BaseExperiment):
    """A family base that declares its own knob; not registered."""

    NUM_LAYERS: int = 2
    PERCORE_BATCH_SIZE = 4

    def datasets(self) -> list[Any]:
        return []

    def task(self) -> Any:
        return {"num_layers": self.NUM_LAYERS}


@experiment_registry.register
class MyTinyLm(TinyLmBase):
    """A registered leaf with a unique class name."""

    NUM_LAYERS = 4


class NotRegistered(TinyLmBase):
    """A leaf its author forgot to decorate with @register."""
