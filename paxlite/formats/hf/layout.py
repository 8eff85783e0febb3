"""Hugging Face's tensor names and layouts for our parameters: the name-and-layout tables.

A :class:`Row` of a :data:`Table` pairs a regex on our parameter paths (flat, ``/`` between
keys, without ``params/``) with the name of Hugging Face's tensor (``{}`` takes the
regex's group: the layer number) and the :class:`Layout` between the two arrays. A fused
tensor (GPT-2's ``c_attn``: q, k and v side by side) holds ``parts`` of our arrays, ours
being ``part``. Layouts need no model sizes: each follows from our array's shape. Shapes:
``D`` model dims, ``N`` heads, ``H`` dims per head, ``F`` hidden dims, ``V`` vocabulary,
``P`` positions; torch's ``Linear.weight`` is ``[out, in]``, GPT-2's ``Conv1D.weight``
``[in, out]``; ``E`` experts.

A mixture of experts keeps each expert in tensors of its own (``experts.{expert}.w1.weight``):
our ``[E, ...]`` array of every expert's weight is ``E`` of their tensors (a row's
``{expert}``), each in the row's layout.

A device's slice of one of our arrays is read from the matching slice of Hugging Face's
tensor (:func:`read_slice`): nothing outside it is read, except whole heads' dims when
our slice splits ``H`` (it never does under the usual rules).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import re
from collections.abc import Callable

import numpy as np

#: ``index`` (a tuple of slices of Hugging Face's tensor) -> those values.
SliceReader = Callable[[tuple[slice, ...]], np.ndarray]


class Layout(enum.Enum):
    """How one of our arrays is stored in Hugging Face's tensor."""

    COPY = "same shape"  # norms, embedding tables [V, D] and [P, D], biases [D], Conv1D [in, out]
    TRANSPOSE = "[out, in] of our [in, out]"  # Linear feed-forward and lm_head weights
    HEADS_IN = "[N*H, D] of our [D, N, H]"  # Linear q/k/v projections
    HEADS_OUT = "[D, N*H] of our [N, H, D]"  # the Linear attention output projection
    HEADS_BIAS = "[N*H] of our [N, H]"  # q/k/v biases
    CONV_HEADS_IN = "[D, N*H] of our [D, N, H]"  # Conv1D q/k/v projections
    CONV_HEADS_OUT = "[N*H, D] of our [N, H, D]"  # the Conv1D attention output projection


@dataclasses.dataclass(frozen=True)
class Row:
    """Our parameter paths matching ``ours`` (a regex) are Hugging Face's ``theirs`` (part
    ``part`` of ``parts`` along its heads' axis)."""

    ours: str
    theirs: str
    layout: Layout
    part: int = 0
    parts: int = 1


@dataclasses.dataclass(frozen=True)
class Named:
    """One of our parameters in Hugging Face's tensor ``theirs`` (see :class:`Row`).

    ``stacked``: ours is a scanned stack's ``[L, ...]`` array of every layer's parameter:
    ``theirs`` is then a name with ``{}`` for the layer (:meth:`layer_names`).
    ``experts``: ours is ``[E, ...]`` (after ``L`` when stacked), each expert in a tensor of
    its own: ``theirs`` has ``{expert}`` for it (:meth:`tensor_names`).
    """

    theirs: str
    layout: Layout
    part: int = 0
    parts: int = 1
    stacked: bool = False
    experts: bool = False

    @property
    def split_dims(self) -> int:
        """How many leading axes of our array pick Hugging Face's tensor (layers, experts)."""
        return int(self.stacked) + int(self.experts)

    def layer_names(self, num_layers: int) -> list[str]:
        """Hugging Face's tensors, one per layer (just ``theirs`` when not stacked)."""
        if not self.stacked:
            return [self.theirs]
        return [self.theirs.format(layer) for layer in range(num_layers)]

    def tensor_names(self, shape: tuple[int, ...]) -> list[str]:
        """Hugging Face's tensors of our array of ``shape``, one per index of its
        :attr:`split_dims` leading axes, in C order (layer-major)."""
        counts = shape[: self.split_dims]
        names = []
        for index in itertools.product(*(range(c) for c in counts)):
            layer = (index[0],) if self.stacked else ()
            expert = {"expert": index[-1]} if self.experts else {}
            names.append(self.theirs.format(*layer, **expert) if index else self.theirs)
        return names


