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
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite import config as config_lib
from praxis_lite.base_layer import CACHE
from praxis_lite.decoding import beam_search, decode_cache, stop_strings
from praxis_lite.decoding import logits_processors as processors
from praxis_lite.decoding.logits_processors import is_eos  # Re-exported: decode_lib's name.
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import strip_boxes

# (ids [B, P], paddings [B, P], positions [B, P], max_len[, context]) -> (logits [B, P, V], cache)
PrefillFn = Callable[..., tuple[jax.Array, Any]]
# (cache, ids [B], positions [B]) -> (logits [B, V], cache)
StepFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]


#: Pax's names of the decoder fields, now Hugging Face's (one error names the new name).
_RENAMED = {
    "max_decode_steps": "max_new_tokens",
    "eos_id": "eos_token_id",
    "pad_id": "pad_token_id",
    "beam_size": "num_beams",
}

EARLY_STOPPING = (None, True, False, "never")


@config_lib.renamed_fields(_RENAMED, why="Hugging Face's name")
@dataclasses.dataclass(frozen=True)
class DecoderParams:
    """How to decode (Hugging Face's ``generate`` names and defaults).

    Attributes:
      max_new_tokens: new tokens per prompt; ``None``: the decoder input's target
        length.
      do_sample: False: greedy (argmax) or beam search, whatever ``temperature``,
        ``top_k`` and ``top_p`` say; True: sample with them.
      temperature: the logits are divided by it before sampling (> 0; used only when
        ``do_sample``).
      top_k: sample among the ``top_k`` most likely tokens (0: all).
      top_p: sample among the most likely tokens whose probabilities sum to at
        least ``top_p`` (1.0: all).
      eos_token_id: a row stops after this token, or after any of these tokens (a
        list is kept as a tuple); ``None``: never stops early.
      pad_token_id: written after a row stopped.
      seed: seed of the sampling RNG (the step and batch are folded in).
      num_beams: beams of beam search (``praxis_lite.decoding.beam_search``); 1: greedy or sampling.
      length_penalty: Hugging Face's beam rules, finished hypotheses scored ``sum / n **
        length_penalty`` (None: 1.0 unless ``length_norm_alpha`` is set).
      length_norm_alpha: T5X's and Pax's beam rules, scored ``sum / ((5 + n) / 6) **
        alpha``; never with ``length_penalty``.
      early_stopping: Hugging Face's (True, False, ``"never"``; None: False); only with
        its rules.
      num_return_sequences: sequences per row: the ``n`` best beams (``<= num_beams``), or
        ``n`` samples.
      min_new_tokens: every EOS id is banned before this many new tokens.
      repetition_penalty: scores of tokens already in the row divided (positive) or
        multiplied (negative) by it (1.0: off).
      no_repeat_ngram_size: no n-gram of this size appears twice in a row (0: off).
      stop_strings: a row also stops once its new text contains one of these (needs the
        model's tokenizer; a list is kept as a tuple).
      rescale_log_probs: with ``do_sample``, each token's log-probability (and the score)
        is under the distribution sampled from (temperature, top-k, top-p applied: T5X's
        ``temperature_sample`` default); False: under the model's logits.
      one_beam_search: with ``num_beams`` 1 and not ``do_sample``, beam search with one
        beam instead of greedy decoding (T5X's ``beam_search`` with ``num_decodes`` 1: of
        the 2 best continuations each step an EOS one joins the finished hypothesis, the
        other lives on; a finished hypothesis wins over the live beam at the end).
    """

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int = 0
    seed: int = 0
    num_beams: int = 1
    length_penalty: float | None = None
    length_norm_alpha: float | None = None
    early_stopping: bool | str | None = None
    num_return_sequences: int = 1
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    stop_strings: tuple[str, ...] | None = None
    rescale_log_probs: bool = False
    one_beam_search: bool = False

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
        if isinstance(self.stop_strings, (list, tuple, str)):
            strings = self.stop_strings
            strings = (strings,) if isinstance(strings, str) else tuple(strings)
            object.__setattr__(self, "stop_strings", strings or None)
        self._check_beams()
        self._check_controls()

    def _check_beams(self) -> None:
        """One-line errors for beam and n-best settings that contradict each other."""
        for name in ("num_beams", "num_return_sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecoderParams.{name} must be >= 1, got {getattr(self, name)}.")
        if self.length_penalty is not None and self.length_norm_alpha is not None:
            raise ValueError(
                "DecoderParams: set length_penalty (Hugging Face's sum / length ** p) or "
                "length_norm_alpha (T5X's and Pax's ((5 + length) / 6) ** alpha), not both "
                "(T5 and Pax LM experiments set length_norm_alpha: set it to None to use "
                "length_penalty)."
            )
        if self.early_stopping not in EARLY_STOPPING:
            raise ValueError(
                f"DecoderParams.early_stopping must be True, False or 'never', got "
                f"{self.early_stopping!r}."
            )
        if self.early_stopping is not None and self.length_norm_alpha is not None:
            raise ValueError(
                "DecoderParams: early_stopping is Hugging Face's (with length_penalty); "
                "length_norm_alpha follows T5X's stopping rule. Drop one of them."
            )
        if self.num_beams > 1 and self.do_sample:
            raise ValueError(
                "DecoderParams: beam sampling (do_sample=True with num_beams > 1) is not "
                "supported; set do_sample=False for beam search or num_beams=1 to sample."
            )
        if self.num_beams > 1 and self.num_return_sequences > self.num_beams:
            raise ValueError(
                f"DecoderParams: num_return_sequences={self.num_return_sequences} is more "
                f"than num_beams={self.num_beams}; return at most num_beams sequences."
            )
        if self.num_beams == 1 and not self.do_sample and self.num_return_sequences > 1:
            raise ValueError(
                "DecoderParams: greedy decoding returns one sequence per row; for "
                f"num_return_sequences={self.num_return_sequences} set num_beams >= "
                f"{self.num_return_sequences} (the n best beams) or do_sample=True."
            )

    def _check_controls(self) -> None:
        """One-line errors for out-of-range logits controls."""
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"DecoderParams.repetition_penalty must be > 0 (1.0 = off), got "
                f"{self.repetition_penalty}."
            )
        for name in ("no_repeat_ngram_size", "min_new_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"DecoderParams.{name} must be >= 0 (0 = off), got {getattr(self, name)}."
                )
        if self.stop_strings and any(not s for s in self.stop_strings):
            raise ValueError("DecoderParams.stop_strings holds an empty string; remove it.")


