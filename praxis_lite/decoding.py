"""Autoregressive decoding inside jit: prefill, then a ``lax.while_loop`` of cached steps.

Shapes: ``B`` batch, ``P`` prompt slots, ``N`` decode steps, ``V`` vocabulary.

Prompts come right-padded (``prompt_ids [B, P]`` with ``prompt_lengths [B]``, as
inputs produce them). :func:`decode` left-aligns them, so every row's last prompt
token sits in slot ``P - 1`` and all rows write each new token into the same cache
slot; the left padding is masked out of attention and positions restart at 0 at
each row's first real token, so a row decodes exactly as it would alone.

Sampling (:class:`DecoderParams`, Hugging Face's ``generate`` names): greedy (argmax)
unless ``do_sample``; then the logits are divided by the temperature, cut to the
``top_k`` largest and/or the smallest set whose probability reaches ``top_p``, and
sampled. A row stops at its first token in ``eos_token_id`` (kept in the output);
later slots hold ``pad_token_id``. The loop ends after ``max_new_tokens`` or when
every row has stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite import config as config_lib
from praxis_lite.layers.attentions import CACHE
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import strip_boxes

# (ids [B, P], paddings [B, P], positions [B, P], max_len) -> (logits [B, P, V], cache)
PrefillFn = Callable[[jax.Array, jax.Array, jax.Array, int], tuple[jax.Array, Any]]
# (cache, ids [B], positions [B]) -> (logits [B, V], cache)
StepFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


#: Pax's names of the decoder fields, now Hugging Face's (one error names the new name).
_RENAMED = {
    "max_decode_steps": "max_new_tokens",
    "eos_id": "eos_token_id",
    "pad_id": "pad_token_id",
}


@config_lib.renamed_fields(_RENAMED, why="Hugging Face's name")
@dataclasses.dataclass(frozen=True)
class DecoderParams:
    """How to decode (Hugging Face's ``generate`` names and defaults).

    Attributes:
      max_new_tokens: new tokens per prompt; ``None``: the decoder input's target
        length.
      do_sample: False: greedy (argmax), whatever ``temperature``, ``top_k`` and
        ``top_p`` say; True: sample with them.
      temperature: the logits are divided by it before sampling (> 0; used only when
        ``do_sample``).
      top_k: sample among the ``top_k`` most likely tokens (0: all).
      top_p: sample among the most likely tokens whose probabilities sum to at
        least ``top_p`` (1.0: all).
      eos_token_id: a row stops after this token, or after any of these tokens (a
        list is kept as a tuple); ``None``: never stops early.
      pad_token_id: written after a row stopped.
      seed: seed of the sampling RNG (the step and batch are folded in).
    """

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(
                f"DecoderParams.max_new_tokens must be >= 1, got {self.max_new_tokens}."
            )
        if self.temperature < 0:
            raise ValueError(f"DecoderParams.temperature must be >= 0, got {self.temperature}.")
        if self.do_sample and self.temperature == 0:
            raise ValueError(
                "DecoderParams: do_sample=True needs temperature > 0 (got 0); set "
                "temperature > 0 to sample, or do_sample=False for greedy decoding."
            )
        if self.top_k < 0:
            raise ValueError(f"DecoderParams.top_k must be >= 0 (0 = off), got {self.top_k}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"DecoderParams.top_p must be in (0, 1], got {self.top_p}.")
        if isinstance(self.eos_token_id, (list, tuple)):  # Hashable: jit takes it as static.
            if not self.eos_token_id:
                raise ValueError("DecoderParams.eos_token_id is empty; use None for no EOS.")
            object.__setattr__(self, "eos_token_id", tuple(int(i) for i in self.eos_token_id))


def is_eos(tokens: Any, eos_token_id: int | tuple[int, ...] | None) -> Any:
    """Elementwise ``tokens`` (a numpy or jax array) in ``eos_token_id``; all False for None."""
    ids = eos_token_id if isinstance(eos_token_id, tuple) else (eos_token_id,)
    hit = tokens != tokens
    for i in ids:
        if i is not None:
            hit = hit | (tokens == i)
    return hit


def sample_logits(logits: jax.Array, key: jax.Array, params: DecoderParams) -> jax.Array:
    """One token per row from ``logits [B, V]`` -> ``[B]`` int32 (see DecoderParams)."""
    logits = logits.astype(jnp.float32)
    if not params.do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / params.temperature
    neg_inf = jnp.finfo(jnp.float32).min
    if params.top_k:
        kth = jax.lax.top_k(logits, min(params.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, neg_inf, logits)
    if params.top_p < 1.0:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        kept = mass_before < params.top_p  # The most likely token is always kept.
        threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, neg_inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def left_align(ids: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Right-padded ``ids [B, P]`` -> (left-padded ids, paddings, positions), all ``[B, P]``."""
    p = ids.shape[1]
    shift = (p - lengths)[:, None]  # left padding of each row
    slots = jnp.arange(p)[None, :]
    aligned = jnp.take_along_axis(ids, (slots - shift) % p, axis=1)
    paddings = (slots < shift).astype(jnp.float32)
    aligned = jnp.where(paddings > 0, 0, aligned)
    return aligned, paddings, jnp.maximum(slots - shift, 0).astype(jnp.int32)


def decode(
    prefill: PrefillFn,
    step: StepFn,
    prompt_ids: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    params: DecoderParams,
    max_new_tokens: int,
) -> NestedMap:
    """Decodes ``max_new_tokens`` tokens after each prompt (call it inside jit).

    Args:
      prefill: runs the prompts and returns their logits and a fresh cache.
      step: feeds one token per row and returns the next logits and the cache.
      prompt_ids: ``[B, P]`` int32, right-padded prompts.
      prompt_lengths: ``[B]`` real tokens per prompt (>= 1; 0 is taken as 1).
      key: the sampling RNG (unused when greedy).
      params: sampling settings.
      max_new_tokens: ``N``.

    Returns:
      NestedMap of ``tokens [B, N]`` int32 (``pad_token_id`` after a row stopped),
      ``lengths [B]`` tokens generated (an EOS included), ``log_probs [B, N]``
      float32 log-probability of each token under the model (temperature 1, no
      top-k/p cut; 0 after the end), ``scores [B]`` their sum.
    """
    b, p = prompt_ids.shape
    n = max_new_tokens
    prompt_lengths = jnp.clip(prompt_lengths.astype(jnp.int32), 1, p)
    ids, paddings, positions = left_align(prompt_ids, prompt_lengths)
    logits, cache = prefill(ids, paddings, positions, p + n - 1)

    def choose(i, logits, done, state):
        token = sample_logits(logits, jax.random.fold_in(key, i), params)
        token = jnp.where(done, params.pad_token_id, token)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=1)[:, 0]
        log_prob = jnp.where(done, 0.0, log_prob)
        state.tokens = state.tokens.at[:, i].set(token)
        state.log_probs = state.log_probs.at[:, i].set(log_prob)
        state.lengths = state.lengths + (~done).astype(jnp.int32)
        done = done | is_eos(token, params.eos_token_id)
        return token, done, state

    state = NestedMap(
        tokens=jnp.full((b, n), params.pad_token_id, jnp.int32),
        log_probs=jnp.zeros((b, n), jnp.float32),
        lengths=jnp.zeros((b,), jnp.int32),
    )
    token, done, state = choose(0, logits[:, -1].astype(jnp.float32), jnp.zeros((b,), bool), state)

    def cond(carry):
        i, _, done, _, _ = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, token, done, cache, state = carry
        logits, cache = step(cache, token, prompt_lengths + i - 1)
        token, done, state = choose(i, logits.astype(jnp.float32), done, state)
        return i + 1, token, done, cache, state

    carry = (jnp.asarray(1, jnp.int32), token, done, cache, state)
    _, _, _, _, state = jax.lax.while_loop(cond, body, carry)
    state.scores = jnp.sum(state.log_probs, axis=-1)
    return state