Table = tuple[Row, ...]


#: A plain stack's block ``i`` (the row's regex group) and, in the same place of a scanned
#: stack (``StackedTransformerRepeated``), every layer's block in one ``[L, ...]`` array.
_LAYER = r"x_layers_(\d+)/"
#: Where a row's Hugging Face name holds the expert's number.
_EXPERT = "{expert}"
_SCANNED_LAYERS = "repeat/block/"
_BLOCK = "lm/transformer/" + _LAYER


def _llama_block(ours: str, theirs: str, layout: Layout) -> Row:
    """A row of each Transformer block's parameters, in Llama's names."""
    return Row(_BLOCK + ours, "model.layers.{}." + theirs, layout)


_QKV_LINEAR = (
    *(
        _llama_block(f"self_attention/w_{x}", f"self_attn.{x}_proj.weight", Layout.HEADS_IN)
        for x in "qkv"
    ),
    *(
        _llama_block(f"self_attention/b_{x}", f"self_attn.{x}_proj.bias", Layout.HEADS_BIAS)
        for x in "qkv"
    ),
)

#: Llama and the families built like it (Mistral, Qwen2, Qwen3, Gemma): a row whose
#: parameter a model lacks (biases, q/k norms, a tied lm_head) is simply not used.
LLAMA_TABLE: Table = (
    Row("lm/embedding/emb_var", "model.embed_tokens.weight", Layout.COPY),
    Row("lm/softmax/emb_var", "model.embed_tokens.weight", Layout.COPY),  # Tied.
    Row("lm/softmax/w", "lm_head.weight", Layout.TRANSPOSE),
    Row("lm/final_ln/scale", "model.norm.weight", Layout.COPY),
    _llama_block("layer_norm/scale", "input_layernorm.weight", Layout.COPY),
    *_QKV_LINEAR,
    _llama_block("self_attention/w_post", "self_attn.o_proj.weight", Layout.HEADS_OUT),
    _llama_block("self_attention/b_post", "self_attn.o_proj.bias", Layout.COPY),
    _llama_block("self_attention/query_norm/scale", "self_attn.q_norm.weight", Layout.COPY),
    _llama_block("self_attention/key_norm/scale", "self_attn.k_norm.weight", Layout.COPY),
    _llama_block("ff_layer/layer_norm/scale", "post_attention_layernorm.weight", Layout.COPY),
    _llama_block("ff_layer/ffn_layer1/w", "mlp.gate_proj.weight", Layout.TRANSPOSE),
    _llama_block("ff_layer/ffn_layer1_gate/w", "mlp.up_proj.weight", Layout.TRANSPOSE),
    _llama_block("ff_layer/ffn_layer2/w", "mlp.down_proj.weight", Layout.TRANSPOSE),
)


def _experts(module: str, gate: str, up: str, down: str) -> tuple[Row, ...]:
    """A mixture-of-experts feed-forward (``praxis_lite.moe.MoeFeedForward``) under
    ``module``: the router ``gate [D, E]`` (theirs ``[E, D]``), each expert's activated
    projection ``wi_gate_0`` (``gate``), linear one ``wi_0`` (``up``) and output ``wo_0``
    (``down``), one Linear per expert."""
    experts = f"{module}.experts.{_EXPERT}."
    return (
        _llama_block("ff_layer/gate", f"{module}.gate.weight", Layout.TRANSPOSE),
        _llama_block("ff_layer/wi_gate_0", f"{experts}{gate}.weight", Layout.TRANSPOSE),
        _llama_block("ff_layer/wi_0", f"{experts}{up}.weight", Layout.TRANSPOSE),
        _llama_block("ff_layer/wo_0", f"{experts}{down}.weight", Layout.TRANSPOSE),
    )


#: Mixtral: Llama's, the feed-forward a mixture of experts (``block_sparse_moe``; w1 the
#: activated projection, w3 the linear one, w2 the output).
MIXTRAL_TABLE: Table = (*_experts("block_sparse_moe", "w1", "w3", "w2"), *LLAMA_TABLE)

