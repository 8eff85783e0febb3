"""BaseInput: what the trainer needs from an input pipeline (Pax semantics).

An input yields host-local numpy batches (NestedMaps) with the batch as the
leading dimension. Multi-host by design: each process builds its own input with
``infeed_host_index`` / ``num_infeed_hosts`` (the trainer fills them from the
JAX process index/count), produces ``batch_size`` examples per batch, and the
global batch is ``batch_size * num_infeed_hosts``. Training inputs on different
hosts read disjoint shards, so they never emit the same batch.

Eval semantics (Pax's table):

=============== ======== ======================== =====================================
reset_for_eval  repeat   eval_loop_num_batches    behaviour of one eval pass
=============== ======== ======================== =====================================
True            False    ignored                  one epoch, then ``reset()``; every host
                                                  stops after the same number of batches
                                                  (padded examples have weight 0)
False           True     N                        N rolling batches (no reset)
True            True     N                        the first N batches, then ``reset()``:
                                                  the same N every pass (T5X's training eval)
False           False    --                       error: would run dry after a few passes
=============== ======== ======================== =====================================

``get_state()`` / ``set_state()`` let a resumed run continue from the exact next
batch (the trainer stores the state with each checkpoint). Where ``set_state`` has to
re-read the stream to get there (a file reader), ``save_position()`` /
``restore_position()`` also save the reader's own state (each host its own, beside the
checkpoint), so a resume costs the same at any step.

Decoder inputs (an experiment's ``decoder_datasets()``) yield prompt/target
batches instead of LM batches, read like one-epoch eval inputs::

    prefix_ids      [B, P] int32, prompts, right-padded with 0
    prefix_lengths  [B]    int32, real prompt tokens (0 for a padding example)
    target_ids      [B, T] int32, the reference continuations, right-padded
    target_lengths  [B]    int32

and score predictions with ``predict_metric_fns`` (SeqIO's
``fn(targets, predictions) -> {name: value}`` on detokenized strings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from praxis_lite.py_utils import NestedMap


class InputConfigError(ValueError):
    """An input's settings contradict each other."""


class InputDataError(ValueError):
    """An input's data or vocabulary is missing, empty, truncated or malformed.

    The message is one line: what is wrong, naming the file (and the line or
    record), then ``;`` and the fix (the knob or flag that names the data).
    Raised when an input is built or, for damage found while reading, by ``get_next``.
    """


@dataclasses.dataclass
class BaseInput:
    """Base of all inputs.

    Attributes:
      batch_size: examples per batch produced on this host.
      name: 'train' for the training input; eval inputs are named (e.g. 'test').
      is_training: whether this input feeds training.
      num_infeed_hosts: number of hosts reading this input (set by the trainer).
      infeed_host_index: which of them this one is (set by the trainer).
      reset_for_eval: an eval pass is one epoch (with ``repeat``: its first
        ``eval_loop_num_batches`` batches), then the input is reset.
      eval_loop_num_batches: batches per eval pass, unless ``reset_for_eval`` without
        ``repeat``.
      repeat: whether the data repeats forever; ``None`` = Pax's default
        (repeat unless this is a one-epoch eval input).
      seed: seed of any randomness in the pipeline.
    """

    batch_size: int
    name: str = "train"
    is_training: bool = True
    num_infeed_hosts: int = 1
    infeed_host_index: int = 0
    reset_for_eval: bool = False
    eval_loop_num_batches: int = 1
    repeat: bool | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        kind = type(self).__name__
        if self.batch_size <= 0:
            raise InputConfigError(f"{kind}.batch_size must be > 0, got {self.batch_size}.")
        if not 0 <= self.infeed_host_index < self.num_infeed_hosts:
            raise InputConfigError(
                f"{kind}: infeed_host_index={self.infeed_host_index} must be in "
                f"[0, num_infeed_hosts={self.num_infeed_hosts})."
            )
        if self.is_training and self.reset_for_eval:
            raise InputConfigError(
                f"{kind} '{self.name}': reset_for_eval=True is for eval inputs; "
                "set is_training=False or reset_for_eval=False."
            )
        if not self.is_training and not self.reset_for_eval and self.repeat is False:
            raise InputConfigError(
                f"{kind} '{self.name}': reset_for_eval=False takes eval_loop_num_batches "
                "rolling batches per pass and needs a repeating input; set repeat=True "
                "(or None), or reset_for_eval=True for one-epoch eval."
            )
        if (not self.reset_for_eval or self.repeats) and self.eval_loop_num_batches <= 0:
            raise InputConfigError(f"{kind}.eval_loop_num_batches must be > 0.")

    @property
    def repeats(self) -> bool:
        """Whether the data repeats (``repeat``, or Pax's default when None)."""
        return self.repeat if self.repeat is not None else not self.reset_for_eval

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

    def save_position(self, directory: str) -> bool:
        """Writes the reader's exact position into the local ``directory`` (which exists).

        Returns False, writing nothing, where ``get_state()`` alone resumes in constant
        time (the default: a counter or an index).
        """
        del directory
        return False

    def restore_position(self, directory: str, state: dict[str, Any]) -> None:
        """Continues from what :meth:`save_position` wrote; ``state`` is the
        :meth:`get_state` saved with it."""
        del directory
        self.set_state(state)

    def close(self) -> None:
        """Releases what reads the data (pipeline threads); reading again needs ``reset``.

        Call it before the process ends: a reader whose threads run Python code
        (TensorFlow's ``numpy_function``) cannot be torn down once the interpreter
        has begun to shut down.
        """

    @property
    def score_metric_fns(self) -> Sequence[Callable[[list[str], list[float]], dict[str, Any]]]:
        """SeqIO-style ``fn(targets, scores) -> {name: value}`` metrics for eval.

        ``targets`` are the detokenized labels of each real example and ``scores``
        its total log-likelihood. Empty unless the input's task defines some.
        """
        return ()

    @property
    def predict_metric_fns(self) -> Sequence[Callable[[list[str], list[str]], dict[str, Any]]]:
        """SeqIO-style ``fn(targets, predictions) -> {name: value}`` metrics for decoding.

        ``targets`` and ``predictions`` are the detokenized reference continuation
        and decoded text of each real example. Empty unless the input defines some.
        """
        return ()

    def ids_to_strings(self, ids: np.ndarray, lengths: Sequence[int] | None = None) -> list[str]:
        """Detokenizes ``ids [B, T]`` (first ``lengths[b]`` tokens of row b) for inspection."""
        raise NotImplementedError(f"{type(self).__name__} has no vocabulary to detokenize with.")
