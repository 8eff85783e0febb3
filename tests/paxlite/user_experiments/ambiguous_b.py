"""Defines SameName; so does ambiguous_a, which makes the bare name ambiguous."""

from typing import Any

from paxlite import experiment_registry
from paxlite.experiments.base_experiment import BaseExperiment


@experiment_registry.register
class SameName(BaseExperiment):
    """One of two experiments named SameName."""

    PERCORE_BATCH_SIZE = 1

    def datasets(self) -> list[Any]:
        return []

    def task(self) -> Any:
        return None