def sample_logits(logits: jax.Array, key: jax.Array, params: DecoderParams) -> jax.Array:
    """One token per row from ``logits [B, V]`` -> ``[B]`` int32 (see DecoderParams)."""
    logits = logits.astype(jnp.float32)
    if not params.do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, sampled_logits(logits, params), axis=-1).astype(jnp.int32)


def sampled_logits(logits: jax.Array, params: DecoderParams) -> jax.Array:
    """The logits ``[B, V]`` (float32) sampling draws from: divided by the temperature,
    outside top-k and top-p set to float32's lowest."""
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
    return logits


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
    *,
    context: Any = None,
    prompt_is_counted: bool = True,
    stop: Any = None,
) -> NestedMap:
    """Decodes ``max_new_tokens`` tokens after each prompt (call it inside jit): greedy,
    sampled or by beam search (``params``), with the logits controls
    (``logits_processors``) and stop strings.

    Args:
      prefill: runs the prompts and returns their logits and a fresh cache (with
        ``context``, also passed that: the rows' other inputs, e.g. an encoder's ids).
      step: feeds one token per row and returns the next logits and the cache.
      prompt_ids: ``[B, P]`` int32, right-padded prompts.
      prompt_lengths: ``[B]`` real tokens per prompt (>= 1; 0 is taken as 1).
      key: the sampling RNG (unused when greedy).
      params: sampling settings.
      max_new_tokens: ``N``.
      context: arrays ``[B, ...]`` ``prefill`` takes after ``max_len`` (None: none).
      prompt_is_counted: whether T5X's beam length counts the prompt (an LM's) or not
        (an encoder-decoder's start id).
      stop: ``praxis_lite.decoding.stop_strings.StopStrings`` of ``params.stop_strings``, or None.

    Returns:
      NestedMap of ``tokens [B, N]`` int32 (``pad_token_id`` after a row stopped),
      ``lengths [B]`` tokens generated (an EOS included), ``log_probs [B, N]``
      float32 log-probability of each token under the model (temperature 1, no
      top-k/p cut or controls; 0 after the end) and ``scores [B]``: their sum, or the
      beam rules' score. With ``num_return_sequences = n > 1`` each gains an axis
      after the batch: ``tokens [B, n, N]``, ``scores [B, n]``..., best beam first.
    """
    b, p = prompt_ids.shape
    n = max_new_tokens
    prompt_lengths = jnp.clip(prompt_lengths.astype(jnp.int32), 1, p)
    ids, paddings, positions = left_align(prompt_ids, prompt_lengths)
    extra = () if context is None else (context,)
    prefill_rows = lambda i, pd, ps, *c: prefill(i, pd, ps, p + n - 1, *c)
    logits, cache = prefill_rows(ids, paddings, positions, *extra)
    copies = params.num_beams if params.num_beams > 1 else params.num_return_sequences
    axes = None
    if copies > 1:
        axes = decode_cache.batch_axes(prefill_rows, cache, ids, paddings, positions, *extra)
        cache = decode_cache.repeat_rows(cache, axes, copies)
    history = jnp.where(paddings > 0, processors.EMPTY, ids)
    rows_lengths = jnp.repeat(prompt_lengths, copies)
    step_at = lambda cache, token, i: step(cache, token, rows_lengths + i - 1)
    stop_fns = None if stop is None else _stop_fns(stop, b * copies)
    first = logits[:, -1].astype(jnp.float32)
    if params.num_beams > 1 or (params.one_beam_search and not params.do_sample):
        counted = prompt_lengths if prompt_is_counted else jnp.zeros_like(prompt_lengths)
        out = beam_search.beam_search(
            step_at, first, cache, axes, history, counted, params, n, stop_fns
        )
    else:
        out = _sample_loop(
            step_at,
            jnp.repeat(first, copies, axis=0),
            cache,
            jnp.repeat(history, copies, axis=0),
            key,
            params,
            n,
            stop_fns,
        )
        out = NestedMap({name: x.reshape((b, copies) + x.shape[1:]) for name, x in out.items()})
    if params.num_return_sequences == 1:
        return NestedMap({name: x[:, 0] for name, x in out.items()})
    return NestedMap({name: x[:, : params.num_return_sequences] for name, x in out.items()})