#: Qwen2-MoE and Qwen3-MoE: Llama's (dense layers keep ``mlp.*_proj``), MoE layers'
#: experts under ``mlp.experts``, and Qwen2-MoE's shared expert and its sigmoid gate.
QWEN_MOE_TABLE: Table = (
    *_experts("mlp", "gate_proj", "up_proj", "down_proj"),
    _llama_block(
        "ff_layer/shared_wi_gate_0", "mlp.shared_expert.gate_proj.weight", Layout.TRANSPOSE
    ),
    _llama_block("ff_layer/shared_wi_0", "mlp.shared_expert.up_proj.weight", Layout.TRANSPOSE),
    _llama_block("ff_layer/shared_wo_0", "mlp.shared_expert.down_proj.weight", Layout.TRANSPOSE),
    _llama_block("ff_layer/shared_gate", "mlp.shared_expert_gate.weight", Layout.TRANSPOSE),
    *LLAMA_TABLE,
)

#: Gemma 2: Llama's, with a norm after the attention (its ``post_attention_layernorm``),
#: and before and after the feed-forward. The first row that matches wins.
GEMMA2_TABLE: Table = (
    _llama_block("post_layer_norm/scale", "post_attention_layernorm.weight", Layout.COPY),
    _llama_block("ff_layer/layer_norm/scale", "pre_feedforward_layernorm.weight", Layout.COPY),
    _llama_block(
        "ff_layer/post_layer_norm/scale", "post_feedforward_layernorm.weight", Layout.COPY
    ),
    *LLAMA_TABLE,
)


def _gpt2_block(ours: str, theirs: str, layout: Layout = Layout.COPY, part: int = 0) -> Row:
    parts = 3 if theirs.startswith("attn.c_attn") else 1
    return Row(_BLOCK + ours, "transformer.h.{}." + theirs, layout, part, parts)


#: GPT-2: Conv1D weights ([in, out], as ours), q/k/v fused in ``c_attn``, biases everywhere.
GPT2_TABLE: Table = (
    Row("lm/softmax/emb_var", "transformer.wte.weight", Layout.COPY),  # Tied.
    Row("lm/position_emb/emb_var", "transformer.wpe.weight", Layout.COPY),
    Row("lm/final_ln/scale", "transformer.ln_f.weight", Layout.COPY),
    Row("lm/final_ln/bias", "transformer.ln_f.bias", Layout.COPY),
    *(
        _gpt2_block(f"layer_norm/{ours}", f"ln_1.{theirs}")
        for ours, theirs in (("scale", "weight"), ("bias", "bias"))
    ),
    *(
        _gpt2_block(f"self_attention/w_{x}", "attn.c_attn.weight", Layout.CONV_HEADS_IN, i)
        for i, x in enumerate("qkv")
    ),
    *(
        _gpt2_block(f"self_attention/b_{x}", "attn.c_attn.bias", Layout.HEADS_BIAS, i)
        for i, x in enumerate("qkv")
    ),
    _gpt2_block("self_attention/w_post", "attn.c_proj.weight", Layout.CONV_HEADS_OUT),
    _gpt2_block("self_attention/b_post", "attn.c_proj.bias"),
    *(
        _gpt2_block(f"ff_layer/layer_norm/{ours}", f"ln_2.{theirs}")
        for ours, theirs in (("scale", "weight"), ("bias", "bias"))
    ),
    _gpt2_block("ff_layer/ffn_layer1/w", "mlp.c_fc.weight"),
    _gpt2_block("ff_layer/bias1/b", "mlp.c_fc.bias"),
    _gpt2_block("ff_layer/ffn_layer2/w", "mlp.c_proj.weight"),
    _gpt2_block("ff_layer/bias2/b", "mlp.c_proj.bias"),
)


def _t5_attention(stack: str, ours: str, theirs: str) -> tuple[Row, ...]:
    """T5's q, k, v and o of one attention of each block of ``stack``."""
    block = f"network/{stack}/{_LAYER}{ours}/"
    name = f"{stack}.block.{{}}.{theirs}."
    return (
        *(Row(f"{block}w_{x}", f"{name}{x}.weight", Layout.HEADS_IN) for x in "qkv"),
        Row(f"{block}w_post", f"{name}o.weight", Layout.HEADS_OUT),
    )


def _t5_block(stack: str, ours: str, theirs: str, layout: Layout = Layout.COPY) -> Row:
    return Row(f"network/{stack}/{_LAYER}{ours}", f"{stack}.block.{{}}.{theirs}", layout)


