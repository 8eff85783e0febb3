"""MoeFeedForward: a mixture-of-experts feed-forward, a drop-in ``tr_fflayer_tpl`` of a block.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``F`` an expert's hidden dims, ``E``
experts, ``N = B T`` tokens, ``G`` groups of ``S = N / G`` tokens, ``C`` capacity.

``y = x + dropout(moe(norm(x)))`` (zero at padding tokens, as praxis'), where ``moe`` routes
each token to ``k`` of ``E`` expert feed-forwards and sums their outputs weighted by the
router, plus, optionally, an always-on shared expert (Qwen2-MoE's, behind a sigmoid gate).
The router is a ``[D, E]`` matrix whose logits are computed in float32. Two dispatch modes
(:class:`Dispatch`), chosen by one field:

* CAPACITY: praxis 1.4.0's ``TransformerFeedForwardMoe`` with ``gating_func='top2'``: the
  ``N`` tokens in ``num_groups`` groups, GShard's top-2 gating (``routing.top2_gating``),
  each expert taking at most ``C`` tokens of a group (the rest dropped: the residual
  carries them), dispatch and combine as einsums over ``[G, S, E, C]``. Its weights are
  praxis' (``gate``, ``wi_0``, ``wi_gate_0``, ``wo_0``), so Pax checkpoints load as they
  are, and the same for a dropless layer.
* DROPLESS: every token to its top ``k`` experts (``routing.top_k_routing``), the routes
  sorted by expert and run as grouped matmuls (``dispatch.grouped_ffn``).

Auxiliary losses are added with their weights through ``add_aux_loss`` (the train step adds
them to the objective) and reported with ``add_summary``: CAPACITY: GShard's
``aux_moe_load_balance_loss``; DROPLESS: Switch/Mixtral's ``load_balancing_loss`` and
ST-MoE's ``router_z_loss`` when their weights are set.
"""

from __future__ import annotations

import enum
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from praxis_lite.base_layer import BaseLayer, DType, Initializer
from praxis_lite.config import LayerTpl, template_field
from praxis_lite.flops import MoeFfn
from praxis_lite.layers.activations import ReLU
from praxis_lite.layers.normalizations import LayerNorm
from praxis_lite.moe import dispatch as dispatch_lib
from praxis_lite.moe import routing
from praxis_lite.moe.routing import SecondExpertPolicy, TopKWeights
from praxis_lite.sharding import ACTIVATION_EMBED, BATCH, EMBED, EXPERT, LENGTH, MLP


class Dispatch(enum.Enum):
    """How tokens reach their experts (see the module docstring)."""

    CAPACITY = "capacity"
    DROPLESS = "dropless"


#: praxis' gating functions paxlite does not implement, with what to use instead.
UNSUPPORTED_GATING = {
    "dense_top2": "praxis' experimental decoding gate",
    "expert_choice": "experts choosing tokens",
    "expert_choice_v2": "experts choosing tokens",
}


