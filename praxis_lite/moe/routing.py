"""Routing tokens to experts: GShard's top-2 with groups and a capacity, and dropless top-k.

Shapes: ``G`` groups, ``S`` tokens a group, ``E`` experts, ``C`` capacity (tokens an expert
takes from one group), ``N`` tokens, ``k`` experts a token.

* :func:`top2_gating`: praxis 1.4.0's ``gshard_utils.top2_gating_on_logits`` as paxml's MoE
  configs call it (``legacy_mtf_behavior=True``, ``mask_dtype=int32``, no importance): the
  gates are renormalised over the two choices before overflow is dropped; first choices
  take an expert's capacity before second choices, each in token order; GShard's
  load-balancing loss ``E^2 * mean_e(mean_s(gates_e) * mean_s(first choice is e))``.
* :func:`top_k_routing`: every token keeps its ``k`` best experts, none dropped, with the
  weights the Hugging Face families use (:class:`TopKWeights`).
* :func:`load_balancing_loss` (Switch Transformer's, as Mixtral computes it) and
  :func:`router_z_loss` (ST-MoE's) for dropless routing.

Routing is computed in float32 whatever the compute dtype.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import jax.numpy as jnp


class SecondExpertPolicy(enum.Enum):
    """How GShard's top-2 picks a token's second expert (praxis' ``second_expert_policy``).

    ALL: the second-best expert, always (deterministic).
    RANDOM: the second-best, kept with probability ``gate_2 / threshold`` (praxis' threshold
      is 0 for its MoE layer: a second choice with any weight is kept).
    SAMPLING: sampled from the softmax over the experts other than the first (Gumbel noise).
    """

    ALL = "all"
    RANDOM = "random"
    SAMPLING = "sampling"


class TopKWeights(enum.Enum):
    """The weights of a token's ``k`` chosen experts in dropless routing.

    SOFTMAX: the softmax over all experts, taken at the chosen ones (Qwen2-MoE and
      Qwen3-MoE with ``norm_topk_prob=False``): they sum to less than 1.
    RENORMALIZED: those renormalised to sum to 1 (Qwen with ``norm_topk_prob=True``); this is
      the same as Mixtral's softmax over the chosen experts' logits only.
    """

    SOFTMAX = "softmax"
    RENORMALIZED = "renormalized"


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float, given: int) -> int:
    """praxis' capacity rule: ``given``, raised to ``int(S * factor / E)`` when that is more,
    and then (only when raised) rounded up to a multiple of 4. It can be 0 (no token fits):
    the layer refuses that."""
    auto = int(group_size * capacity_factor / num_experts) if capacity_factor else 0
    return ((auto + 3) // 4) * 4 if given < auto else given


def capped(logits: jax.Array, cap: float) -> jax.Array:
    """``cap * tanh(logits / cap)`` (praxis' ``gating_logit_cap``); ``logits`` when ``cap`` is 0."""
    if cap <= 0:
        return logits
    return cap * jnp.tanh(logits / cap)


class Top2Gating(NamedTuple):
    """GShard's top-2 routing of ``G`` groups of ``S`` tokens.

    Attributes:
      combine: ``[G, S, E, C]`` float32: token ``s``'s weight for slot ``c`` of expert ``e``.
      dispatch: ``[G, S, E, C]`` bool: the slots tokens go to (``combine != 0``).
      aux_loss: GShard's load-balancing loss (scalar, unweighted).
      dispatched: ``[3]`` fractions of the non-padding tokens sent to 0, 1 and 2 experts.
      over_capacity: ``[2]`` fractions of first and second choices dropped for capacity.
    """

    combine: jax.Array
    dispatch: jax.Array
    aux_loss: jax.Array
    dispatched: jax.Array
    over_capacity: jax.Array


def top2_gating(
    logits: jax.Array,
    paddings: jax.Array | None,
    capacity: int,
    policy: SecondExpertPolicy = SecondExpertPolicy.ALL,
    key: jax.Array | None = None,
    logit_cap: float = 0.0,
) -> Top2Gating:
    """GShard's top-2 gating (see the module docstring).

    Args:
      logits: ``[G, S, E]`` router logits.
      paddings: ``[G, S]``, 1.0 at padding tokens (routed nowhere, taking no capacity).
      capacity: ``C`` (see :func:`expert_capacity`).
      policy: how the second expert is chosen; RANDOM and SAMPLING need ``key``.
      key: a PRNG key for RANDOM or SAMPLING.
      logit_cap: > 0: logits soft-capped to ``cap * tanh(logits / cap)`` first.
    """
    logits = capped(logits.astype(jnp.float32), logit_cap)
    num_experts = logits.shape[-1]
    gates = jax.nn.softmax(logits, axis=-1)
    live = jnp.ones(logits.shape[:2], jnp.float32) if paddings is None else 1.0 - paddings
    first = jax.nn.one_hot(jnp.argmax(gates, axis=-1), num_experts, dtype=jnp.int32)
    first = first * live[..., None].astype(jnp.int32)
    gate_1 = jnp.sum(gates * first, axis=-1)
    others = gates * (1 - first)
    second_choice = _second_choice(logits, others, first, policy, key)
    second = jax.nn.one_hot(second_choice, num_experts, dtype=jnp.int32)
    second = second * (live > 0)[..., None].astype(jnp.int32)
    gate_2 = jnp.sum(others * second, axis=-1)
    denom = gate_1 + gate_2 + 1e-9
    gate_1, gate_2 = gate_1 / denom, gate_2 / denom

    density = jnp.mean(first.astype(jnp.float32), axis=-2)
    density_proxy = jnp.mean(gates * live[..., None], axis=-2)
    aux_loss = jnp.mean(density_proxy * density) * num_experts**2

    slot_1 = _exclusive_cumsum(first)
    kept_1 = first * (slot_1 < capacity)
    if policy is SecondExpertPolicy.RANDOM:
        sampled = jax.random.uniform(jax.random.split(key)[1], gate_2.shape) < gate_2 / 1e-9
        gate_2 = gate_2 * sampled
        second = second * sampled[..., None].astype(jnp.int32)
    slot_2 = _exclusive_cumsum(second) + jnp.sum(kept_1, axis=-2, keepdims=True)
    kept_2 = second * (slot_2 < capacity)
    over_capacity = jnp.stack([_dropped(first, kept_1), _dropped(second, kept_2)])

    combine = _combine_part(gate_1, kept_1, slot_1, capacity) + _combine_part(
        gate_2, kept_2, slot_2, capacity
    )
    dispatch = combine != 0
    routes = jnp.sum(dispatch, axis=(-2, -1))
    counts = jnp.stack([jnp.sum(routes == n) for n in range(3)]).astype(jnp.float32)
    counts = counts.at[0].add(-jnp.sum(1.0 - live))
    return Top2Gating(combine, dispatch, aux_loss, counts / jnp.sum(counts), over_capacity)


def _second_choice(
    logits: jax.Array,
    others: jax.Array,
    first: jax.Array,
    policy: SecondExpertPolicy,
    key: jax.Array | None,
) -> jax.Array:
    """``[G, S]`` the second expert: the best of ``others``, or Gumbel-sampled (SAMPLING)."""
    if policy is not SecondExpertPolicy.SAMPLING:
        return jnp.argmax(others, axis=-1)
    noise = jax.random.uniform(jax.random.split(key)[1], logits.shape, logits.dtype)
    very_negative = -0.7 * jnp.finfo(logits.dtype).max
    masked = jnp.where(first > 0, very_negative, logits)
    return jnp.argmax(masked - jnp.log(-jnp.log(noise)), axis=-1)


def _exclusive_cumsum(mask: jax.Array) -> jax.Array:
    """``[G, S, E]``: how many earlier tokens of the group chose each expert (slot index)."""
    return jnp.cumsum(mask, axis=-2) - mask


def _dropped(chosen: jax.Array, kept: jax.Array) -> jax.Array:
    """The fraction of ``chosen`` routes (``[G, S, E]`` 0/1) not ``kept`` (0 when none)."""
    total = jnp.sum(chosen).astype(jnp.float32)
    return jnp.where(total > 0, 1.0 - jnp.sum(kept) / jnp.maximum(total, 1.0), 0.0)


def _combine_part(gate: jax.Array, kept: jax.Array, slot: jax.Array, capacity: int) -> jax.Array:
    """``[G, S, E, C]``: ``gate`` at each kept route's expert and slot."""
    weight = gate * jnp.sum(kept, axis=-1)  # [G, S]: 0 where the route was dropped.
    position = jnp.sum(slot * kept, axis=-1)
    slots = jax.nn.one_hot(position, capacity, dtype=jnp.float32)
    return jnp.einsum("gse,gsc->gsec", weight[..., None] * kept, slots)


class TopKRouting(NamedTuple):
    """Each token's chosen experts.

    Attributes:
      experts: ``[N, k]`` int32 expert ids, best first.
      weights: ``[N, k]`` float32 weights (:class:`TopKWeights`).
    """

    experts: jax.Array
    weights: jax.Array


def top_k_routing(logits: jax.Array, k: int, weights: TopKWeights) -> TopKRouting:
    """A token's ``k`` largest logits ``[N, E]`` and their weights (see :class:`TopKWeights`)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, experts = jax.lax.top_k(probs, k)
    if weights is TopKWeights.RENORMALIZED:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return TopKRouting(experts.astype(jnp.int32), top)


def load_balancing_loss(logits: jax.Array, experts: jax.Array, live: jax.Array) -> jax.Array:
    """Switch Transformer's load-balancing loss as Mixtral computes it, over live tokens:
    ``E * sum_e f_e * P_e``, ``f_e`` = the share of (token, choice) routes to ``e`` summed
    over the ``k`` choices, ``P_e`` = the mean router probability of ``e``.

    Args:
      logits: ``[N, E]``; experts: ``[N, k]``; live: ``[N]`` 1.0 for tokens counted.
    """
    num_experts = logits.shape[-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    count = jnp.maximum(jnp.sum(live), 1.0)
    routes = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32), axis=1)
    share = jnp.sum(routes * live[:, None], axis=0) / count
    mean_prob = jnp.sum(probs * live[:, None], axis=0) / count
    return num_experts * jnp.sum(share * mean_prob)


def router_z_loss(logits: jax.Array, live: jax.Array) -> jax.Array:
    """ST-MoE's router z-loss: the mean over live tokens of ``logsumexp(logits)^2``.

    Args:
      logits: ``[N, E]``; live: ``[N]`` 1.0 for tokens counted.
    """
    z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return jnp.sum(z**2 * live) / jnp.maximum(jnp.sum(live), 1.0)
