"""Beam search inside jit, in Hugging Face's or T5X's rules (``decoding.decode`` calls it).

Shapes: ``B`` batch, ``K`` beams, ``C`` candidates a step (``max(2, 1 + #EOS ids) * K``),
``N`` new tokens, ``V`` vocabulary, ``P`` history slots before the new tokens.

Each step extends every live beam by every token, keeps the ``C`` best continuations by
summed log-probability (after the logits controls, ``logits_processors``), moves those that
end (an EOS id or a stop string) into the row's ``K`` finished hypotheses, and continues
the ``K`` best that did not. The cache's rows follow their beams (``decode_cache``).

Which rules (``DecoderParams``: ``length_penalty`` or ``length_norm_alpha``):

- **Hugging Face** (``length_penalty`` ``p``; transformers 5's ``_beam_search``): a
  finished hypothesis scores ``sum / n ** p`` with ``n`` its new tokens (an EOS included);
  only the ``K`` best continuations may finish; at ``max_new_tokens`` every one of them
  finishes; ``early_stopping`` (True: a row is done when it holds ``K`` finished; False:
  when its best live beam, scored at today's length, cannot beat its worst finished one;
  ``"never"``: the same at the longest length when ``p > 0``).
- **T5X** (``length_norm_alpha`` ``a``; ``t5x.decoding.beam_search``): finished hypotheses
  score ``sum / ((5 + n) / 6) ** a`` with ``n`` the new tokens plus an LM's prompt; any of
  the ``C`` continuations that ends may finish; the search stops when, in every row, all
  ``K`` finished slots are filled and the best live beam's sum over ``((5 + N + 1) / 6) **
  a`` cannot beat the worst of them; a row that finished nothing returns its live beams
  with their raw sums.

The hypotheses come back best first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from praxis_lite.decoding import decode_cache
from praxis_lite.decoding import logits_processors as processors
from praxis_lite.py_utils import NestedMap

T5X_LENGTH_NORM_ALPHA = 0.6  # t5x.decoding.beam_search's default alpha.
PRAXIS_LENGTH_NORM_ALPHA = 0.8  # praxis' BeamSearchHParams.length_norm_alpha.
HF_NEG = -1.0e9  # transformers' "very large negative" for excluded beams.
T5X_NEG = -1.0e7  # T5X's NEG_INF.

# (cache, ids [R], step i) -> (logits [R, V], cache)
StepFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
# (stop state [R, S], ids [R]) -> (stop state, hit [R])
StopFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def brevity_penalty(alpha: float, length: jax.Array) -> jax.Array:
    """T5X's and Pax's length normalisation ``((5 + length) / 6) ** alpha``."""
    return jnp.power((5.0 + length) / 6.0, alpha)


def num_candidates(params: Any) -> int:
    """``C``: continuations kept a step (transformers' ``beams_to_keep``)."""
    return max(2, 1 + len(processors.eos_ids(params.eos_token_id))) * params.num_beams


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """``x [B, K, ...]`` at ``index [B, J]`` along the beams -> ``[B, J, ...]``."""
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def _top(scores: jax.Array, k: int) -> jax.Array:
    """Indices ``[B, k]`` of the ``k`` largest of ``scores [B, M]``, best first (ties: the
    lower index first, as ``lax.top_k``)."""
    return jax.lax.top_k(scores, k)[1]


def beam_search(
    step: StepFn,
    first_logits: jax.Array,
    cache: Any,
    axes: Any,
    prompt_history: jax.Array,
    counted_prompt: jax.Array,
    params: Any,
    max_new_tokens: int,
    stop: tuple[jax.Array, StopFn] | None = None,
) -> NestedMap:
    """Beam search of ``max_new_tokens`` tokens (call it inside jit).

    Args:
      step: feeds one token per beam row (``b * K + k``) and returns the next logits.
      first_logits: ``[B, V]`` the prompt's next-token logits.
      cache: the prefilled cache, its rows already repeated ``K`` times.
      axes: ``decode_cache.batch_axes`` of ``cache``.
      prompt_history: ``[B, P]`` what each row decodes after (``EMPTY`` where none), for
        the logits controls.
      counted_prompt: ``[B]`` prompt tokens T5X's length counts (an LM's prompt; 0 for an
        encoder-decoder).
      params: a ``decoding.DecoderParams`` with ``num_beams > 1`` (or ``one_beam_search``).
      max_new_tokens: ``N``.
      stop: the stop strings' initial state ``[B * K, S]`` and their step function.

    Returns:
      NestedMap of ``tokens [B, K, N]`` (``pad_token_id`` after a hypothesis' end),
      ``lengths [B, K]``, ``log_probs [B, K, N]`` (each token's log-probability under the
      model, 0 after the end) and ``scores [B, K]`` (the rules' scores), best first.
    """
    search = _Search(params, max_new_tokens, first_logits.shape, prompt_history, stop)
    rules = (
        _HfRules(params, max_new_tokens)
        if search.hf
        else _T5xRules(params, max_new_tokens, counted_prompt)
    )
    k = search.k
    first = jnp.repeat(first_logits, k, axis=0)
    ids = jnp.zeros((first.shape[0],), jnp.int32)
    # Leaves no step writes (cross-attention keys and values) stay equal across a row's
    # beams: they are never reordered.
    shared = decode_cache.untouched_by(lambda c: step(c, ids, jnp.asarray(1)), cache)
    state = search.select(jnp.asarray(0, jnp.int32), first, search.initial_state(), rules)

    def cond(carry):
        i, _, state = carry
        return (i < max_new_tokens) & state.go_on

    def body(carry):
        i, cache, state = carry
        if k > 1:
            cache = decode_cache.gather_beams(cache, axes, state.parents, shared)
        ids = state.live_tokens[:, :, i - 1].reshape(-1)
        logits, cache = step(cache, ids, i)
        return i + 1, cache, search.select(i, logits, state, rules)

    steps, _, state = jax.lax.while_loop(cond, body, (jnp.asarray(1, jnp.int32), cache, state))
    return rules.outputs(state, steps)


class _Search:
    """One beam search's sizes and its step of selection (see :func:`beam_search`)."""

    def __init__(self, params: Any, n: int, shape: tuple[int, int], prompt_history, stop):
        self.params, self.n, self.stop = params, n, stop
        self.b, self.v = shape
        self.k, self.c = params.num_beams, num_candidates(params)
        self.hf = params.length_norm_alpha is None
        self.neg = HF_NEG if self.hf else T5X_NEG
        self.prompt_history = jnp.repeat(prompt_history, self.k, axis=0)  # [B * K, P]

    def initial_state(self) -> NestedMap:
        """Live beams ``[0, neg, ...]`` (only the first one's continuations count at the
        first step), no finished hypotheses."""
        b, k, n, neg = self.b, self.k, self.n, self.neg
        empty = jnp.full((b, k, n), processors.EMPTY, jnp.int32)
        state = NestedMap(
            live_scores=jnp.tile(jnp.asarray([0.0] + [neg] * (k - 1), jnp.float32), (b, 1)),
            live_tokens=empty,
            live_log_probs=jnp.zeros((b, k, n), jnp.float32),
            finished_scores=jnp.full((b, k), neg, jnp.float32),
            finished_tokens=empty,
            finished_log_probs=jnp.zeros((b, k, n), jnp.float32),
            finished_lengths=jnp.zeros((b, k), jnp.int32),
            finished=jnp.zeros((b, k), bool),
            open_rows=jnp.ones((b,), bool),  # transformers' is_early_stop_heuristic_unsatisfied
            parents=jnp.zeros((b, k), jnp.int32),
            go_on=jnp.asarray(True),
        )
        if self.stop is not None:
            state.stop_state = self.stop[0].reshape(b, k, -1)
        return state

    def candidates(self, i: jax.Array, logits: jax.Array, state: NestedMap) -> NestedMap:
        """The ``C`` best continuations ``[B, C, ...]``: summed scores, parents, tokens,
        sequences, per-token log-probs and which end (an EOS or a stop string)."""
        b, k, c, v = self.b, self.k, self.c, self.v
        log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B * K, V]
        generated = state.live_tokens.reshape(b * k, self.n)
        history = jnp.concatenate([self.prompt_history, generated], axis=1)
        scores = processors.process(log_probs, history, i, self.params).reshape(b, k, v)
        totals = (scores + state.live_scores[:, :, None]).reshape(b, k * v)
        sums, flat = jax.lax.top_k(totals, c)  # [B, C], best first
        parent, token = flat // v, flat % v
        raw = jnp.take_along_axis(log_probs.reshape(b, k * v), flat, axis=1)
        out = NestedMap(
            sums=sums,
            parents=parent,
            tokens=_gather(state.live_tokens, parent).at[:, :, i].set(token),
            log_probs=_gather(state.live_log_probs, parent).at[:, :, i].set(raw),
            ends=processors.is_eos(token, self.params.eos_token_id),
        )
        if self.stop is not None:
            before = _gather(state.stop_state, parent).reshape(b * c, -1)
            stop_state, hit = self.stop[1](before, token.reshape(b * c))
            out.ends = out.ends | hit.reshape(b, c)
            out.stop_state = stop_state.reshape(b, c, -1)
        return out

    def select(self, i: jax.Array, logits: jax.Array, state: NestedMap, rules) -> NestedMap:
        """One step: the next live beams and finished hypotheses after ``logits [B * K, V]``."""
        cand = self.candidates(i, logits, state)
        stopped = rules.stopped(cand.ends, i)
        live_sums = cand.sums + stopped * self.neg
        keep = _top(live_sums, self.k)
        new = NestedMap(
            live_scores=jnp.take_along_axis(live_sums, keep, axis=1),
            live_tokens=_gather(cand.tokens, keep),
            live_log_probs=_gather(cand.log_probs, keep),
            parents=jnp.take_along_axis(cand.parents, keep, axis=1),
        )
        if self.stop is not None:
            new.stop_state = _gather(cand.stop_state, keep)
        finishing = rules.finishing(cand.ends, stopped, cand.sums, i, state)  # [B, C]
        lengths = jnp.full((self.b, self.c), i + 1, jnp.int32)
        merged = NestedMap(
            finished_scores=jnp.concatenate([state.finished_scores, finishing.scores], 1),
            finished_tokens=jnp.concatenate([state.finished_tokens, cand.tokens], 1),
            finished_log_probs=jnp.concatenate([state.finished_log_probs, cand.log_probs], 1),
            finished_lengths=jnp.concatenate([state.finished_lengths, lengths], 1),
            finished=jnp.concatenate([state.finished, finishing.flags], 1),
        )
        best = _top(merged.finished_scores, self.k)
        new.update({name: _gather(x, best) for name, x in merged.items()})
        new.open_rows, new.go_on = rules.after_step(new, state.open_rows, stopped, i)
        return new


