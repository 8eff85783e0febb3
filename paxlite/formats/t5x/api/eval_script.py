"""T5X's eval script (``import __main__ as eval_script`` in eval.gin): ``evaluate``."""

from __future__ import annotations

import dataclasses
from typing import Any

from paxlite.formats.t5x.api import utils


@dataclasses.dataclass(frozen=True)
class EvalCall:
    """The arguments gin called T5X's ``evaluate`` with (its names and defaults)."""

    model: Any
    dataset_cfg: utils.DatasetConfig
    restore_checkpoint_cfg: utils.RestoreCheckpointConfig
    partitioner: Any
    output_dir: str
    inference_evaluator_cls: Any = None
    training_evaluator_cls: Any = None
    summarize_config_fn: Any = None
    train_state_initializer_cls: Any = None
    train_eval_get_dataset_fn: Any = None
    fallback_init_rng: int | None = None
    use_orbax: bool = True


def evaluate(
    *,
    model: Any,
    dataset_cfg: utils.DatasetConfig,
    restore_checkpoint_cfg: utils.RestoreCheckpointConfig,
    partitioner: Any,
    output_dir: str,
    inference_evaluator_cls: Any = None,
    training_evaluator_cls: Any = None,
    summarize_config_fn: Any = None,
    train_state_initializer_cls: Any = None,
    train_eval_get_dataset_fn: Any = None,
    fallback_init_rng: int | None = None,
    use_orbax: bool = True,
) -> EvalCall:
    """T5X's ``evaluate`` signature; returns the call for paxlite to run."""
    return EvalCall(**{k: v for k, v in locals().items()})
