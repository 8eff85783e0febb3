"""T5X's infer script (``import __main__ as infer_script`` in infer.gin): ``infer``."""

from __future__ import annotations

import dataclasses
from typing import Any

from paxlite.formats.t5x.api import utils

#: T5X's ``infer`` modes (``infer.mode``), all of which paxlite runs.
MODES = ("predict", "score", "predict_with_aux")


@dataclasses.dataclass(frozen=True)
class InferCall:
    """The arguments gin called T5X's ``infer`` with (its names and defaults).

    ``checkpoint_period``: T5X's batches per written chunk; ``shard_id`` of
    ``num_shards``: the part of the dataset this run infers (T5X's ``--shard_id`` wins).
    """

    mode: str
    model: Any
    dataset_cfg: utils.DatasetConfig
    restore_checkpoint_cfg: utils.RestoreCheckpointConfig
    partitioner: Any
    output_dir: str
    checkpoint_period: int
    shard_id: int = 0
    num_shards: int = 1
    merge_chunked_results: bool = True
    write_fn: Any = None
    checkpoint_ds_iter: bool = True
    train_state_initializer_cls: Any = None
    fallback_init_rng: int | None = None
    merge_fn: Any = None
    summarize_config_fn: Any = None
    verify_matching_vocabs_fn: Any = None
    output_vocab_feature_name: str = "targets"
    file_extension: str = "jsonl"
    keep_aux_as_numpy: bool = False
    use_orbax: bool = True


def infer(
    *,
    mode: str,
    model: Any,
    dataset_cfg: utils.DatasetConfig,
    restore_checkpoint_cfg: utils.RestoreCheckpointConfig,
    partitioner: Any,
    output_dir: str,
    checkpoint_period: int,
    shard_id: int = 0,
    num_shards: int = 1,
    merge_chunked_results: bool = True,
    write_fn: Any = None,
    checkpoint_ds_iter: bool = True,
    train_state_initializer_cls: Any = None,
    fallback_init_rng: int | None = None,
    merge_fn: Any = None,
    summarize_config_fn: Any = None,
    verify_matching_vocabs_fn: Any = None,
    output_vocab_feature_name: str = "targets",
    file_extension: str = "jsonl",
    keep_aux_as_numpy: bool = False,
    use_orbax: bool = True,
) -> InferCall:
    """T5X's ``infer`` signature; returns the call for paxlite to run."""
    return InferCall(**{k: v for k, v in locals().items()})