class _HfRules:
    """transformers' rules (see the module docstring)."""

    def __init__(self, params: Any, max_new_tokens: int):
        self.params, self.n = params, max_new_tokens
        self.penalty = 1.0 if params.length_penalty is None else params.length_penalty
        self.early_stopping = params.early_stopping or False

    def stopped(self, ends: jax.Array, i: jax.Array) -> jax.Array:
        """``[B, C]`` continuations that stop (an end, or the last step)."""
        return ends | (i == self.n - 1)

    def finishing(self, ends, stopped, sums, i, state) -> NestedMap:
        """Scores of the continuations that join the finished ones (very negative for
        the others) and their flags."""
        b, c = sums.shape
        k = self.params.num_beams
        top_k = (jnp.arange(c) < k)[None, :]
        flags = stopped & top_k
        scores = sums / ((i + 1).astype(jnp.float32) ** self.penalty)
        full = jnp.all(state.finished, axis=1, keepdims=True) & (self.early_stopping is True)
        scores = scores + full * HF_NEG
        scores = scores + (~state.open_rows[:, None]) * HF_NEG
        scores = scores + (~flags) * HF_NEG
        return NestedMap(scores=scores, flags=flags)

    def after_step(self, new, open_rows, stopped, i) -> tuple[jax.Array, jax.Array]:
        """transformers' ``_check_early_stop_heuristic`` and whether the loop goes on."""
        if self.early_stopping == "never" and self.penalty > 0.0:
            best_length = float(self.n)
        else:
            best_length = (i + 1).astype(jnp.float32)
        best_possible = new.live_scores[:, :1] / best_length**self.penalty
        worst = jnp.where(new.finished, jnp.min(new.finished_scores, axis=1, keepdims=True), HF_NEG)
        open_rows = open_rows & jnp.any(best_possible > worst, axis=1)
        all_full = jnp.all(new.finished) & (self.early_stopping is True)
        go_on = jnp.any(open_rows) & ~all_full & ~jnp.all(stopped)
        return open_rows, go_on

    def outputs(self, state: NestedMap, steps: jax.Array) -> NestedMap:
        del steps
        return _outputs(
            self.params,
            state.finished_tokens,
            state.finished_lengths,
            state.finished_log_probs,
            state.finished_scores,
        )