def lm_decode_fns(model: nn.Module, variables: dict[str, Any]) -> tuple[PrefillFn, StepFn]:
    """Prefill and step functions of a ``LanguageModel`` (``prefill``/``extend_step``; the
    step serves every model whose ``extend_step`` reads the ``'cache'`` collection)."""

    def prefill(ids, paddings, positions, max_len):
        logits, mutated = model.apply(
            variables,
            ids,
            paddings=paddings,
            positions=positions,
            max_len=max_len,
            method=model.prefill,
            mutable=[CACHE],
        )
        return logits, strip_boxes(mutated[CACHE])

    def step(cache, ids, positions):
        logits, mutated = model.apply(
            {**variables, CACHE: cache},
            ids,
            positions=positions,
            method=model.extend_step,
            mutable=[CACHE],
        )
        return logits, mutated[CACHE]

    return prefill, step


def decode_lm(
    model: nn.Module,
    variables: dict[str, Any],
    prompt_ids: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    params: DecoderParams,
    max_new_tokens: int,
) -> NestedMap:
    """:func:`decode` with a ``LanguageModel`` (``variables`` holds its ``params``)."""
    prefill, step = lm_decode_fns(model, variables)
    return decode(prefill, step, prompt_ids, prompt_lengths, key, params, max_new_tokens)


def decode_seq2seq(
    model: nn.Module,
    variables: dict[str, Any],
    input_ids: jax.Array,
    key: jax.Array,
    params: DecoderParams,
    max_new_tokens: int,
    start_id: int = 0,
) -> NestedMap:
    """:func:`decode` with an encoder-decoder (``EncoderDecoderModel``'s ``prefill`` and
    ``extend_step``): ``input_ids [B, S]`` (right-padded with 0) encoded once, then
    ``max_new_tokens`` targets decoded from ``start_id`` (T5's decoder start, 0).

    The start id is the one-token prompt of every row; the outputs are :func:`decode`'s.
    """
    b = input_ids.shape[0]

    def prefill(ids, paddings, positions, max_len):
        del paddings  # The one-token prompt has none.
        logits, mutated = model.apply(
            variables,
            input_ids,
            ids,
            positions=positions,
            max_len=max_len,
            method=model.prefill,
            mutable=[CACHE],
        )
        return logits, strip_boxes(mutated[CACHE])

    _, step = lm_decode_fns(model, variables)
    start = jnp.full((b, 1), start_id, jnp.int32)
    return decode(prefill, step, start, jnp.ones((b,), jnp.int32), key, params, max_new_tokens)
