"""A stack of identical blocks run with ``nn.scan``, weights stacked on a 'layers' axis.

Compile time and program size do not grow with depth, and the remat policy
decides which activations the backward pass recomputes.
"""

from __future__ import annotations

import enum
from typing import Any

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from praxis_lite.base_layer import AUX_LOSS, CACHE, PARAMS, SUMMARIES, BaseLayer
from praxis_lite.config import LayerTpl, template_field, unbound_layer
from praxis_lite.flops import StackLayout
from praxis_lite.layers import relative_bias as relative_bias_lib
from praxis_lite.layers.transformers import Memory, Transformer, create_relative_bias
from praxis_lite.sharding import LAYERS


class AutodiffCheckpointType(enum.Enum):
    """What the backward pass keeps from the forward pass of each block (Pax's names).

    NONE: no rematerialization (keep everything, plain autodiff).
    SAVE_NOTHING: recompute the whole block (least memory).
    SAVE_DOT_WITH_NO_BATCH_DIM: keep matmul outputs without batch dims, recompute the rest.
    SAVE_DOT_ONLY: keep every matmul output (incl. attention einsums).
    SAVE_EVERYTHING: remat wrapper that saves every value (same memory as NONE).
    The rest keep named attention activations (see ``DotProductAttention``):
    SAVE_QKV_OUT_PROJ: the combined q/k/v projection and the output projection;
    SAVE_QKV_OUT_PROJ_SEPARATE: separate q, k, v projections and the output projection;
    SAVE_CONTEXT: the attention context (probabilities x values);
    SAVE_OUT_PROJ: the output projection;
    SAVE_CONTEXT_AND_OUT_PROJ: the context and the output projection;
    SAVE_DOT_FOR_MLPERF_200B: every q/k/v projection, the context and the output projection;
    SAVE_DOT_EXCEPT_LOGITS_FFN1: those and the feed-forward's second projection ('ffn2');
    SAVE_DOT_EXCEPT_LOGITS: those and both feed-forward projections ('ffn1', 'ffn2');
    SAVE_ITERATION_INPUT: each scanned layer's input; SAVE_TRANSFORMER_LAYER_OUTPUT: each
    Transformer block's output.
    """

    NONE = "none"
    SAVE_NOTHING = "save_nothing"
    SAVE_DOT_WITH_NO_BATCH_DIM = "save_dot_with_no_batch_dims"
    SAVE_DOT_ONLY = "save_dot_only"
    SAVE_EVERYTHING = "save_everything"
    SAVE_QKV_OUT_PROJ = "save_qkv_out_proj"
    SAVE_QKV_OUT_PROJ_SEPARATE = "save_qkv_out_proj_separate"
    SAVE_CONTEXT = "save_context"
    SAVE_OUT_PROJ = "save_out_proj"
    SAVE_CONTEXT_AND_OUT_PROJ = "save_encoded_and_out_proj"
    SAVE_DOT_FOR_MLPERF_200B = "save_dot_for_mlperf_200b"
    SAVE_ITERATION_INPUT = "save_iteration_input"
    SAVE_TRANSFORMER_LAYER_OUTPUT = "save_transformer_layer_output"
    SAVE_DOT_EXCEPT_LOGITS_FFN1 = "save_dot_except_logits_ffn1"
    SAVE_DOT_EXCEPT_LOGITS = "save_dot_except_logits"

    def checkpoint_policy(self, offload_to_host: bool = False):
        """The ``jax.checkpoint_policies`` function for this policy (None for NONE).

        ``offload_to_host``: a named policy's kept activations go to host memory
        (``pinned_host``) between the forward and backward passes instead of staying in
        device memory (``save_and_offload_only_these_names``; a no-op where the platform
        has one memory, e.g. on CPU).

        Raises:
          ValueError: offload asked of a policy that does not name what it keeps.
        """
        policies = jax.checkpoint_policies
        if offload_to_host:
            if self.name not in _SAVED_NAMES:
                raise ValueError(
                    f"checkpoint offload to host needs a policy that names what it keeps "
                    f"(e.g. SAVE_DOT_FOR_MLPERF_200B), got {self.name}."
                )
            return policies.save_and_offload_only_these_names(
                names_which_can_be_saved=[],
                names_which_can_be_offloaded=list(_SAVED_NAMES[self.name]),
                offload_src="device",
                offload_dst="pinned_host",
            )
        by_name = {
            "NONE": None,
            "SAVE_NOTHING": policies.nothing_saveable,
            "SAVE_DOT_WITH_NO_BATCH_DIM": policies.dots_with_no_batch_dims_saveable,
            "SAVE_DOT_ONLY": policies.dots_saveable,
            "SAVE_EVERYTHING": policies.everything_saveable,
        }
        if self.name in by_name:
            return by_name[self.name]
        return policies.save_only_these_names(*_SAVED_NAMES[self.name])


