"""Hugging Face's logits controls, in jax, for every decoding loop (greedy, sampling, beams).

Shapes: ``R`` rows (a batch, or a batch times its beams), ``V`` vocabulary, ``L`` slots of a
row's history: the ids it decodes after (an LM's prompt; an encoder-decoder's start id)
followed by the ids generated so far, ``-1`` in the slots that hold no token (a prompt's
padding, steps not taken yet).

As in transformers' ``generate`` (``RepetitionPenaltyLogitsProcessor``,
``NoRepeatNGramLogitsProcessor``, ``MinNewTokensLengthLogitsProcessor``), in that order:

- ``repetition_penalty`` ``p``: the score of every token already in the history is divided
  by ``p`` where positive and multiplied by ``p`` where negative;
- ``no_repeat_ngram_size`` ``n``: a token that would complete an n-gram already in the
  history is banned (its score -inf);
- ``min_new_tokens``: every EOS id is banned while fewer tokens than that were generated.

Greedy decoding and sampling apply them to the logits; beam search to the log-probabilities
(as transformers does).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

EMPTY = -1  # A history slot without a token.


def eos_ids(eos_token_id: int | tuple[int, ...] | None) -> tuple[int, ...]:
    """``eos_token_id`` (one id, several, or None) as a tuple."""
    if eos_token_id is None:
        return ()
    return eos_token_id if isinstance(eos_token_id, tuple) else (eos_token_id,)


def is_eos(tokens: Any, eos_token_id: int | tuple[int, ...] | None) -> Any:
    """Elementwise ``tokens`` (a numpy or jax array) in ``eos_token_id``; all False for None."""
    hit = tokens != tokens
    for i in eos_ids(eos_token_id):
        hit = hit | (tokens == i)
    return hit


def apply_repetition_penalty(scores: jax.Array, history: jax.Array, penalty: float) -> jax.Array:
    """``scores [R, V]`` with every token of ``history [R, L]`` penalised (see module doc)."""
    v = scores.shape[-1]
    ids = jnp.where(history == EMPTY, v, history)  # Out of range: dropped by the scatter.
    rows = jnp.arange(scores.shape[0])[:, None]
    seen = jnp.take_along_axis(scores, jnp.minimum(ids, v - 1), axis=1)
    penalised = jnp.where(seen < 0, seen * penalty, seen / penalty)
    return scores.at[rows, ids].set(penalised, mode="drop")


def banned_by_ngrams(history: jax.Array, size: int) -> jax.Array:
    """Per row, the tokens that would repeat an n-gram of ``history [R, L]`` (``n = size``):
    ``[R, L]`` ids, ``EMPTY`` where none.

    The last ``n - 1`` filled slots are the n-gram's head; every earlier window of ``n - 1``
    tokens equal to it bans the token after it.
    """
    if size == 1:  # Every token seen is a repeated 1-gram.
        return history
    r, length = history.shape
    filled = jnp.sum(history != EMPTY, axis=1)
    # The history is left-padded: its filled slots end at the last slot taken so far.
    end = _last_filled(history) + 1  # [R]
    head = jnp.stack(
        [
            jnp.take_along_axis(history, (end - size + 1 + k)[:, None] % length, 1)[:, 0]
            for k in range(size - 1)
        ],
        axis=1,
    )  # [R, n - 1]
    starts = jnp.arange(length)  # a window's first slot
    match = jnp.ones((r, length), bool)
    for k in range(size - 1):
        slot = starts + k
        window = jnp.where(slot < length, history[:, jnp.minimum(slot, length - 1)], EMPTY - 1)
        match = match & (window == head[:, k : k + 1])
    nxt = starts + size - 1
    banned = jnp.where(nxt < length, history[:, jnp.minimum(nxt, length - 1)], EMPTY)
    ok = match & (nxt[None, :] < end[:, None]) & (filled >= size - 1)[:, None]
    return jnp.where(ok, banned, EMPTY)


def _last_filled(history: jax.Array) -> jax.Array:
    """``[R]`` the index of each row's last filled slot of ``history [R, L]`` (-1 if none)."""
    slots = jnp.arange(history.shape[1])
    return jnp.max(jnp.where(history != EMPTY, slots, -1), axis=1)


def ban(scores: jax.Array, ids: jax.Array) -> jax.Array:
    """``scores [R, V]`` with the tokens ``ids [R, K]`` (``EMPTY``: none) set to -inf."""
    v = scores.shape[-1]
    ids = jnp.where(ids == EMPTY, v, ids)
    rows = jnp.arange(scores.shape[0])[:, None]
    return scores.at[rows, ids].set(-jnp.inf, mode="drop")


def process(scores: jax.Array, history: jax.Array, num_generated: Any, params: Any) -> jax.Array:
    """``scores [R, V]`` (logits, or log-probs in beam search) after the controls of
    ``params`` (a ``decoding.DecoderParams``), given each row's ``history [R, L]`` and the
    number of tokens generated so far (a scalar)."""
    if params.repetition_penalty != 1.0:
        scores = apply_repetition_penalty(scores, history, params.repetition_penalty)
    if params.no_repeat_ngram_size:
        scores = ban(scores, banned_by_ngrams(history, params.no_repeat_ngram_size))
    eos = eos_ids(params.eos_token_id)
    if params.min_new_tokens and eos:
        early = num_generated < params.min_new_tokens
        eos_cols = jnp.zeros((scores.shape[-1],), bool).at[jnp.asarray(eos)].set(True)
        scores = jnp.where(early & eos_cols[None, :], -jnp.inf, scores)
    return scores


def is_active(params: Any) -> bool:
    """Whether any control of ``params`` changes scores (else :func:`process` is the identity)."""
    return bool(
        params.repetition_penalty != 1.0
        or params.no_repeat_ngram_size
        or (params.min_new_tokens and eos_ids(params.eos_token_id))
    )