class _T5xRules:
    """T5X's rules (see the module docstring)."""

    def __init__(self, params: Any, max_new_tokens: int, counted_prompt: jax.Array):
        self.params, self.n = params, max_new_tokens
        self.alpha = params.length_norm_alpha
        self.counted = counted_prompt.astype(jnp.float32)[:, None]  # [B, 1]
        # T5X's decode length: the new tokens plus a dummy first one (plus an LM's prompt).
        self.bound = brevity_penalty(self.alpha, jnp.max(counted_prompt) + max_new_tokens + 1.0)

    def stopped(self, ends: jax.Array, i: jax.Array) -> jax.Array:
        del i
        return ends

    def finishing(self, ends, stopped, sums, i, state) -> NestedMap:
        del stopped, state
        lengths = self.counted + (i + 1).astype(jnp.float32)
        scores = sums / brevity_penalty(self.alpha, lengths) + (~ends) * T5X_NEG
        return NestedMap(scores=scores, flags=ends)

    def after_step(self, new, open_rows, stopped, i) -> tuple[jax.Array, jax.Array]:
        del stopped, i
        best_live = new.live_scores[:, :1] / self.bound
        worst = jnp.where(
            new.finished, jnp.min(new.finished_scores, axis=1, keepdims=True), T5X_NEG
        )
        done = jnp.all(worst > best_live)
        return open_rows, ~done

    def outputs(self, state: NestedMap, steps: jax.Array) -> NestedMap:
        any_finished = jnp.any(state.finished, axis=1)  # [B]
        pick = lambda done, live: jnp.where(
            any_finished.reshape((-1,) + (1,) * (done.ndim - 1)), done, live
        )
        live_lengths = jnp.full(state.live_scores.shape, steps, jnp.int32)
        return _outputs(
            self.params,
            pick(state.finished_tokens, state.live_tokens),
            pick(state.finished_lengths, live_lengths),
            pick(state.finished_log_probs, state.live_log_probs),
            pick(state.finished_scores, state.live_scores),
        )


def _outputs(params: Any, tokens, lengths, log_probs, scores) -> NestedMap:
    """The hypotheses with pads after each one's end and zero log-probs there."""
    slots = jnp.arange(tokens.shape[-1])
    after = slots[None, None, :] >= lengths[:, :, None]
    return NestedMap(
        tokens=jnp.where(after | (tokens == processors.EMPTY), params.pad_token_id, tokens),
        lengths=lengths,
        log_probs=jnp.where(after, 0.0, log_probs),
        scores=scores,
    )
