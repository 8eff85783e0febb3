"""``t5x.utils``: dataset, checkpoint and learning-rate configurables (T5X's fields)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """T5X's ``utils.DatasetConfig``: a SeqIO task or mixture read for one purpose.

    ``batch_size`` is the global batch (examples); ``task_feature_lengths`` tokens per
    feature (None: the longest example, for inference).
    """

    mixture_or_task_name: Any
    task_feature_lengths: Mapping[str, int] | None
    split: str
    batch_size: int
    shuffle: bool
    seed: int | None
    use_cached: bool = False
    pack: bool = False
    use_custom_packing_ops: bool = False
    module: str | None = None
    use_memory_cache: bool = True
    trim_output_features: bool = True
    runtime_preprocessors: Sequence[Any] | None = None
    num_prefetch_threads: int | None = None
    num_workers: int | None = 0


@dataclasses.dataclass(frozen=True)
class SaveCheckpointConfig:
    """T5X's ``utils.SaveCheckpointConfig``: when and how checkpoints are written."""

    dtype: str = "float32"
    period: int | None = None
    checkpoint_steps: Sequence[int] | None = None
    keep: int | None = None
    keep_dataset_checkpoints: int | None = None
    save_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Any] = ()
    checkpoint_manager_cls: Any = None


@dataclasses.dataclass(frozen=True)
class RestoreCheckpointConfig:
    """T5X's ``utils.RestoreCheckpointConfig``: the checkpoint a run starts from."""

    path: str | Sequence[str]
    mode: str = "latest"
    assignment_map: Sequence[tuple[str, str | None]] | None = None
    strict: bool = True
    fallback_to_scratch: bool = False
    dtype: str | None = None
    restore_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Any] = ()
    checkpoint_manager_cls: Any = None


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """T5X's ``utils.CheckpointConfig``: saving and restoring."""

    save: SaveCheckpointConfig | None = None
    restore: RestoreCheckpointConfig | None = None


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    """What ``create_learning_rate_scheduler`` was given: T5X's product of factors."""

    factors: str
    base_learning_rate: float
    warmup_steps: int
    decay_factor: float
    steps_per_decay: int
    steps_per_cycle: int
    step_offset: int
    min_learning_rate: float


def create_learning_rate_scheduler(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
    step_offset: int = 0,
    min_learning_rate: float = 1e-8,
) -> LearningRateSchedule:
    """T5X's ``utils.create_learning_rate_scheduler`` (its defaults), recorded."""
    return LearningRateSchedule(
        factors,
        base_learning_rate,
        warmup_steps,
        decay_factor,
        steps_per_decay,
        steps_per_cycle,
        step_offset,
        min_learning_rate,
    )