def _t5_feed_forward(stack: str, layer: int, gated: bool) -> tuple[Row, ...]:
    """A block's MLP: gated (``wi_0`` activated, ``wi_1`` its linear gate) or not (``wi``)."""
    mlp = f"layer.{layer}.DenseReluDense"
    ffn_layer1 = f"{mlp}.wi_0.weight" if gated else f"{mlp}.wi.weight"
    return (
        _t5_block(stack, "ff_layer/layer_norm/scale", f"layer.{layer}.layer_norm.weight"),
        _t5_block(stack, "ff_layer/ffn_layer1_gate/w", f"{mlp}.wi_1.weight", Layout.TRANSPOSE),
        _t5_block(stack, "ff_layer/ffn_layer1/w", ffn_layer1, Layout.TRANSPOSE),
        _t5_block(stack, "ff_layer/ffn_layer2/w", f"{mlp}.wo.weight", Layout.TRANSPOSE),
    )


_T5_SHARED_ROWS: Table = (
    Row("network/embedding/emb_var", "shared.weight", Layout.COPY),
    Row("network/softmax/emb_var", "shared.weight", Layout.COPY),  # Tied (T5 1.0).
    Row("network/softmax/w", "lm_head.weight", Layout.TRANSPOSE),
    *(
        Row(
            f"network/{stack}/relative_bias/rel_embedding",
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
            Layout.TRANSPOSE,
        )
        for stack in ("encoder", "decoder")
    ),
    Row("network/encoder_ln/scale", "encoder.final_layer_norm.weight", Layout.COPY),
    Row("network/decoder_ln/scale", "decoder.final_layer_norm.weight", Layout.COPY),
    *(
        _t5_block(stack, "layer_norm/scale", "layer.0.layer_norm.weight")
        for stack in ("encoder", "decoder")
    ),
    *_t5_attention("encoder", "self_attention", "layer.0.SelfAttention"),
    *_t5_attention("decoder", "self_attention", "layer.0.SelfAttention"),
    _t5_block("decoder", "cross_layer_norm/scale", "layer.1.layer_norm.weight"),
    *_t5_attention("decoder", "cross_attention", "layer.1.EncDecAttention"),
)


def t5_table(gated: bool) -> Table:
    """T5 (``T5ForConditionalGeneration``): one token table (``shared``), the logits through
    a separate ``lm_head`` (T5 1.1) or the table (T5 1.0), each stack's relative bias
    ``[buckets, N]`` held by its block 0, pre-norm blocks without biases, the MLP gated
    (T5 1.1, flan-t5) or not (T5 1.0)."""
    return (
        *_T5_SHARED_ROWS,
        *_t5_feed_forward("encoder", 1, gated),
        *_t5_feed_forward("decoder", 2, gated),
    )


def their_names(table: Table, ours: list[str]) -> dict[str, Named]:
    """``{our path: where Hugging Face keeps it}`` for each of ``ours`` the table names
    (the first row that matches wins; the layer number fills ``{}``; a scanned stack's
    path matches a block row with ``{}`` kept for :meth:`Named.layer_names`; ``{expert}`` is
    kept for :meth:`Named.tensor_names`)."""
    named = {}
    for path in ours:
        for row in table:
            experts = _EXPERT in row.theirs
            match = re.fullmatch(row.ours, path)
            if match:
                theirs = row.theirs.format(*match.groups(), expert=_EXPERT)
                named[path] = Named(theirs, row.layout, row.part, row.parts, experts=experts)
                break
            scanned = _LAYER in row.ours and re.fullmatch(
                row.ours.replace(_LAYER, _SCANNED_LAYERS), path
            )
            if scanned:
                named[path] = Named(
                    row.theirs, row.layout, row.part, row.parts, stacked=True, experts=experts
                )
                break
    return named


