"""BaseInput: what the trainer needs from an input pipeline (Pax semantics).

An input yields host-local numpy batches (NestedMaps) of ``batch_size``
examples; with several hosts, each reads its own shard (``infeed_host_index``
of ``num_infeed_hosts``) and the trainer assembles the global batch.

Eval semantics, as in Pax:
* ``reset_for_eval=True``: an eval pass runs until the input raises
  ``StopIteration`` (one epoch), then ``reset()`` rewinds it for the next pass.
* otherwise each eval pass takes ``eval_loop_num_batches`` batches.

``get_state()``/``set_state()`` let a resumed run continue from the exact next
batch (stored with the checkpoint).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from praxis_lite.py_utils import NestedMap


@dataclasses.dataclass
class BaseInput:
    """Base of all inputs.

    Attributes:
      batch_size: examples per batch produced on this host.
      name: 'train' for the training input; eval inputs are named (e.g. 'test').
      is_training: whether this input feeds training (e.g. shuffles, repeats).
      num_infeed_hosts: number of hosts reading this input.
      infeed_host_index: which of them this one is.
      reset_for_eval: eval runs to exhaustion, then the input is reset.
      eval_loop_num_batches: batches per eval pass when not ``reset_for_eval``.
      seed: seed of any randomness in the pipeline.
    """

    batch_size: int
    name: str = "train"
    is_training: bool = True
    num_infeed_hosts: int = 1
    infeed_host_index: int = 0
    reset_for_eval: bool = False
    eval_loop_num_batches: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(
                f"{type(self).__name__}.batch_size must be > 0, got {self.batch_size}."
            )
        if not 0 <= self.infeed_host_index < self.num_infeed_hosts:
            raise ValueError(
                f"infeed_host_index={self.infeed_host_index} must be in "
                f"[0, num_infeed_hosts={self.num_infeed_hosts})."
            )

    def get_next(self) -> NestedMap:
        """The next batch (numpy arrays, leading dim ``batch_size``); StopIteration at the end."""
        raise NotImplementedError

    def reset(self) -> None:
        """Rewinds to the first batch."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """A JSON-serializable position in the stream."""
        raise NotImplementedError

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from a position returned by :meth:`get_state`."""
        raise NotImplementedError
