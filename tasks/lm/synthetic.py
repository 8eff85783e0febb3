"""A learnable synthetic LM dataset and the tiny CPU experiment that trains on it.

Each sequence is an arithmetic progression modulo the vocabulary:
``token[i] = (start + i * stride) % vocab`` with a random start and a stride
from ``strides``. After two tokens the rest is determined, so a small model
drives the loss far below ``log(vocab)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from paxlite import experiment_registry
from praxis_lite import config as config_lib
from praxis_lite.base_input import BaseInput
from praxis_lite.py_utils import NestedMap
from tasks.lm.lm_cloud import LmCloudSpmd
from tasks.lm.model_params import Activation


@dataclasses.dataclass
class SyntheticLmInput(BaseInput):
    """Arithmetic-progression token sequences; batch ``index`` is a pure function of the seed.

    Attributes:
      seq_len: ``T`` tokens per example.
      vocab_size: tokens are in ``[0, vocab_size)``.
      strides: the progressions' possible strides.
      num_batches: batches per epoch (``None``: endless); after an epoch the input
        starts over if it ``repeats``, else raises StopIteration.
    """

    seq_len: int = 32
    vocab_size: int = 64
    strides: tuple[int, ...] = (1, 2, 3)
    num_batches: int | None = None

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
        rng = np.random.default_rng(
            [self.seed, self.infeed_host_index, self.num_infeed_hosts, self._index]
        )
        self._index += 1
        b, t = self.batch_size, self.seq_len
        start = rng.integers(0, self.vocab_size, size=(b, 1))
        stride = rng.choice(np.asarray(self.strides), size=(b, 1))
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


@experiment_registry.register
class LmSyntheticTiny(LmCloudSpmd):
    """A 2-layer, 64-dim LM on SyntheticLmInput: trains on a laptop CPU in about a minute."""

    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 256
    NUM_HEADS = 4
    VOCAB_SIZE = 64
    MAX_SEQ_LEN = 32
    ACTIVATION = Activation.GELU
    USE_REPEATED_LAYER = True
    FPROP_DTYPE = np.float32
    PERCORE_BATCH_SIZE = 16
    LEARNING_RATE = 3e-3
    WEIGHT_DECAY = 0.0
    LR_WARMUP_STEPS = 20
    LR_COS_MIN_RATIO = 0.1
    NUM_TRAIN_STEPS = 300
    SAVE_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 25
    EVAL_INTERVAL_STEPS = 100
    MAX_TO_KEEP = 2

    def datasets(self) -> list[Any]:
        common = dict(seq_len=self.MAX_SEQ_LEN, vocab_size=self.VOCAB_SIZE)
        train = config_lib.Config(
            SyntheticLmInput, batch_size=self.train_batch_size(), seed=self.SEED, **common
        )
        evaluation = config_lib.Config(
            SyntheticLmInput,
            batch_size=self.train_batch_size(),
            name="test",
            is_training=False,
            reset_for_eval=True,
            num_batches=4,
            seed=self.SEED + 1,
            **common,
        )
        return [train, evaluation]

    def train_batch_size(self) -> int:
        """This host's share of PERCORE_BATCH_SIZE x devices."""
        return self.per_host_batch_size(jax.device_count(), jax.process_count())
