"""``paxlite.experiment_registry``: the public name of :mod:`paxlite.experiments.registry`
(``from paxlite import experiment_registry``, as ported Pax files and docs/pax.md write it).

This name is the same module object, not a copy: ``@experiment_registry.register`` adds to
the one registry the trainer reads.
"""

import sys

from paxlite.experiments import registry

sys.modules[__name__] = registry
