"""The errors that end a run with one ``paxlite: error:`` line and exit code 2 (bad input).

``paxlite.main`` catches them: :data:`SETUP_ERRORS` before anything runs, and
:data:`AT_START` with the checkpoints' own (a mismatched or damaged checkpoint) once the
run has started (its job dir is then put back as it was: ``job_config.undo_refused_start``).
"""

from __future__ import annotations

from paxlite.cli.flags import UsageError
from paxlite.experiments.base_experiment import KnobError
from paxlite.experiments.registry import ExperimentRegistryError
from paxlite.runtime.distributed import DistributedSetupError
from paxlite.runtime.mesh import MeshShapeError
from paxlite.train.trainable import FreezeError
from praxis_lite.inputs.base_input import InputConfigError, InputDataError
from praxis_lite.layers.attentions import AttentionImplError

#: The command line or the experiment, found before anything runs.
SETUP_ERRORS = (
    UsageError,
    KnobError,
    ExperimentRegistryError,
    MeshShapeError,
    DistributedSetupError,
    AttributeError,
    TypeError,
    ValueError,
)

#: Found once the run starts: at restore, while reading the data, or (attention) when the
#: step is traced.
AT_START = (
    FreezeError,
    FileNotFoundError,
    InputDataError,
    InputConfigError,
    AttentionImplError,
)
