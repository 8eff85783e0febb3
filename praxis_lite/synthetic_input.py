"""Synthetic LM inputs for smoke tests and benchmarks (no files, no tokenizer).

``SyntheticLmInput`` makes arithmetic progressions modulo the vocabulary:
``token[i] = (start + i * stride) % vocab`` with a random start and a stride
from ``strides``. After two tokens the rest is determined, so a small model
drives the loss far below ``log(vocab)``. With ``random_tokens=True`` the
tokens are uniform noise (a fixed-shape benchmark input).

With ``prompt_len > 0`` it is a decoder input (see ``BaseInput``): the prompt is
the first 2..``prompt_len`` tokens of a progression, the target the next
``seq_len - prompt_len`` tokens, and the predict metrics check that the decoded
text continues the progression (:func:`continuation_metrics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
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
      prompt_len: 0 for LM batches; else prompt/target decode batches with
        prompts of ``min_prompt_len``..``prompt_len`` tokens (``[B, prompt_len]``,
        right-padded) and targets of ``seq_len - prompt_len`` tokens.
      min_prompt_len: the shortest prompt (>= 2: two tokens fix a progression);
        ``None``: ``prompt_len``.
    """

    seq_len: int = 32
    vocab_size: int = 64
    strides: tuple[int, ...] = (1, 2, 3)
    num_batches: int | None = None
    random_tokens: bool = False
    prompt_len: int = 0
    min_prompt_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prompt_len:
            shortest = self.min_prompt_len or self.prompt_len
            if self.random_tokens or not 2 <= shortest <= self.prompt_len < self.seq_len:
                raise ValueError(
                    f"SyntheticLmInput '{self.name}': decode prompts need progressions and "
                    f"2 <= min_prompt_len ({shortest}) <= prompt_len ({self.prompt_len}) < "
                    f"seq_len ({self.seq_len}); got random_tokens={self.random_tokens}."
                )
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
        if self.prompt_len:
            return self._decode_batch(tokens, rng.integers(0, 2**31, size=global_b)[rows])
        return NestedMap(
            ids=tokens[:, :-1].astype(np.int32),
            labels=tokens[:, 1:].astype(np.int32),
            paddings=np.zeros((b, t), np.float32),
            weights=np.ones((b, t), np.float32),
        )

    def _decode_batch(self, tokens: np.ndarray, draws: np.ndarray) -> NestedMap:
        """Prompts (first L tokens, L drawn per row) and the next ``seq_len - prompt_len``."""
        shortest = self.min_prompt_len or self.prompt_len
        lengths = shortest + draws % (self.prompt_len - shortest + 1)
        target_len = self.seq_len - self.prompt_len
        slots = np.arange(self.prompt_len)[None, :]
        prefix = np.where(slots < lengths[:, None], tokens[:, : self.prompt_len], 0)
        targets = np.take_along_axis(tokens, lengths[:, None] + np.arange(target_len), axis=1)
        return NestedMap(
            prefix_ids=prefix.astype(np.int32),
            prefix_lengths=lengths.astype(np.int32),
            target_ids=targets.astype(np.int32),
            target_lengths=np.full(len(tokens), target_len, np.int32),
        )

    @property
    def predict_metric_fns(self) -> Sequence[Callable[[list[str], list[str]], dict[str, Any]]]:
        return (continuation_metrics,) if self.prompt_len else ()

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


def continuation_metrics(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Whether decoded text continues each progression (a SeqIO predict metric fn).

    Returns ``exact_match`` (fraction of predictions equal to their target
    continuation) and ``token_accuracy`` (fraction of target tokens predicted at
    their place).
    """
    if len(targets) != len(predictions) or not targets:
        raise ValueError(f"{len(targets)} targets vs. {len(predictions)} predictions.")
    exact, right, total = 0, 0, 0
    for target, prediction in zip(targets, predictions, strict=True):
        want, got = target.split(), prediction.split()
        exact += want == got
        right += sum(w == g for w, g in zip(want, got, strict=False))
        total += len(want)
    return {"exact_match": exact / len(targets), "token_accuracy": right / max(total, 1)}