_QKV_SEPARATE = ("query_proj", "key_proj", "value_proj")
#: The activation names each named policy keeps (praxis's ``checkpoint_policy.py``).
_SAVED_NAMES = {
    "SAVE_QKV_OUT_PROJ": ("combined_qkv_proj", "out_proj"),
    "SAVE_QKV_OUT_PROJ_SEPARATE": (*_QKV_SEPARATE, "out_proj"),
    "SAVE_CONTEXT": ("context",),
    "SAVE_OUT_PROJ": ("out_proj",),
    "SAVE_CONTEXT_AND_OUT_PROJ": ("context", "out_proj"),
    "SAVE_DOT_FOR_MLPERF_200B": ("combined_qkv_proj", *_QKV_SEPARATE, "context", "out_proj"),
    "SAVE_ITERATION_INPUT": ("iteration_input",),
    "SAVE_TRANSFORMER_LAYER_OUTPUT": ("transformer_layer_out",),
    "SAVE_DOT_EXCEPT_LOGITS_FFN1": (
        "combined_qkv_proj",
        *_QKV_SEPARATE,
        "context",
        "out_proj",
        "ffn2",
    ),
    "SAVE_DOT_EXCEPT_LOGITS": (
        "combined_qkv_proj",
        *_QKV_SEPARATE,
        "context",
        "out_proj",
        "ffn1",
        "ffn2",
    ),
}


class _ScanBody(BaseLayer):
    """One scan step: ``(x, context) -> (block(x, **context), None)``.

    ``context`` holds the block's keyword arguments, the same for every layer (broadcast):
    paddings, segment ids, positions, the stack's attention bias, an encoder's memory.
    With ``extend`` the step is the block's incremental decoding (``Transformer.extend``,
    ``max_len`` cache slots on the first call) instead of its training forward pass.
    """

    block_tpl: LayerTpl = template_field(Transformer)
    train: bool = False
    extend: bool = False
    max_len: int | None = None

    def setup(self) -> None:
        self.block = self.create_child(self.block_tpl)

    def __call__(self, x: jax.Array, context: dict[str, Any]) -> tuple[jax.Array, None]:
        if self.extend:
            return self.block.extend(x, max_len=self.max_len, **context), None
        x = checkpoint_name(x, "iteration_input")
        return self.block(x, train=self.train, **context), None


