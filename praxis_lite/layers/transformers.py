"""Transformer feed-forward, the Transformer block, and a plain stack of blocks.

Shapes: ``B`` batch, ``T`` time, ``D`` model dims, ``F`` hidden (feed-forward) dims.
All blocks are pre-norm: ``x + dropout(sublayer(norm(x)))``.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from praxis_lite import config as config_lib
from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import LayerTpl, template_field
from praxis_lite.flops import StackLayout
from praxis_lite.layers import lora as lora_lib
from praxis_lite.layers import relative_bias as relative_bias_lib
from praxis_lite.layers.activations import ReLU
from praxis_lite.layers.attentions import DotProductAttention
from praxis_lite.layers.linears import Bias, Linear
from praxis_lite.layers.lora import LoraSettings
from praxis_lite.layers.normalizations import LayerNorm
from praxis_lite.sharding import ACTIVATION_EMBED, BATCH, EMBED, LENGTH, MLP

#: TransformerFeedForward's LoRA targets: its projections' child names (the gate's only with
#: ``use_gated_activation``).
FFN_LORA_TARGETS = ("ffn_layer1", "ffn_layer1_gate", "ffn_layer2")


class Memory(NamedTuple):
    """What a decoder block's cross-attention reads: an encoder's output.

    Attributes:
      outputs: ``[B, S, D]``.
      paddings: ``[B, S]``, 1.0 at padded slots (never attended); None: none.
      segment_ids: ``[B, S]`` packed-sequence ids (a query sees its own segment's); None.
    """

    outputs: jax.Array
    paddings: jax.Array | None = None
    segment_ids: jax.Array | None = None


class TransformerFeedForward(BaseLayer):
    """Pre-norm feed-forward with a residual: ``[B, T, D] -> [B, T, D]``.

    ``y = x + dropout(W2 · dropout(act(W1 · norm(x)) [* (Wg · norm(x))]))``;
    with ``use_gated_activation`` the activation output is multiplied by a
    linear gate (e.g. SiLU + gate = SwiGLU).

    Attributes:
      input_dims: ``D``.
      hidden_dims: ``F``.
      use_bias: biases on the projections.
      use_gated_activation: add the gate projection (GLU variants).
      linear_tpl: the projections' template (each given its dims and weight axes:
        ``ffn_layer1`` and the gate ``[D, F]``, ``ffn_layer2`` ``[F, D]``).
      bias_tpl: the biases' template (given ``input_dims`` and axes).
      activation_tpl: the activation template.
      ln_tpl: the pre-norm template (given ``input_dims``).
      post_ln_tpl: a norm of the branch's output before the residual add (Gemma 2's
        post-feedforward norm); ``None`` for none.
      relu_dropout_prob: dropout after the activation.
      residual_dropout_prob: dropout on the branch before the residual add.
      lora: LoRA adapters on the projections its ``targets`` name, among ``ffn_layer1``,
        ``ffn_layer1_gate`` (with ``use_gated_activation``) and ``ffn_layer2``: those get
        ``lora=`` (and ``train=`` when called; see ``Linear``), the others are untouched.
    """

    input_dims: int
    hidden_dims: int
    use_bias: bool = True
    use_gated_activation: bool = False
    linear_tpl: LayerTpl = template_field(Linear)
    bias_tpl: LayerTpl = template_field(Bias)
    activation_tpl: LayerTpl = template_field(ReLU)
    ln_tpl: LayerTpl = template_field(LayerNorm)
    post_ln_tpl: LayerTpl = template_field(None)
    relu_dropout_prob: float = 0.0
    residual_dropout_prob: float = 0.0
    lora: LoraSettings | None = None

    def setup(self) -> None:
        d, f = self.input_dims, self.hidden_dims
        self.layer_norm = self.create_child(self.ln_tpl, input_dims=d)
        self.post_layer_norm = self.create_child(self.post_ln_tpl, input_dims=d)
        self.ffn_layer1 = self._projection("ffn_layer1", d, f, (EMBED, MLP))
        if self.use_gated_activation:
            self.ffn_layer1_gate = self._projection("ffn_layer1_gate", d, f, (EMBED, MLP))
        self.ffn_layer2 = self._projection("ffn_layer2", f, d, (MLP, EMBED))
        if self.use_bias:
            self.bias1 = self.stamp_child(self.bias_tpl, input_dims=f, bias_axes=(MLP,))
            self.bias2 = self.stamp_child(self.bias_tpl, input_dims=d, bias_axes=(EMBED,))
        self.activation = self.create_child(self.activation_tpl)
        self.relu_dropout = nn.Dropout(self.relu_dropout_prob)
        self.residual_dropout = nn.Dropout(self.residual_dropout_prob)

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """The projections (child names) that get LoRA adapters; checked."""
        gated = self.use_gated_activation
        valid = FFN_LORA_TARGETS if gated else FFN_LORA_TARGETS[::2]
        hint = "" if gated else "ffn_layer1_gate needs use_gated_activation."
        return lora_lib.checked_targets(type(self).__name__, self.lora, valid, hint)

    def _projection(
        self, name: str, input_dims: int, output_dims: int, axes: tuple[str, str]
    ) -> BaseLayer:
        """Projection ``name``, fresh from ``linear_tpl`` (its dtypes are the template's own),
        given ``lora`` when it is a LoRA target."""
        adapted = {"lora": self.lora} if name in self.lora_targets else {}
        return self.stamp_child(
            self.linear_tpl,
            input_dims=input_dims,
            output_dims=output_dims,
            weight_axes=axes,
            **adapted,
        )

    def _project(self, layer: BaseLayer, x: jax.Array, train: bool) -> jax.Array:
        """``layer(x)``, with ``train=`` (its LoRA dropout) when ``layer`` is a LoRA target."""
        return layer(x, train=train) if layer.name in self.lora_targets else layer(x)

    def __call__(
        self, x: jax.Array, *, paddings: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        """``[B, T, D] -> [B, T, D]``; ``train`` enables the dropouts. ``paddings [B, T]``:
        unused (each token on its own; a feed-forward's contract, which a mixture of
        experts reads)."""
        del paddings
        x = self.to_fprop(x)
        h_in = self.constrain(self.layer_norm(x), (BATCH, LENGTH, ACTIVATION_EMBED))
        h = self._project(self.ffn_layer1, h_in, train)
        if self.use_bias:
            h = self.bias1(h)
        h = checkpoint_name(h, "ffn1")  # Names for remat policies, as praxis's.
        h = self.activation(h)
        if self.use_gated_activation:
            h = h * self._project(self.ffn_layer1_gate, h_in, train)
        h = self.constrain(h, (BATCH, LENGTH, MLP))
        h = self.relu_dropout(h, deterministic=not train)
        out = self._project(self.ffn_layer2, h, train)
        if self.use_bias:
            out = self.bias2(out)
        out = checkpoint_name(self.constrain(out, (BATCH, LENGTH, ACTIVATION_EMBED)), "ffn2")
        if self.post_layer_norm is not None:
            out = self.post_layer_norm(out)
        out = self.residual_dropout(out, deterministic=not train)
        return self.constrain(x + out, (BATCH, LENGTH, ACTIVATION_EMBED))


class Transformer(BaseLayer):
    """One pre-norm block: attention then feed-forward, ``[B, T, D] -> [B, T, D]``.

    Attributes:
      input_dims: ``D``.
      hidden_dims: ``F`` of the feed-forward.
      num_heads: attention heads.
      num_kv_heads: key/value heads (``None`` = ``num_heads``; see DotProductAttention).
      dims_per_head: ``None`` = ``D // num_heads``.
      residual_dropout_prob: dropout on each branch before the residual add.
      ln_tpl: the pre-attention norm (given ``input_dims``).
      post_ln_tpl: a norm of the attention's output before the residual add (Gemma 2's
        post-attention norm); ``None`` for none.
      tr_atten_tpl: attention template (given dims, heads).
      tr_fflayer_tpl: feed-forward template (given dims; it holds its own norm).
      cross_atten_tpl: an encoder-decoder's decoder block: attention over the encoder's
        output between the self-attention and the feed-forward, pre-norm (its norm from
        ``ln_tpl``) with a residual: ``x + dropout(cross(norm(x), memory))``; given dims
        and heads like ``tr_atten_tpl``. ``None``: none (a decoder-only or encoder block).
    """

    input_dims: int
    hidden_dims: int
    num_heads: int
    num_kv_heads: int | None = None
    dims_per_head: int | None = None
    residual_dropout_prob: float = 0.0
    ln_tpl: LayerTpl = template_field(LayerNorm)
    post_ln_tpl: LayerTpl = template_field(None)
    tr_atten_tpl: LayerTpl = template_field(DotProductAttention)
    tr_fflayer_tpl: LayerTpl = template_field(TransformerFeedForward)
    cross_atten_tpl: LayerTpl = template_field(None)

    def setup(self) -> None:
        self.layer_norm = self.create_child(self.ln_tpl, input_dims=self.input_dims)
        self.post_layer_norm = self.create_child(self.post_ln_tpl, input_dims=self.input_dims)
        heads = dict(
            input_dims=self.input_dims,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            dims_per_head=self.dims_per_head,
        )
        self.self_attention = self.create_child(self.tr_atten_tpl, **heads)
        if self.cross_atten_tpl is not None:
            self.cross_layer_norm = self.create_child(self.ln_tpl, input_dims=self.input_dims)
            self.cross_attention = self.create_child(self.cross_atten_tpl, **heads)
        self.ff_layer = self.create_child(
            self.tr_fflayer_tpl,
            input_dims=self.input_dims,
            hidden_dims=self.hidden_dims,
            residual_dropout_prob=self.residual_dropout_prob,
        )
        self.residual_dropout = nn.Dropout(self.residual_dropout_prob)

    def matmul_shape(self) -> dict[str, Any]:
        """The block's FLOPs-relevant sizes: heads, kv heads, dims per head, gated, causal,
        and ``moe``: its feed-forward's ``active_ffn()`` (a ``flops.MoeFfn``) when it is a
        mixture of experts, else None."""
        ff = config_lib.instantiate(
            self.tr_fflayer_tpl.value,
            parent=None,
            input_dims=self.input_dims,
            hidden_dims=self.hidden_dims,
        )
        return {
            "hidden_dims": self.hidden_dims,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads or self.num_heads,
            "dims_per_head": self.dims_per_head or self.input_dims // self.num_heads,
            "gated": bool(getattr(ff, "use_gated_activation", False)),
            "causal": bool(getattr(self.tr_atten_tpl.value, "is_causal", True)),
            "moe": ff.active_ffn() if hasattr(ff, "active_ffn") else None,
        }

    def __call__(
        self,
        x: jax.Array,
        *,
        paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        attention_bias: jax.Array | None = None,
        memory: Memory | None = None,
        train: bool = False,
    ) -> jax.Array:
        """``x [B, T, D]`` (see DotProductAttention for the other arguments); ``memory``: the
        encoder's output a block with ``cross_atten_tpl`` attends to."""
        x = self.to_fprop(x)
        atten = self.self_attention(
            self.layer_norm(x),
            paddings=paddings,
            segment_ids=segment_ids,
            positions=positions,
            attention_bias=attention_bias,
            train=train,
        )
        if self.post_layer_norm is not None:
            atten = self.post_layer_norm(atten)
        x = x + self.residual_dropout(atten, deterministic=not train)
        if self.cross_atten_tpl is not None:
            cross = self.cross_attention.cross_attend(
                self.cross_layer_norm(x),
                memory.outputs,
                memory_paddings=memory.paddings,
                segment_ids=segment_ids,
                memory_segment_ids=memory.segment_ids,
                train=train,
            )
            x = x + self.residual_dropout(cross, deterministic=not train)
        out = self.ff_layer(x, paddings=paddings, train=train)
        return checkpoint_name(out, "transformer_layer_out")

    def extend(
        self,
        x: jax.Array,
        *,
        positions: jax.Array,
        paddings: jax.Array | None = None,
        max_len: int | None = None,
        attention_bias: jax.Array | None = None,
        memory: Memory | None = None,
    ) -> jax.Array:
        """Incremental decoding, ``[B, T, D] -> [B, T, D]``: see DotProductAttention.extend
        (and ``cross_extend``: ``memory`` on the first call only)."""
        x = self.to_fprop(x)
        atten = self.self_attention.extend(
            self.layer_norm(x),
            positions=positions,
            paddings=paddings,
            max_len=max_len,
            attention_bias=attention_bias,
        )
        if self.post_layer_norm is not None:
            atten = self.post_layer_norm(atten)
        x = x + atten
        if self.cross_atten_tpl is not None:
            outputs, memory_paddings = (None, None) if memory is None else memory[:2]
            x = x + self.cross_attention.cross_extend(
                self.cross_layer_norm(x), outputs, memory_paddings
            )
        if hasattr(self.ff_layer, "extend"):  # A mixture of experts decodes its own way.
            return self.ff_layer.extend(x, paddings=paddings)
        return self.ff_layer(x, paddings=paddings)


