"""Synthetic LM inputs for smoke tests and benchmarks (no files, no tokenizer).

``SyntheticLmInput`` makes arithmetic progressions modulo the vocabulary:
``token[i] = (start + i * stride) % vocab`` with a random start and a stride
from ``strides``. After two tokens the rest is determined, so a small model
drives the loss far below ``log(vocab)``. With ``random_tokens=True`` the
tokens are uniform noise (a fixed-shape benchmark input).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from praxis_lite.base_input import BaseInput
from praxis_lite.py_utils import NestedMap


@dataclasses.dataclass
class SyntheticLmInput(BaseInput):
    """Arithmetic-progression (or random) token sequences, reproducible from the seed.

    Global batch ``index`` is a pure function of ``(seed, index)``; host ``h`` of
    ``n`` emits rows ``[h * batch_size, (h + 1) * batch_size)`` of it, so hosts
    never repeat each other and any host count sees the same global data.

    Attributes:
      seq_len: ``T`` tokens per example.
      vocab_size: tokens are in ``[0, vocab_size)``.
      strides: the progressions' possible strides.
      num_batches: batches per epoch (``None``: endless); after an epoch the input
        starts over if it ``repeats``, else raises StopIteration.
      random_tokens: uniform random tokens instead of progressions.
    """

    seq_len: int = 32
    vocab_size: int = 64
    strides: tuple[int, ...] = (1, 2, 3)
    num_batches: int | None = None
    random_tokens: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reset_for_eval and self.num_batches is None:
            raise ValueError(
                f"SyntheticLmInput '{self.name}': one-epoch eval (reset_for_eval=True) needs a "
                "finite input; set num_batches."
            )
        self._index = 0

    def get_next(self) -> NestedMap:
        """NestedMap of ``[batch_size, seq_len]`` ids, labels, paddings, weights."""
        if self.num_batches is not None and self._index >= self.num_batches:
            if not self.repeats:
                raise StopIteration
            self._index = 0
        # The global batch is a function of (seed, index) alone; each host takes its
        # rows, so 1 host and N hosts see the same global batches.
        rng = np.random.default_rng([self.seed, self._index])
        self._index += 1
        b, t = self.batch_size, self.seq_len
        rows = slice(self.infeed_host_index * b, (self.infeed_host_index + 1) * b)
        global_b = b * self.num_infeed_hosts
        if self.random_tokens:
            tokens = rng.integers(0, self.vocab_size, size=(global_b, t + 1))[rows]
        else:
            start = rng.integers(0, self.vocab_size, size=(global_b, 1))[rows]
            stride = rng.choice(np.asarray(self.strides), size=(global_b, 1))[rows]
            tokens = (start + stride * np.arange(t + 1)[None, :]) % self.vocab_size
        return NestedMap(
            ids=tokens[:, :-1].astype(np.int32),
            labels=tokens[:, 1:].astype(np.int32),
            paddings=np.zeros((b, t), np.float32),
            weights=np.ones((b, t), np.float32),
        )

    def reset(self) -> None:
        self._index = 0

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])

    def ids_to_strings(self, ids: np.ndarray, lengths=None) -> list[str]:
        """Token ids as space-separated numbers (the synthetic vocabulary is numbers)."""
        lengths = [len(row) for row in ids] if lengths is None else lengths
        return [" ".join(str(int(t)) for t in row[:n]) for row, n in zip(ids, lengths, strict=True)]