def their_shape(named: Named, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the Hugging Face tensor that holds our array of ``shape``."""
    layout, parts = named.layout, named.parts
    if layout is Layout.COPY:
        return shape
    if layout is Layout.TRANSPOSE:
        return shape[::-1]
    if layout in (Layout.HEADS_IN, Layout.CONV_HEADS_IN):
        d, n, h = shape
        return (parts * n * h, d) if layout is Layout.HEADS_IN else (d, parts * n * h)
    if layout is Layout.HEADS_OUT:
        n, h, d = shape
        return (d, n * h)
    if layout is Layout.CONV_HEADS_OUT:
        n, h, d = shape
        return (n * h, d)
    n, h = shape
    return (parts * n * h,)


def to_theirs(layout: Layout, array: np.ndarray) -> np.ndarray:
    """Our whole ``array`` in Hugging Face's layout (one part of a fused tensor: see
    :func:`fused`)."""
    if layout in (Layout.COPY, Layout.HEADS_BIAS):
        return array.reshape(-1) if layout is Layout.HEADS_BIAS else array
    if layout is Layout.TRANSPOSE:
        return array.T
    if layout is Layout.HEADS_IN:
        d = array.shape[0]
        return array.reshape(d, -1).T
    if layout is Layout.CONV_HEADS_IN:
        return array.reshape(array.shape[0], -1)
    n, h, d = array.shape
    out = array.reshape(n * h, d)
    return out.T if layout is Layout.HEADS_OUT else out


def fused(parts: list[tuple[Named, np.ndarray]]) -> np.ndarray:
    """Hugging Face's tensor from our arrays (in its layout) of each of its parts."""
    ordered = [array for named, array in sorted(parts, key=lambda p: p[0].part)]
    if len(ordered) == 1:
        return ordered[0]
    axis = 0 if parts[0][0].layout in (Layout.HEADS_IN, Layout.HEADS_BIAS) else -1
    return np.concatenate(ordered, axis=axis)


def read_stacked(
    named: Named,
    shape: tuple[int, ...],
    index: tuple[slice, ...],
    read_tensor: Callable[[int], SliceReader],
) -> np.ndarray:
    """As :func:`read_slice`, for an array whose :attr:`Named.split_dims` leading axes (a
    scanned stack's layers, the experts) pick the tensor: each tensor that ``index`` covers
    is read from ``read_tensor(i)``, ``i`` its place in :meth:`Named.tensor_names`; nothing
    of the others is read."""
    split = named.split_dims
    counts, inner = shape[:split], shape[split:]
    ranges = [range(*s.indices(c)) for s, c in zip(index[:split], counts, strict=True)]
    blocks = [
        read_slice(named, inner, index[split:], read_tensor(_flat(combo, counts)))
        for combo in itertools.product(*ranges)
    ]
    if not split:
        return blocks[0]
    return np.stack(blocks).reshape(*(len(r) for r in ranges), *blocks[0].shape)


def _flat(index: tuple[int, ...], counts: tuple[int, ...]) -> int:
    """The place of ``index`` among ``counts``' indices in C order (0 for none)."""
    return int(np.ravel_multi_index(index, counts)) if counts else 0


def read_slice(
    named: Named, shape: tuple[int, ...], index: tuple[slice, ...], read: SliceReader
) -> np.ndarray:
    """Our array's ``index`` (a device's slice of our ``shape``), read from Hugging Face's
    tensor through ``read`` (which gets slices of their layout)."""
    layout = named.layout
    index = tuple(slice(*s.indices(size)) for s, size in zip(index, shape, strict=True))
    if layout is Layout.COPY:
        return read(index)
    if layout is Layout.TRANSPOSE:
        return read(index[::-1]).T
    if layout in (Layout.HEADS_IN, Layout.CONV_HEADS_IN):
        d, n, h = index
        heads = _head_rows(named, n, shape[1], shape[2])
        cols = read((heads, d)).T if layout is Layout.HEADS_IN else read((d, heads))  # [d, n*H]
        return cols.reshape(d.stop - d.start, n.stop - n.start, shape[2])[:, :, h]
    if layout in (Layout.HEADS_OUT, Layout.CONV_HEADS_OUT):
        n, h, d = index
        heads = _head_rows(named, n, shape[0], shape[1])
        rows = read((d, heads)).T if layout is Layout.HEADS_OUT else read((heads, d))  # [n*H, d]
        return rows.reshape(n.stop - n.start, shape[1], d.stop - d.start)[:, h, :]
    n, h = index
    heads = _head_rows(named, n, shape[0], shape[1])
    return read((heads,)).reshape(n.stop - n.start, shape[1])[:, h]


def _head_rows(named: Named, heads: slice, num_heads: int, head_dim: int) -> slice:
    """Where ``heads`` are along the heads' axis of Hugging Face's (maybe fused) tensor."""
    start = named.part * num_heads * head_dim
    return slice(start + heads.start * head_dim, start + heads.stop * head_dim)
