"""``t5x.trainer``: the trainer class and what it is constructed with."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Trainer:
    """T5X's ``trainer.Trainer``: gin binds ``learning_rate_fn`` and ``num_microbatches``
    (None or 1: none; N: each step's batch runs as N microbatches); the train script
    constructs it with the rest."""

    model: Any = None
    train_state: Any = None
    partitioner: Any = None
    eval_names: Any = None
    summary_dir: str | None = None
    train_state_axes: Any = None
    rng: Any = None
    learning_rate_fn: Any = None
    num_microbatches: int | None = None
    weight_metrics_computer: Any = None


@dataclasses.dataclass(frozen=True)
class TerminateOnNanAction:
    """T5X's action that stops training on a non-finite ``metric`` of ``task``'s train_eval;
    paxlite's loop always stops on a non-finite loss (exit code 3, last good checkpoint kept)."""

    task: str
    metric: str = "loss"
