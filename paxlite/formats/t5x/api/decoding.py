"""``t5x.decoding``: the decoding functions a model's ``decode_fn`` names, with T5X's
signatures; called with no arrays (as the translation does), each returns its bound settings.
"""

from __future__ import annotations

from typing import Any


def beam_search(
    inputs: Any = None,
    cache: Any = None,
    tokens_to_logits: Any = None,
    eos_id: int | None = None,
    num_decodes: int = 4,
    alpha: float = 0.6,
    max_decode_len: int | None = None,
    max_decode_step: int = -1,
    min_log_prob: float = -1.0e7,
    decode_rng: Any = None,
    cache_offset: int = 0,
    initial_index: Any = None,
) -> dict[str, Any]:
    """T5X's beam search (``EncoderDecoderModel``'s default ``decode_fn``): paxlite's decoder
    runs it with T5X's length normalization ``alpha``. Returns the settings."""
    return {k: v for k, v in locals().items() if k not in ("inputs", "cache", "tokens_to_logits")}


def temperature_sample(
    inputs: Any = None,
    cache: Any = None,
    tokens_to_logits: Any = None,
    eos_id: int | None = None,
    decode_rng: Any = None,
    num_decodes: int = 1,
    temperature: float = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    cache_offset: int = 0,
    initial_index: Any = None,
    max_decode_steps: int | None = None,
    max_decode_steps_hard_limit: int | None = None,
    rescale_log_probs: bool = True,
    state_callback_fn: Any = None,
    logit_callback_fn: Any = None,
) -> dict[str, Any]:
    """T5X's sampler (``topk`` 1, its default, is greedy; ``topp`` 0: off): paxlite's
    sampler runs it. Returns the settings."""
    return {k: v for k, v in locals().items() if k not in ("inputs", "cache", "tokens_to_logits")}


#: The settings each function is run with by paxlite (the others must keep their defaults).
BEAM_SEARCH_SETTINGS = ("num_decodes", "alpha", "eos_id", "decode_rng")
SAMPLE_SETTINGS = ("num_decodes", "temperature", "topk", "topp", "eos_id", "decode_rng")
