"""Mixture-of-experts knobs (Pax's names where Pax has them), and the stack built from them.

``MoeKnobs`` is a knob group (see ``tasks.lm.knob_groups``): the decoder-only LM's
``TransformerLmKnobs`` applies :meth:`MoeKnobs.with_experts` to its stack, which turns the
MoE layers' feed-forwards into ``praxis_lite.moe.MoeFeedForward``.
"""

from __future__ import annotations

import copy

from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from praxis_lite import config as config_lib
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.moe import Dispatch, MoeFeedForward, SecondExpertPolicy, TopKWeights
from praxis_lite.sharding import EXPERT
from tasks.lm.knob_groups import knob_group
from tasks.lm.model_params import Activation


@knob_group
class MoeKnobs(BaseExperiment):
    """Mixture-of-experts feed-forwards (off while NUM_EXPERTS is 0).

    Pax's (praxis' ``StackedTransformer`` and ``TransformerFeedForwardMoe``): NUM_EXPERTS,
    NUM_GROUPS (routing groups: each routes its tokens on its own; Pax sets the
    data-parallel size, so each device routes its own tokens; dropless routing gives the
    same result for any NUM_GROUPS), MIN_GROUP_SIZE,
    MOE_LAYERS (the layers that are MoE; empty: every layer), GATING_FUNC ('top2'),
    EXPERT_CAPACITY_FACTOR (praxis' ``unadjusted_expert_capacity_factor``, 2.0),
    EXPERT_CAPACITY (praxis' ``expert_capacity_dim``, 0), SECOND_EXPERT_POLICY ('all',
    'random', 'sampling'), MOE_LOAD_BALANCE_LOSS_WEIGHT (1.0), GATING_LOGIT_CAP (0: none),
    and praxis' defaults for the experts themselves: MOE_ACTIVATION_CLS (ReLU) and
    MOE_GATED_ACTIVATION (False), whatever the dense layers use.
    paxlite's: MOE_DISPATCH ('capacity': GShard's, Pax's; 'dropless': top-k, nothing
    dropped), NUM_EXPERTS_PER_TOKEN (2; dropless: any k), MOE_EVERY_N (every n-th layer is
    MoE: layers n-1, 2n-1, ...; Qwen's ``decoder_sparse_step``), MOE_HIDDEN_DIMS (an
    expert's hidden dims; None: HIDDEN_DIMS), ROUTER_Z_LOSS_WEIGHT, MOE_TOP_K_WEIGHTS
    (dropless: the chosen experts' weights renormalised, Mixtral's and Qwen's
    ``norm_topk_prob``, or the plain softmax),
    EXPERT_MESH_AXIS (the mesh axis the experts are split over: 'data', as Pax 1.4 does, or
    an axis of their own named in MESH_AXIS_NAMES, e.g. MaxText's 'expert'; None: every
    device holds every expert, split only as the other rules split their weights).

    A scanned stack (USE_REPEATED_LAYER) that mixes dense and MoE layers is scanned as
    repeated groups of MOE_EVERY_N layers (Pax's layout: a repeated StackedTransformer of
    that many layers); MOE_LAYERS that do not repeat with a period dividing NUM_LAYERS need
    USE_REPEATED_LAYER = False.
    """

    NUM_EXPERTS: int = 0
    NUM_GROUPS: int = 1
    MIN_GROUP_SIZE: int | None = None
    MOE_LAYERS: tuple[int, ...] = ()
    MOE_EVERY_N: int = 1
    GATING_FUNC: str = "top2"
    EXPERT_CAPACITY_FACTOR: float = 2.0
    EXPERT_CAPACITY: int = 0
    SECOND_EXPERT_POLICY: SecondExpertPolicy = SecondExpertPolicy.ALL
    MOE_LOAD_BALANCE_LOSS_WEIGHT: float = 1.0
    GATING_LOGIT_CAP: float = 0.0
    MOE_ACTIVATION_CLS: Activation = Activation.RELU
    MOE_GATED_ACTIVATION: bool = False
    MOE_DISPATCH: Dispatch = Dispatch.CAPACITY
    NUM_EXPERTS_PER_TOKEN: int = 2
    MOE_HIDDEN_DIMS: int | None = None
    ROUTER_Z_LOSS_WEIGHT: float = 0.0
    MOE_TOP_K_WEIGHTS: TopKWeights = TopKWeights.RENORMALIZED
    EXPERT_MESH_AXIS: str | None = "data"

    def validate(self) -> None:
        super().validate()
        owner = type(self).__qualname__
        if not self.NUM_EXPERTS:
            stray = moe_knobs_set(type(self))
            if stray:
                raise KnobError(
                    f"{owner}: {', '.join(stray)} set but NUM_EXPERTS = 0 (no mixture of "
                    "experts); set NUM_EXPERTS, or leave them unset."
                )
            return
        self._refuse_other_modes_knobs(owner)
        axis = self.EXPERT_MESH_AXIS
        if axis is not None and axis not in self.MESH_AXIS_NAMES:
            raise KnobError(
                f"{owner}.EXPERT_MESH_AXIS = {axis!r} is not an axis of MESH_AXIS_NAMES "
                f"{tuple(self.MESH_AXIS_NAMES)}; name one of them, or add it to MESH_AXIS_NAMES "
                "with its size in ICI_MESH_SHAPE."
            )
        try:
            config_lib.instantiate(self.moe_feed_forward(), input_dims=1, hidden_dims=1).check()
        except ValueError as e:
            raise KnobError(f"{owner}: {e}") from None
        self.moe_layer_indices()

    def _refuse_other_modes_knobs(self, owner: str) -> None:
        """Knobs of the other dispatch mode, set: refused (they would change nothing)."""
        only = _CAPACITY_ONLY if self.MOE_DISPATCH is Dispatch.DROPLESS else _DROPLESS_ONLY
        unread = [name for name in moe_knobs_set(type(self)) if name in only]
        if unread:
            raise KnobError(
                f"{owner}: MOE_DISPATCH = {self.MOE_DISPATCH.value!r} reads no "
                f"{', '.join(unread)}; leave it unset or change MOE_DISPATCH."
            )

    def expert_rules(self) -> tuple[tuple[str, str], ...]:
        """The rule that puts the experts on EXPERT_MESH_AXIS (first: it takes that axis
        before the rules of the experts' other dims); none without experts."""
        if not self.NUM_EXPERTS or self.EXPERT_MESH_AXIS is None:
            return ()
        return ((EXPERT, self.EXPERT_MESH_AXIS),)

    def moe_layer_indices(self) -> tuple[int, ...]:
        """The MoE layers of the NUM_LAYERS: MOE_LAYERS, else every MOE_EVERY_N-th.

        Raises:
          KnobError: both set, an index outside the stack, or MOE_EVERY_N < 1.
        """
        owner, layers = type(self).__qualname__, self.NUM_LAYERS
        if self.MOE_EVERY_N < 1:
            raise KnobError(f"{owner}.MOE_EVERY_N = {self.MOE_EVERY_N}; it must be at least 1.")
        if self.MOE_LAYERS and self.MOE_EVERY_N != 1:
            raise KnobError(f"{owner}: set MOE_LAYERS or MOE_EVERY_N, not both.")
        if self.MOE_LAYERS:
            outside = [i for i in self.MOE_LAYERS if not 0 <= i < layers]
            if outside:
                raise KnobError(
                    f"{owner}.MOE_LAYERS = {list(self.MOE_LAYERS)}: {outside} are not layers of "
                    f"the {layers} (0..{layers - 1})."
                )
            return tuple(sorted(set(self.MOE_LAYERS)))
        n = self.MOE_EVERY_N
        if n > layers:
            raise KnobError(
                f"{owner}.MOE_EVERY_N = {n} selects none of the {layers} layers; pick at most "
                f"{layers}."
            )
        return tuple(i for i in range(layers) if (i + 1) % n == 0)

    def moe_feed_forward(self) -> config_lib.Config:
        """The MoE layers' feed-forward config (dims, norm and dropout set by the block)."""
        return MoeFeedForward.HParams.config(
            num_experts=self.NUM_EXPERTS,
            num_experts_per_token=self.NUM_EXPERTS_PER_TOKEN,
            dispatch=self.MOE_DISPATCH,
            gating_func=self.GATING_FUNC,
            num_groups=self.NUM_GROUPS,
            min_group_size=self.MIN_GROUP_SIZE,
            capacity_factor=self.EXPERT_CAPACITY_FACTOR,
            expert_capacity=self.EXPERT_CAPACITY,
            second_expert_policy=self.SECOND_EXPERT_POLICY,
            gating_logit_cap=self.GATING_LOGIT_CAP,
            top_k_weights=self.MOE_TOP_K_WEIGHTS,
            use_gated_activation=self.MOE_GATED_ACTIVATION,
            activation_tpl=self.MOE_ACTIVATION_CLS.value.HParams.config(),
            load_balance_loss_weight=self.MOE_LOAD_BALANCE_LOSS_WEIGHT,
            router_z_loss_weight=self.ROUTER_Z_LOSS_WEIGHT,
        )

    def with_experts(self, stack: config_lib.Config) -> config_lib.Config:
        """``stack`` (plain, repeated or pipelined, its dense block configured) with the MoE
        layers' feed-forwards; unchanged while NUM_EXPERTS is 0."""
        if not self.NUM_EXPERTS:
            return stack
        repeated = stack.stage_tpl if stack.__fn_or_cls__ is LayerwiseShardablePipelined else stack
        dense = repeated.block_tpl
        moe = self._moe_block(dense)
        layers = self.moe_layer_indices()
        if len(layers) == self.NUM_LAYERS:
            repeated.block_tpl = moe
        elif repeated is not stack:
            raise KnobError(
                f"{type(self).__qualname__}: a pipeline (NUM_STAGES = {self.NUM_STAGES}) of "
                "dense and MoE layers mixed is not built; make every layer MoE (MOE_EVERY_N = "
                "1, MOE_LAYERS unset) or set NUM_STAGES = 1."
            )
        elif repeated.__fn_or_cls__ is StackedTransformer:
            repeated.moe_layers, repeated.moe_block_tpl = layers, moe
        else:
            period = self._period(layers, repeated.num_layers)
            repeated.block_tpl = StackedTransformer.HParams.config(
                num_layers=period,
                block_tpl=dense,
                moe_layers=tuple(i for i in layers if i < period),
                moe_block_tpl=moe,
            )
            repeated.num_layers //= period
        return stack

    def _moe_block(self, dense: config_lib.Config) -> config_lib.Config:
        """A copy of the dense block whose feed-forward is the MoE one (its norm, dropout
        and dtypes)."""
        block = copy.deepcopy(dense)
        dense_ff = dense.tr_fflayer_tpl
        ff = self.moe_feed_forward()
        ff.ln_tpl = copy.deepcopy(dense_ff.ln_tpl)
        ff.relu_dropout_prob = dense_ff.relu_dropout_prob
        block.tr_fflayer_tpl = config_lib.set_dtypes(
            ff, dtype=dense_ff.dtype, fprop_dtype=dense_ff.fprop_dtype
        )
        if self.MOE_HIDDEN_DIMS:
            block.hidden_dims = self.MOE_HIDDEN_DIMS
        return block

    def _period(self, layers: tuple[int, ...], scanned: int) -> int:
        """The group a scanned stack repeats: the smallest period of ``layers`` that divides
        the ``scanned`` layers (of a stage, when pipelined).

        Raises:
          KnobError: the MoE layers do not repeat that way.
        """
        chosen = set(layers)
        for period in range(1, scanned + 1):
            if scanned % period:
                continue
            if all((i in chosen) == (i % period in chosen) for i in range(self.NUM_LAYERS)):
                return period
        raise KnobError(
            f"{type(self).__qualname__}.MOE_LAYERS = {list(layers)} do not repeat in groups a "
            f"scanned stack of {scanned} layers can scan; set USE_REPEATED_LAYER = False "
            "(or MoE layers that repeat, e.g. MOE_EVERY_N)."
        )


#: The knobs only one dispatch mode reads.
_CAPACITY_ONLY = (
    "GATING_FUNC",
    "EXPERT_CAPACITY_FACTOR",
    "EXPERT_CAPACITY",
    "SECOND_EXPERT_POLICY",
)
_DROPLESS_ONLY = ("MOE_TOP_K_WEIGHTS",)


def moe_knobs_set(experiment: type) -> list[str]:
    """The MoE knobs ``experiment`` sets to other than their defaults (for families whose
    model comes from elsewhere, e.g. a Hugging Face config.json)."""
    return [
        name
        for name, default in vars(MoeKnobs).items()
        if name.isupper() and getattr(experiment, name) != default
    ]