def _fan_in_uniform(fan_in: int) -> Initializer:
    """praxis' MoE init: uniform in ``+-sqrt(3 / fan_in)`` (variance ``1 / fan_in``)."""
    bound = math.sqrt(3.0 / fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: DType = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class MoeFeedForward(BaseLayer):
    """Pre-norm mixture-of-experts feed-forward with a residual: ``[B, T, D] -> [B, T, D]``.

    Attributes:
      input_dims: ``D``.
      hidden_dims: ``F`` of each expert.
      num_experts: ``E``.
      num_experts_per_token: ``k`` (CAPACITY: 2, GShard's top-2).
      dispatch: CAPACITY or DROPLESS (see the module docstring).
      gating_func: praxis' name of the gate; 'top2' (the others are refused in one line).
      num_groups: ``G``, groups routed independently (Pax sets the data-parallel
        size: each device routes its own tokens). Must divide the tokens.
      min_group_size: CAPACITY: fewer groups when a group would have fewer tokens (praxis').
      capacity_factor: CAPACITY: praxis' ``unadjusted_expert_capacity_factor``.
      expert_capacity: CAPACITY: praxis' ``expert_capacity_dim``; the capacity is
        ``routing.expert_capacity`` of the two.
      second_expert_policy: CAPACITY: see ``routing.SecondExpertPolicy``.
      gating_logit_cap: > 0 soft-caps the router logits (praxis'): ``cap tanh(x / cap)``.
      top_k_weights: DROPLESS: the chosen experts' weights (``routing.TopKWeights``).
      use_gated_activation: ``act(x wi_gate) * (x wi)`` (SwiGLU with SiLU) instead of ``act(x wi)``.
      activation_tpl: the experts' activation.
      ln_tpl: the pre-norm (given ``input_dims``).
      relu_dropout_prob: dropout after the activation.
      residual_dropout_prob: dropout on the branch before the residual add.
      load_balance_loss_weight: the load-balancing loss's weight (CAPACITY: GShard's, praxis'
        ``moe_load_balance_loss_weight``; DROPLESS: Switch's, 0 for none).
      router_z_loss_weight: ST-MoE's router z-loss weight (0: none).
      shared_expert_dims: hidden dims of an always-on shared expert (gated like the
        experts); 0: none.
      shared_expert_gate: the shared expert's output times ``sigmoid(x w_gate)``,
        ``w_gate [D, 1]`` (Qwen2-MoE).
      input_jitter: ``j`` > 0 multiplies the normed input of the router and the experts by
        noise uniform in ``[1 - j, 1 + j]`` in training (Mixtral's ``router_jitter_noise``;
        needs the 'dropout' RNG); 0: none.
      platform: the platform the program runs on ('cpu', 'tpu', 'gpu'), which picks how
        dropless experts run (``dispatch.grouped_matmul_kind``); None: this process's
        default backend (the trainer sets its mesh's devices' platform).
    """

    input_dims: int
    hidden_dims: int
    num_experts: int
    num_experts_per_token: int = 2
    dispatch: Dispatch = Dispatch.CAPACITY
    gating_func: str = "top2"
    num_groups: int = 1
    min_group_size: int | None = None
    capacity_factor: float = 2.0
    expert_capacity: int = 0
    second_expert_policy: SecondExpertPolicy = SecondExpertPolicy.ALL
    gating_logit_cap: float = 0.0
    top_k_weights: TopKWeights = TopKWeights.RENORMALIZED
    use_gated_activation: bool = False
    activation_tpl: LayerTpl = template_field(ReLU)
    ln_tpl: LayerTpl = template_field(LayerNorm)
    relu_dropout_prob: float = 0.0
    residual_dropout_prob: float = 0.0
    load_balance_loss_weight: float = 1.0
    router_z_loss_weight: float = 0.0
    shared_expert_dims: int = 0
    shared_expert_gate: bool = False
    input_jitter: float = 0.0
    platform: str | None = None

    def setup(self) -> None:
        self.check()
        self.layer_norm = self.create_child(self.ln_tpl, input_dims=self.input_dims)
        self.activation = self.create_child(self.activation_tpl)
        self.relu_dropout = nn.Dropout(self.relu_dropout_prob)
        self.residual_dropout = nn.Dropout(self.residual_dropout_prob)
        d = self.input_dims
        self.router = self.create_variable(
            "gate", (d, self.num_experts), (EMBED, None), _fan_in_uniform(d)
        )
        self.wi, self.wi_gate, self.wo = self._expert_weights()
        self.shared = self._shared_expert_weights()

    def check(self) -> None:
        """Refuses settings paxlite does not run, each in one line naming the fix.

        Raises:
          ValueError: an unsupported gate, ``k`` out of range, or too few groups.
        """
        e, k = self.num_experts, self.num_experts_per_token
        if self.gating_func != "top2":
            what = UNSUPPORTED_GATING.get(self.gating_func, "unknown")
            raise ValueError(
                f"MoE gating_func={self.gating_func!r} ({what}) is not implemented in paxlite; "
                "use 'top2' (GShard's, with capacity) or dropless top-k dispatch "
                "(MOE_DISPATCH=dropless)."
            )
        if not 1 <= k <= e:
            raise ValueError(
                f"MoE num_experts_per_token={k} must be between 1 and num_experts={e}."
            )
        if self.dispatch is Dispatch.CAPACITY and k != 2:
            raise ValueError(
                f"MoE capacity dispatch is GShard's top-2: num_experts_per_token={k} needs "
                "dispatch=DROPLESS (or set it to 2)."
            )
        if self.num_groups < 1:
            raise ValueError(f"MoE num_groups={self.num_groups} must be at least 1.")

    def active_ffn(self) -> MoeFfn:
        """What one token multiplies: ``k`` experts, the router and the shared expert."""
        projections = 3 if self.use_gated_activation else 2
        d = self.input_dims
        per_expert = projections * d * self.hidden_dims
        shared = projections * d * self.shared_expert_dims + (d if self.shared_expert_gate else 0)
        k = self.num_experts_per_token
        return MoeFfn(
            active_params=k * per_expert + d * self.num_experts + shared,
            total_params=self.num_experts * per_expert + d * self.num_experts + shared,
            note=f"E={self.num_experts} top-{k} F={self.hidden_dims} {self.dispatch.value}",
        )

    def _expert_weights(self) -> tuple[jax.Array, jax.Array | None, jax.Array]:
        """``wi [E, D, F]``, ``wi_gate [E, D, F]`` (gated only) and ``wo [E, F, D]``."""
        e, d, f = self.num_experts, self.input_dims, self.hidden_dims
        wi_axes, wo_axes = (EXPERT, EMBED, MLP), (EXPERT, MLP, EMBED)
        wi = self.create_variable("wi_0", (e, d, f), wi_axes, _fan_in_uniform(d))
        gate = None
        if self.use_gated_activation:
            gate = self.create_variable("wi_gate_0", (e, d, f), wi_axes, _fan_in_uniform(d))
        wo = self.create_variable("wo_0", (e, f, d), wo_axes, _fan_in_uniform(f))
        return wi, gate, wo

    def _shared_expert_weights(self) -> dict[str, jax.Array]:
        """The shared expert's ``wi [D, Fs]``, ``wi_gate`` (gated), ``wo [Fs, D]`` and
        ``gate [D, 1]`` (with ``shared_expert_gate``); empty without one."""
        d, f = self.input_dims, self.shared_expert_dims
        if not f:
            return {}
        shared = {
            "wi": self.create_variable("shared_wi_0", (d, f), (EMBED, MLP), _fan_in_uniform(d))
        }
        if self.use_gated_activation:
            shared["wi_gate"] = self.create_variable(
                "shared_wi_gate_0", (d, f), (EMBED, MLP), _fan_in_uniform(d)
            )
        shared["wo"] = self.create_variable("shared_wo_0", (f, d), (MLP, EMBED), _fan_in_uniform(f))
        if self.shared_expert_gate:
            shared["gate"] = self.create_variable(
                "shared_gate", (d, 1), (EMBED, None), _fan_in_uniform(d)
            )
        return shared

    def _router_logits(self, x: jax.Array) -> jax.Array:
        """``[..., D] -> [..., E]`` float32 logits."""
        return jnp.einsum("...m,me->...e", x, self.router).astype(jnp.float32)

    def _hidden(self, h: jax.Array, h_gate: jax.Array | None, train: bool) -> jax.Array:
        """The experts' activation: ``act(h)``, or gated ``act(h_gate) * h``; then dropout."""
        h = self.activation(h) if h_gate is None else self.activation(h_gate) * h
        return self.relu_dropout(h, deterministic=not train)

    def __call__(
        self, x: jax.Array, *, paddings: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        """``x [B, T, D]``, ``paddings [B, T]`` (1.0 at padding: routed nowhere, output 0 there)
        -> ``[B, T, D]``; ``train`` enables the dropouts (and needs the 'dropout' RNG for a
        random second expert)."""
        x = self.to_fprop(x)
        h = self.constrain(self.layer_norm(x), (BATCH, LENGTH, ACTIVATION_EMBED))
        if train and self.input_jitter:
            j = self.input_jitter
            h = h * jax.random.uniform(self.make_rng("dropout"), h.shape, h.dtype, 1 - j, 1 + j)
        if self.dispatch is Dispatch.CAPACITY:
            out = self._capacity(h, paddings, train)
        else:
            out = self._dropless(h, paddings, train)
        out = out + self._shared_expert(h, train)
        if paddings is not None:
            out = out * (1.0 - paddings[..., None]).astype(out.dtype)
        out = checkpoint_name(self.constrain(out, (BATCH, LENGTH, ACTIVATION_EMBED)), "ffn2")
        out = self.residual_dropout(out, deterministic=not train)
        return self.constrain(x + out, (BATCH, LENGTH, ACTIVATION_EMBED))

    def extend(self, x: jax.Array, *, paddings: jax.Array | None = None) -> jax.Array:
        """Incremental decoding (``Transformer.extend``): ``[B, T, D] -> [B, T, D]``.

        Every token goes to its top ``k`` experts, nothing dropped, in both modes: a decode
        step's few tokens would give capacity routing groups of a few tokens and no slots
        (praxis decodes such layers with its ``dense_top2`` gate, top-2 without capacity:
        the same routing).
        """
        x = self.to_fprop(x)
        h = self.layer_norm(x)
        weights = self.top_k_weights
        if self.dispatch is Dispatch.CAPACITY:  # GShard's gates, renormalised over the two
            weights = TopKWeights.RENORMALIZED
        groups = math.gcd(self.num_groups, math.prod(h.shape[:-1]))  # Dropless: any works.
        out = self._dropless(h, paddings, False, weights, groups)
        out = out + self._shared_expert(h, False)
        if paddings is not None:
            out = out * (1.0 - paddings[..., None]).astype(out.dtype)
        return x + out

    def _groups(self, num_tokens: int) -> int:
        """``G`` for ``num_tokens`` (praxis' ``min_group_size`` rule).

        Raises:
          ValueError: the groups do not divide the tokens.
        """
        groups = self.num_groups
        if self.min_group_size and num_tokens / groups < self.min_group_size:
            groups = math.ceil(num_tokens / self.min_group_size)
        if num_tokens % groups:
            raise ValueError(
                f"MoE num_groups={groups} does not divide the {num_tokens} tokens of a batch "
                "(batch x length); set NUM_GROUPS to a divisor of it."
            )
        return groups

    def _capacity(self, h: jax.Array, paddings: jax.Array | None, train: bool) -> jax.Array:
        """GShard's top-2 with groups and a capacity: ``[B, T, D] -> [B, T, D]``."""
        shape, d = h.shape[:-1], h.shape[-1]
        num_tokens = math.prod(shape)
        groups = self._groups(num_tokens)
        g_size = num_tokens // groups
        capacity = routing.expert_capacity(
            g_size, self.num_experts, self.capacity_factor, self.expert_capacity
        )
        if capacity < 1:
            raise ValueError(
                f"MoE expert capacity rounds to 0 (groups of {g_size} tokens x capacity factor "
                f"{self.capacity_factor} / {self.num_experts} experts); raise the capacity "
                "factor or the group size (fewer NUM_GROUPS, a larger batch)."
            )
        xg = self.constrain(h.reshape(groups, g_size, d), (BATCH, None, ACTIVATION_EMBED))
        pg = None if paddings is None else paddings.reshape(groups, g_size).astype(jnp.float32)
        key = None
        if self.second_expert_policy is not SecondExpertPolicy.ALL:
            key = self.make_rng("dropout") if train else jax.random.key(0)
        logits = self._router_logits(xg)
        if self.router_z_loss_weight:
            live = jnp.ones(xg.shape[:2], jnp.float32) if pg is None else 1.0 - pg
            e = self.num_experts
            capped = routing.capped(logits, self.gating_logit_cap)
            self._record_z_loss(capped.reshape(-1, e), live.reshape(-1))
        gating = routing.top2_gating(
            logits,
            pg,
            capacity,
            self.second_expert_policy,
            key,
            self.gating_logit_cap,
        )
        self._record_gating(gating)
        dispatch = gating.dispatch.astype(h.dtype)
        expert_in = jnp.einsum("gsec,gsm->egcm", dispatch, xg)
        expert_in = self.constrain(expert_in, (EXPERT, BATCH, None, ACTIVATION_EMBED))
        wi, wi_gate, wo = self.wi, self.wi_gate, self.wo
        hidden = jnp.einsum("egcm,emh->egch", expert_in, wi)
        hidden_gate = None
        if wi_gate is not None:
            hidden_gate = jnp.einsum("egcm,emh->egch", expert_in, wi_gate)
        hidden = self.constrain(
            self._hidden(hidden, hidden_gate, train), (EXPERT, BATCH, None, MLP)
        )
        expert_out = jnp.einsum("egch,ehm->egcm", hidden, wo)
        expert_out = self.constrain(expert_out, (EXPERT, BATCH, None, ACTIVATION_EMBED))
        out = jnp.einsum("egcm,gsec->gsm", expert_out, gating.combine.astype(h.dtype))
        out = self.constrain(out, (BATCH, None, ACTIVATION_EMBED))
        return out.reshape(*shape, d)

    def _record_gating(self, gating: routing.Top2Gating) -> None:
        """GShard's weighted aux loss, and praxis' routing summaries."""
        aux = gating.aux_loss * self.load_balance_loss_weight
        self.add_summary("aux_moe_load_balance_loss", aux)
        self.add_aux_loss("aux_moe_load_balance_loss", aux)
        for n in range(3):
            self.add_summary(f"dispatch_{n}", gating.dispatched[n])
        self.add_summary("over_capacity_1_ratio", gating.over_capacity[0])
        self.add_summary("over_capacity_2_ratio", gating.over_capacity[1])

    def _dropless(
        self,
        h: jax.Array,
        paddings: jax.Array | None,
        train: bool,
        weights: TopKWeights | None = None,
        groups: int | None = None,
    ) -> jax.Array:
        """Every token to its top ``k`` experts, as grouped matmuls: ``[B, T, D] -> [B, T, D]``;
        ``weights``: the chosen experts' (None: ``top_k_weights``); ``groups``: how the
        tokens are split for routing (None: ``num_groups``'s rule; the result is the same)."""
        shape, d = h.shape[:-1], h.shape[-1]
        num_tokens = math.prod(shape)
        groups = groups or self._groups(num_tokens)
        tokens = self.constrain(h.reshape(groups, -1, d), (BATCH, None, ACTIVATION_EMBED))
        logits = routing.capped(self._router_logits(tokens), self.gating_logit_cap)
        chosen = routing.top_k_routing(
            logits, self.num_experts_per_token, weights or self.top_k_weights
        )
        live = jnp.ones(tokens.shape[:2], jnp.float32)
        if paddings is not None:
            live = 1.0 - paddings.reshape(tokens.shape[:2]).astype(jnp.float32)
        e, k = self.num_experts, self.num_experts_per_token
        flat = (logits.reshape(-1, e), chosen.experts.reshape(-1, k), live.reshape(-1))
        self._record_dropless_losses(*flat)
        routed = dispatch_lib.route(chosen.experts, self.num_experts, self.platform)
        rows = dispatch_lib.gather_rows(tokens, routed)
        hidden = dispatch_lib.project(rows, self.wi, routed)
        hidden_gate = None
        if self.wi_gate is not None:
            hidden_gate = dispatch_lib.project(rows, self.wi_gate, routed)
        hidden = self._hidden(hidden, hidden_gate, train)
        per_route = dispatch_lib.route_outputs(
            dispatch_lib.project(hidden, self.wo, routed), routed, groups
        )
        per_route = per_route.reshape(groups, -1, self.num_experts_per_token, d)
        out = jnp.einsum("gskd,gsk->gsd", per_route, chosen.weights.astype(per_route.dtype))
        out = self.constrain(out, (BATCH, None, ACTIVATION_EMBED))
        return out.reshape(*shape, d)

    def _record_dropless_losses(
        self, logits: jax.Array, experts: jax.Array, live: jax.Array
    ) -> None:
        """Switch's load-balancing loss and the router z-loss, where their weights are set."""
        if self.load_balance_loss_weight:
            loss = routing.load_balancing_loss(logits, experts, live)
            loss = loss * self.load_balance_loss_weight
            self.add_summary("load_balancing_loss", loss)
            self.add_aux_loss("load_balancing_loss", loss)
        self._record_z_loss(logits, live)

    def _record_z_loss(self, logits: jax.Array, live: jax.Array) -> None:
        """ST-MoE's router z-loss of ``logits [N, E]`` over ``live [N]``, where its weight is
        set."""
        if self.router_z_loss_weight:
            loss = routing.router_z_loss(logits, live) * self.router_z_loss_weight
            self.add_summary("router_z_loss", loss)
            self.add_aux_loss("router_z_loss", loss)

    def _shared_expert(self, h: jax.Array, train: bool) -> jax.Array | float:
        """The always-on expert's output ``[B, T, D]`` (0.0 without one)."""
        if not self.shared:
            return 0.0
        hidden = jnp.einsum("...m,mh->...h", h, self.shared["wi"])
        hidden_gate = None
        if "wi_gate" in self.shared:
            hidden_gate = jnp.einsum("...m,mh->...h", h, self.shared["wi_gate"])
        hidden = self._hidden(hidden, hidden_gate, train)
        out = jnp.einsum("...h,hm->...m", hidden, self.shared["wo"])
        if "gate" in self.shared:
            out = out * jax.nn.sigmoid(jnp.einsum("...m,mo->...o", h, self.shared["gate"]))
        return out