def _stop_fns(stop: Any, rows: int) -> tuple[jax.Array, Callable]:
    """The stop strings' initial state ``[rows, S]`` and step function."""
    return stop_strings.init_state(stop, rows), functools.partial(stop_strings.advance, stop)


def _sample_loop(
    step: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]],
    first_logits: jax.Array,
    cache: Any,
    prompt_history: jax.Array,
    key: jax.Array,
    params: DecoderParams,
    n: int,
    stop: tuple[jax.Array, Callable] | None,
) -> NestedMap:
    """Greedy or sampled decoding of ``n`` tokens for ``R`` rows (``first_logits [R, V]``,
    ``prompt_history [R, P]``); :func:`decode`'s outputs without the sequences axis."""
    r = first_logits.shape[0]

    def choose(i, logits, done, state):
        generated = jnp.where(jnp.arange(n)[None, :] < i, state.tokens, processors.EMPTY)
        history = jnp.concatenate([prompt_history, generated], axis=1)
        scored = processors.process(logits, history, i, params)
        token = sample_logits(scored, jax.random.fold_in(key, i), params)
        token = jnp.where(done, params.pad_token_id, token)
        scoring = logits
        if params.rescale_log_probs and params.do_sample:
            scoring = sampled_logits(scored.astype(jnp.float32), params)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(scoring), token[:, None], axis=1)[:, 0]
        log_prob = jnp.where(done, 0.0, log_prob)
        state.tokens = state.tokens.at[:, i].set(token)
        state.log_probs = state.log_probs.at[:, i].set(log_prob)
        state.lengths = state.lengths + (~done).astype(jnp.int32)
        ended = is_eos(token, params.eos_token_id)
        if stop is not None:
            state.stop_state, hit = stop[1](state.stop_state, token)
            ended = ended | hit
        return token, done | ended, state

    state = NestedMap(
        tokens=jnp.full((r, n), params.pad_token_id, jnp.int32),
        log_probs=jnp.zeros((r, n), jnp.float32),
        lengths=jnp.zeros((r,), jnp.int32),
    )
    if stop is not None:
        state.stop_state = stop[0]
    token, done, state = choose(0, first_logits, jnp.zeros((r,), bool), state)

    def cond(carry):
        i, _, done, _, _ = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, token, done, cache, state = carry
        logits, cache = step(cache, token, i)
        token, done, state = choose(i, logits.astype(jnp.float32), done, state)
        return i + 1, token, done, cache, state

    carry = (jnp.asarray(1, jnp.int32), token, done, cache, state)
    _, _, _, _, state = jax.lax.while_loop(cond, body, carry)
    return NestedMap(
        tokens=state.tokens,
        lengths=state.lengths,
        log_probs=state.log_probs,
        scores=jnp.sum(state.log_probs, axis=-1),
    )


@dataclasses.dataclass(frozen=True)
class DecodePrompt:
    """What a model's decoding continues (``BaseModel.decode_prompt``).

    Attributes:
      ids: ``[B, P]`` int32 right-padded prompts.
      lengths: ``[B]`` real tokens per prompt.
      context: the rows' other inputs ``[B, ...]`` (an encoder's ids), which the model's
        ``prefill`` takes after the prompt ids; None: none.
      is_counted: whether T5X's beam length counts the prompt (an LM's prefix) or not (an
        encoder-decoder's start id).
    """

    ids: jax.Array
    lengths: jax.Array
    context: Any = None
    is_counted: bool = True


def model_decode_fns(model: nn.Module, variables: dict[str, Any]) -> tuple[PrefillFn, StepFn]:
    """:func:`decode`'s prefill and step functions of a model's ``prefill`` and
    ``extend_step`` methods (``variables`` holds its ``params``; the ``'cache'`` collection
    is what they write and read).

    ``model.prefill(ids, *context, paddings=, positions=, max_len=)`` runs the prompts into
    a fresh cache; ``model.extend_step(ids [B], positions=[B])`` runs one token per row.
    """

    def prefill(ids, paddings, positions, max_len, *context):
        logits, mutated = model.apply(
            variables,
            ids,
            *context,
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
