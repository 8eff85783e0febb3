"""Synthetic inputs for smoke tests and benchmarks (no files, no tokenizer).

``SyntheticLmInput`` makes arithmetic progressions modulo the vocabulary:
``token[i] = (start + i * stride) % vocab`` with a random start and a stride
from ``strides``. After two tokens the rest is determined, so a small model
drives the loss far below ``log(vocab)``. With ``random_tokens=True`` the
tokens are uniform noise (a fixed-shape benchmark input).

With ``prompt_len > 0`` it is a decoder input (see ``BaseInput``): the prompt is
the first 2..``prompt_len`` tokens of a progression, the target the next
``seq_len - prompt_len`` tokens, and the predict metrics check that the decoded
text continues the progression (:func:`continuation_metrics`).

``SyntheticSeq2SeqInput`` is an encoder-decoder task (``Seq2SeqTask``): reverse (or sort)
a random sequence of ``min_len``..``max_len`` tokens in ``[2, vocab_size)`` (0 is padding,
1 EOS). Its batches have the keys of seqio's ``EncDecFeatureConverter`` (unpacked; see
``seqio_seq2seq``), ``L = max_len + 1``::

    encoder_input_tokens   [B, L] int32: the tokens, EOS, right-padded with 0
    decoder_target_tokens  [B, L] int32: the reversed (sorted) tokens, EOS, padding
    decoder_input_tokens   [B, L] int32: the targets shifted right behind a 0
    decoder_loss_weights   [B, L] float32: 1 where the target is no padding

With ``decode=True`` it is a decoder input of ``input_ids`` / ``input_lengths`` (the
encoder's tokens and EOS) and ``target_ids`` / ``target_lengths`` (with EOS), scored by
exact match (:func:`continuation_metrics`).

Both make global batch ``index`` a pure function of ``(seed, index)``; host ``h`` of
``n`` emits rows ``[h * batch_size, (h + 1) * batch_size)`` of it, so hosts never repeat
each other and any host count sees the same global data.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from praxis_lite.inputs.base_input import BaseInput, InputConfigError
from praxis_lite.py_utils import NestedMap

PAD_ID, EOS_ID = 0, 1  # SyntheticSeq2SeqInput's special ids; its tokens are >= 2.


class _SeededInput(BaseInput):
    """An input whose global batch ``index`` is a pure function of ``(seed, index)``.

    Subclasses are dataclasses with a ``num_batches`` field (batches per epoch; None:
    endless; after an epoch the input starts over if it ``repeats``, else StopIteration)
    and make a host's batch from the global batch's generator in ``_batch(rng)``.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reset_for_eval and not self.repeats and self.num_batches is None:
            raise InputConfigError(
                f"{type(self).__name__} '{self.name}': one-epoch eval (reset_for_eval=True) "
                "needs a finite input; set num_batches."
            )
        self._index = 0

    def get_next(self) -> NestedMap:
        """This host's rows of the next global batch; StopIteration after a finite epoch."""
        if self.num_batches is not None and self._index >= self.num_batches:
            if not self.repeats:
                raise StopIteration
            self._index = 0
        rng = np.random.default_rng([self.seed, self._index])
        self._index += 1
        return self._batch(rng)

    def _batch(self, rng: np.random.Generator) -> NestedMap:
        raise NotImplementedError

    @property
    def _rows(self) -> slice:
        """This host's rows of a global batch of ``batch_size * num_infeed_hosts``."""
        b = self.batch_size
        return slice(self.infeed_host_index * b, (self.infeed_host_index + 1) * b)

    @property
    def _global_batch_size(self) -> int:
        return self.batch_size * self.num_infeed_hosts

    def reset(self) -> None:
        self._index = 0

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])


@dataclasses.dataclass
class SyntheticLmInput(_SeededInput):
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
                raise InputConfigError(
                    f"SyntheticLmInput '{self.name}': decode prompts need progressions and "
                    f"2 <= min_prompt_len ({shortest}) <= prompt_len ({self.prompt_len}) < "
                    f"seq_len ({self.seq_len}); got random_tokens={self.random_tokens}."
                )

    def _batch(self, rng: np.random.Generator) -> NestedMap:
        """NestedMap of ``[batch_size, seq_len]`` ids, labels, paddings, weights."""
        b, t, rows, global_b = self.batch_size, self.seq_len, self._rows, self._global_batch_size
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

    def ids_to_strings(self, ids: np.ndarray, lengths=None) -> list[str]:
        """Token ids as space-separated numbers (the synthetic vocabulary is numbers)."""
        lengths = [len(row) for row in ids] if lengths is None else lengths
        return [" ".join(str(int(t)) for t in row[:n]) for row, n in zip(ids, lengths, strict=True)]


class Seq2SeqTask(enum.StrEnum):
    """What :class:`SyntheticSeq2SeqInput`'s decoder makes of the encoder's tokens."""

    REVERSE = "reverse"  # The tokens in reverse order.
    SORT = "sort"  # The tokens in ascending order.