class StackedTransformerRepeated(BaseLayer):
    """``num_layers`` copies of ``block_tpl`` scanned; ``[B, T, D] -> [B, T, D]``.

    Weights of the block get a leading ``num_layers`` axis named 'layers'
    (``params['repeat']['block'][...]``), and are numerically the same model as
    :class:`~praxis_lite.layers.transformers.StackedTransformer` with the
    per-layer weights stacked.

    Attributes:
      num_layers: number of blocks.
      block_tpl: the block template.
      checkpoint_policy: see :class:`AutodiffCheckpointType`.
      offload_to_host: keep a named policy's activations in host memory (see
        :meth:`AutodiffCheckpointType.checkpoint_policy`).
      relative_bias_tpl: T5's relative position bias, one table for the stack (see
        ``StackedTransformer``); ``None``: none.

    ``block_tpl`` may be a ``StackedTransformer`` of a few layers (a group scanned as one
    body: how a stack mixing dense and mixture-of-experts layers is scanned); its weights
    are then ``repeat/block/x_layers_<j>/...``.
    """

    num_layers: int
    block_tpl: LayerTpl = template_field(Transformer)
    checkpoint_policy: AutodiffCheckpointType = AutodiffCheckpointType.SAVE_NOTHING
    offload_to_host: bool = False
    relative_bias_tpl: LayerTpl = template_field(None)

    def setup(self) -> None:
        self.relative_bias = create_relative_bias(self)

    def layout(self) -> StackLayout:
        """``num_layers`` blocks as one scanned loop body (remat when a policy is on); a
        block that is itself a stack (a group of layers) counts its layers."""
        remat = self.checkpoint_policy is not AutodiffCheckpointType.NONE
        block = unbound_layer(self.block_tpl)
        if not hasattr(block, "layout"):
            return StackLayout(
                self.num_layers, self.block_tpl.value, scan_trips=self.num_layers, remat=remat
            )
        group = block.layout()
        return StackLayout(
            self.num_layers * group.num_layers,
            group.block,
            scan_trips=self.num_layers,
            remat=remat,
            moe_block=group.moe_block,
            moe_layers=self.num_layers * group.moe_layers,
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        memory: Memory | None = None,
        train: bool = False,
    ) -> jax.Array:
        """``[B, T, D] -> [B, T, D]`` (arguments as in StackedTransformer)."""
        context = dict(
            paddings=paddings,
            segment_ids=segment_ids,
            positions=positions,
            attention_bias=relative_bias_lib.stack_bias(self.relative_bias, x.shape[1]),
            memory=memory,
        )
        return self._scan(x, context, train=train)

    def extend(
        self,
        x: jax.Array,
        *,
        positions: jax.Array,
        paddings: jax.Array | None = None,
        max_len: int | None = None,
        memory: Memory | None = None,
    ) -> jax.Array:
        """Incremental decoding (see ``DotProductAttention.extend``), ``[B, T, D] -> [B, T, D]``.

        The blocks' caches are stacked like their weights: collection ``'cache'``
        scanned over a leading ``num_layers`` axis.
        """
        bias = None
        if self.relative_bias is not None:
            bias = self.relative_bias.extend(x.shape[1], max_len)
        context = dict(positions=positions, paddings=paddings, attention_bias=bias, memory=memory)
        return self._scan(x, context, extend=True, max_len=max_len)

    @nn.compact
    def _scan(
        self,
        x: jax.Array,
        context: dict[str, Any],
        *,
        train: bool = False,
        extend: bool = False,
        max_len: int | None = None,
    ) -> jax.Array:
        """The scan of the block over its stacked weights (and caches, when extending);
        ``context``: the block's other arguments, the same for every layer."""
        body = _ScanBody
        policy = self.checkpoint_policy.checkpoint_policy(self.offload_to_host)
        if self.checkpoint_policy is not AutodiffCheckpointType.NONE and not extend:
            body = nn.remat(body, policy=policy, prevent_cse=False)
        scanned = nn.scan(
            body,
            variable_axes={PARAMS: 0, SUMMARIES: 0, AUX_LOSS: 0, CACHE: 0},
            split_rngs={PARAMS: True, "dropout": True},
            in_axes=(nn.broadcast,),
            length=self.num_layers,
            metadata_params={nn.PARTITION_NAME: LAYERS},
        )
        repeat = scanned(
            block_tpl=self.block_tpl, train=train, extend=extend, max_len=max_len, name="repeat"
        )
        x, _ = repeat(self.to_fprop(x), context)
        return x
