"""A module whose import fails on a missing dependency; the registry must quote that error."""

import paxlite_missing_dependency  # noqa: F401

from paxlite import experiment_registry
from paxlite.experiments.base_experiment import BaseExperiment


@experiment_registry.register
class Broken(BaseExperiment):
    """Never defined: the import above fails first."""