class StackedTransformer(BaseLayer):
    """``num_layers`` blocks stamped from ``block_tpl``, applied in a Python loop.

    Parameters live under ``x_layers_{i}``. See ``repeats.StackedTransformerRepeated``
    for the scanned form with stacked weights.

    Attributes:
      num_layers: number of blocks.
      block_tpl: the block template (its dims are the blocks' dims).
      sliding_windows: per block, its attention's ``sliding_window`` (Gemma 2 alternates
        windowed and global layers); empty: the block template's own for every block.
      relative_bias_tpl: T5's relative position bias (``RelativePositionBias``, given the
        block's ``num_heads``): one table for the stack, its bias computed once per call and
        added to every block's self-attention logits; ``None``: none.
      moe_layers: the blocks (indices) stamped from ``moe_block_tpl`` instead (Pax's
        ``moe_layers``; Qwen-MoE's ``decoder_sparse_step`` and ``mlp_only_layers`` become
        such a list); empty: none.
      moe_block_tpl: the block of the ``moe_layers``: a block whose ``tr_fflayer_tpl`` is a
        mixture of experts (``praxis_lite.moe.MoeFeedForward``). A stack whose every block
        is one sets ``block_tpl`` to it instead.

    A stack mixing dense and MoE blocks is scanned as repeated groups: a
    ``StackedTransformerRepeated`` whose ``block_tpl`` is this stack with the group's
    layers (e.g. 2 layers, ``moe_layers=(1,)``: every second layer a mixture of experts,
    Pax's layout for such stacks), or left unscanned as one of these.
    """

    num_layers: int
    block_tpl: LayerTpl = template_field(Transformer)
    sliding_windows: tuple[int | None, ...] = ()
    relative_bias_tpl: LayerTpl = template_field(None)
    moe_layers: tuple[int, ...] = ()
    moe_block_tpl: LayerTpl = template_field(None)

    def setup(self) -> None:
        self.check_layers()
        self.x_layers = [self.stamp_child(self._block(i)) for i in range(self.num_layers)]
        self.relative_bias = create_relative_bias(self)

    def check_layers(self) -> None:
        """Refuses per-layer settings that do not fit ``num_layers``.

        Raises:
          ValueError: ``sliding_windows`` of another length, ``moe_layers`` out of range or
            without ``moe_block_tpl``.
        """
        if self.sliding_windows and len(self.sliding_windows) != self.num_layers:
            raise ValueError(
                f"sliding_windows has {len(self.sliding_windows)} entries for "
                f"{self.num_layers} layers; give one per layer (None: no window)."
            )
        outside = [i for i in self.moe_layers if not 0 <= i < self.num_layers]
        if outside:
            raise ValueError(
                f"moe_layers {outside} are not layers of a {self.num_layers}-layer stack "
                f"(0..{self.num_layers - 1})."
            )
        if self.moe_layers and self.moe_block_tpl is None:
            raise ValueError("moe_layers needs moe_block_tpl (the mixture-of-experts block).")

    def _block(self, i: int) -> Any:
        """Block ``i``'s template: ``block_tpl`` (or ``moe_block_tpl`` for ``moe_layers``),
        with its window when ``sliding_windows``."""
        chosen = self.moe_block_tpl if i in self.moe_layers else self.block_tpl
        if not self.sliding_windows:
            return chosen
        block = copy.deepcopy(chosen.value)
        block.tr_atten_tpl.sliding_window = self.sliding_windows[i]
        return block

    def layout(self) -> StackLayout:
        """``num_layers`` blocks, one after another (no loop XLA counts once)."""
        moe_block = self.moe_block_tpl.value if self.moe_layers else None
        return StackLayout(
            self.num_layers,
            self.block_tpl.value,
            moe_block=moe_block,
            moe_layers=len(set(self.moe_layers)),
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        attention_bias: jax.Array | None = None,
        memory: Memory | None = None,
        train: bool = False,
    ) -> jax.Array:
        """``[B, T, D] -> [B, T, D]`` (``memory``: for blocks with cross-attention;
        ``attention_bias``: an enclosing stack's, when this one is its scanned group)."""
        bias = attention_bias
        if bias is None:
            bias = relative_bias_lib.stack_bias(self.relative_bias, x.shape[1])
        for layer in self.x_layers:
            x = layer(
                x,
                paddings=paddings,
                segment_ids=segment_ids,
                positions=positions,
                attention_bias=bias,
                memory=memory,
                train=train,
            )
        return x

    def extend(
        self,
        x: jax.Array,
        *,
        positions: jax.Array,
        paddings: jax.Array | None = None,
        max_len: int | None = None,
        attention_bias: jax.Array | None = None,
        memory: Memory | None = None,
    ) -> jax.Array:
        """Incremental decoding through every block (each keeps its own cache; ``memory``
        on the first call only; ``attention_bias`` as in ``__call__``)."""
        bias = attention_bias
        if self.relative_bias is not None:
            bias = self.relative_bias.extend(x.shape[1], max_len)
        for layer in self.x_layers:
            x = layer.extend(
                x,
                positions=positions,
                paddings=paddings,
                max_len=max_len,
                attention_bias=bias,
                memory=memory,
            )
        return x


def create_relative_bias(stack: BaseLayer) -> BaseLayer | None:
    """``stack``'s ``relative_bias_tpl`` layer with its block's heads (call from setup; a
    block that is a group of layers: its own block's)."""
    if stack.relative_bias_tpl is None:
        return None
    block = stack.block_tpl.value
    while "num_heads" not in block.__arguments__ and "block_tpl" in block.__arguments__:
        block = block.block_tpl
    return stack.create_child(stack.relative_bias_tpl, num_heads=block.num_heads)
