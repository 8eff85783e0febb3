"""T5X's train script (``import __main__ as train_script`` in its gin files): ``train``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from paxlite.formats.t5x.api import utils


@dataclasses.dataclass(frozen=True)
class TrainCall:
    """The arguments gin called T5X's ``train`` with (its names and defaults)."""

    model: Any
    train_dataset_cfg: utils.DatasetConfig
    train_eval_dataset_cfg: utils.DatasetConfig | None
    infer_eval_dataset_cfg: utils.DatasetConfig | None
    checkpoint_cfg: utils.CheckpointConfig
    partitioner: Any
    trainer_cls: Any
    model_dir: str
    total_steps: int
    eval_steps: int
    eval_period: int
    relative_steps: int | None = None
    stats_period: int | None = None
    random_seed: int | None = None
    use_hardware_rng: bool = False
    summarize_config_fn: Any = None
    inference_evaluator_cls: Any = None
    get_dataset_fn: Any = None
    concurrent_metrics: bool = True
    actions: Mapping[str, Sequence[Any]] | None = None
    train_eval_get_dataset_fn: Any = None
    run_eval_before_training: bool = False
    train_state_initializer_cls: Any = None
    use_orbax: bool = True
    verify_matching_vocabs_fn: Any = None
    gc_period: int = 0


def train(
    *,
    model: Any,
    train_dataset_cfg: utils.DatasetConfig,
    train_eval_dataset_cfg: utils.DatasetConfig | None,
    infer_eval_dataset_cfg: utils.DatasetConfig | None,
    checkpoint_cfg: utils.CheckpointConfig,
    partitioner: Any,
    trainer_cls: Any,
    model_dir: str,
    total_steps: int,
    eval_steps: int,
    eval_period: int,
    relative_steps: int | None = None,
    stats_period: int | None = None,
    random_seed: int | None,
    use_hardware_rng: bool = False,
    summarize_config_fn: Any = None,
    inference_evaluator_cls: Any = None,
    get_dataset_fn: Any = None,
    concurrent_metrics: bool = True,
    actions: Mapping[str, Sequence[Any]] | None = None,
    train_eval_get_dataset_fn: Any = None,
    run_eval_before_training: bool = False,
    train_state_initializer_cls: Any = None,
    use_orbax: bool = True,
    verify_matching_vocabs_fn: Any = None,
    gc_period: int = 0,
) -> TrainCall:
    """T5X's ``train`` signature; returns the call for paxlite to run (``translation``)."""
    return TrainCall(**{k: v for k, v in locals().items()})