@dataclasses.dataclass
class SyntheticSeq2SeqInput(_SeededInput):
    """Encoder-decoder examples: random token sequences and their reversal (or sorting).

    Attributes:
      vocab_size: ids in ``[0, vocab_size)``: 0 is padding, 1 EOS, tokens ``>= 2``.
      min_len: the fewest tokens of a sequence (before its EOS), >= 1.
      max_len: the most tokens of a sequence; rows are ``max_len + 1`` long.
      task: ``Seq2SeqTask`` (or its value, 'reverse' or 'sort').
      num_batches: batches per epoch (``None``: endless); after an epoch the input
        starts over if it ``repeats``, else raises StopIteration.
      decode: yield decode batches (``input_ids``, ``target_ids``, ...: the module
        docstring) instead of training batches; not for training.
      feature_lengths: ``(S, T)``: input and target rows padded to these lengths (each
        at least ``max_len + 1``), e.g. to stand in for a real task's shapes; None:
        ``max_len + 1`` each.
    """

    vocab_size: int = 32
    min_len: int = 1
    max_len: int = 8
    task: Seq2SeqTask = Seq2SeqTask.REVERSE
    num_batches: int | None = None
    decode: bool = False
    feature_lengths: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"SyntheticSeq2SeqInput '{self.name}'"
        if self.task not in list(Seq2SeqTask):
            raise InputConfigError(
                f"{where}: task={self.task!r} is unknown; set one of "
                f"{[t.value for t in Seq2SeqTask]}."
            )
        self.task = Seq2SeqTask(self.task)
        if self.vocab_size < 3:
            raise InputConfigError(
                f"{where}: vocab_size={self.vocab_size} leaves no token past padding (0) and "
                "EOS (1); set vocab_size >= 3."
            )
        if not 1 <= self.min_len <= self.max_len:
            raise InputConfigError(
                f"{where}: needs 1 <= min_len <= max_len, got min_len={self.min_len}, "
                f"max_len={self.max_len}."
            )
        if self.decode and self.is_training:
            raise InputConfigError(
                f"{where}: decode=True yields decode batches, which cannot feed training; set "
                "is_training=False (and reset_for_eval=True)."
            )
        if self.feature_lengths is not None and min(self.feature_lengths) <= self.max_len:
            raise InputConfigError(
                f"{where}: feature_lengths={tuple(self.feature_lengths)} must each exceed "
                f"max_len={self.max_len} (a sequence and its EOS)."
            )

    def _batch(self, rng: np.random.Generator) -> NestedMap:
        """This host's rows: training batches, or decode batches with ``decode``."""
        global_b, rows = self._global_batch_size, self._rows
        tokens = rng.integers(EOS_ID + 1, self.vocab_size, size=(global_b, self.max_len))[rows]
        lengths = rng.integers(self.min_len, self.max_len + 1, size=global_b)[rows]
        slots = np.arange(self.max_len)[None, :]
        real = slots < lengths[:, None]
        if self.task is Seq2SeqTask.REVERSE:
            out = np.take_along_axis(tokens, np.maximum(lengths[:, None] - 1 - slots, 0), axis=1)
        else:  # Padding past the largest token sorts last.
            out = np.sort(np.where(real, tokens, self.vocab_size), axis=1)
        inputs, targets = (
            np.pad(np.where(real, t, PAD_ID), ((0, 0), (0, 1))).astype(np.int32)
            for t in (tokens, out)
        )
        ends = (np.arange(len(lengths)), lengths)
        inputs[ends] = targets[ends] = EOS_ID
        if self.feature_lengths is not None:
            inputs, targets = (
                np.pad(rows, ((0, 0), (0, n - rows.shape[1])))
                for rows, n in zip((inputs, targets), self.feature_lengths, strict=True)
            )
        if self.decode:
            n = (lengths + 1).astype(np.int32)
            return NestedMap(
                input_ids=inputs, input_lengths=n, target_ids=targets, target_lengths=n
            )
        return NestedMap(
            encoder_input_tokens=inputs,
            decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
            decoder_target_tokens=targets,
            decoder_loss_weights=(targets != PAD_ID).astype(np.float32),
        )

    @property
    def predict_metric_fns(self) -> Sequence[Callable[[list[str], list[str]], dict[str, Any]]]:
        """``exact_match`` (and ``token_accuracy``) of decoded texts, for decode batches."""
        return (continuation_metrics,) if self.decode else ()

    def ids_to_strings(self, ids: np.ndarray, lengths: Sequence[int] | None = None) -> list[str]:
        """Rows' first ``lengths`` ids as space-separated numbers, up to the first EOS (1).

        Other ids are all written, 0 too: padding decoded inside a sequence is a mistake.
        """
        lengths = [len(row) for row in ids] if lengths is None else lengths
        texts = []
        for row, n in zip(ids, lengths, strict=True):
            row = [int(t) for t in row[: int(n)]]
            texts.append(" ".join(map(str, row[: row.index(EOS_ID) if EOS_ID in row else None])))
        return texts


def continuation_metrics(targets: list[str], predictions: list[str]) -> dict[str, float]:
    """Whether decoded texts are their targets (a SeqIO predict metric fn): the continued
    progressions of SyntheticLmInput, the reversed or sorted tokens of SyntheticSeq2SeqInput.

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
