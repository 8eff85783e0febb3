"""``paxlite.tasks_lib``: the public name of :mod:`paxlite.experiments.tasks_lib` (the task
config: ``SingleTask``, ``Learner``, ``CheckpointLoadingRules``), as ported Pax code writes it
(``from paxlite import tasks_lib``; Pax's is ``from paxml import tasks_lib``).

This name is the same module object, not a copy.
"""

import sys

from paxlite.experiments import tasks_lib

sys.modules[__name__] = tasks_lib
