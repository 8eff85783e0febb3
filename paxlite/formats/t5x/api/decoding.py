"""``t5x.decoding``: the decoding functions a model's ``decode_fn`` names."""

from __future__ import annotations

from typing import Any


def beam_search(*args: Any, **kwargs: Any) -> Any:
    """T5X's beam search (``EncoderDecoderModel``'s default ``decode_fn``); paxlite's
    decoder runs it (T5X's length normalization, alpha 0.6)."""
    raise NotImplementedError("a marker for gin: paxlite's decoder does the decoding")


def temperature_sample(*args: Any, **kwargs: Any) -> Any:
    """T5X's sampling decoder; paxlite's sampler runs it."""
    raise NotImplementedError("a marker for gin: paxlite's decoder does the decoding")
