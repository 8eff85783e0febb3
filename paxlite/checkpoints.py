"""Orbax checkpoints of the train state and the input position."""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from paxlite.train_state import TrainState

STATE = "state"
INPUT = "input"


class Checkpointer:
    """An orbax ``CheckpointManager`` under ``<job_log_dir>/checkpoints``.

    Saves are asynchronous (training continues while arrays are written) and the
    oldest checkpoints beyond ``max_to_keep`` are deleted. A checkpoint holds the
    :class:`TrainState` (sharded arrays) and the training input's position (JSON).
    """

    def __init__(self, job_log_dir: pathlib.Path, *, max_to_keep: int, async_save: bool = True):
        self.directory = pathlib.Path(job_log_dir).absolute() / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: TrainState, input_state: dict[str, Any]) -> None:
        """Starts an asynchronous save of ``state`` at ``step``."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                **{STATE: ocp.args.StandardSave(state), INPUT: ocp.args.JsonSave(input_state)}
            ),
            force=True,
        )

    def restore(self, step: int, abstract_state: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Restores onto the shardings of ``abstract_state`` (ShapeDtypeStructs)."""
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{STATE: ocp.args.StandardRestore(abstract_state), INPUT: ocp.args.JsonRestore()}
            ),
        )
        return restored[STATE], restored[INPUT]

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def abstract_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of ``tree`` (arrays or ShapeDtypeStructs) with ``shardings``."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )
