"""Hugging Face's tensor names and layouts for our parameters: the name-and-layout table.

A row of a :data:`Table` pairs a regex on our parameter paths (flat, ``/`` between keys,
without ``params/``) with the name of Hugging Face's tensor (``{}`` takes the regex's
group: the layer number) and the :class:`Layout` between the two arrays. Layouts need no
model sizes: each follows from our array's shape. Shapes: ``D`` model dims, ``N`` heads,
``H`` dims per head, ``F`` hidden dims, ``V`` vocabulary; torch's ``Linear.weight`` is
``[out, in]``.

A device's slice of one of our arrays is read from the matching slice of Hugging Face's
tensor (:func:`read_slice`): nothing outside it is read, except whole heads' dims when
our slice splits ``H`` (it never does under the usual rules).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable

import numpy as np

#: ``index`` (a tuple of slices of Hugging Face's tensor) -> those values.
SliceReader = Callable[[tuple[slice, ...]], np.ndarray]


class Layout(enum.Enum):
    """How one of our arrays is stored in Hugging Face's tensor."""

    COPY = "same shape"  # norms' scales, embedding tables [V, D], biases [D]
    TRANSPOSE = "[out, in] of our [in, out]"  # feed-forward and lm_head weights
    HEADS_IN = "[N*H, D] of our [D, N, H]"  # q/k/v projections
    HEADS_OUT = "[D, N*H] of our [N, H, D]"  # the attention output projection
    HEADS_BIAS = "[N*H] of our [N, H]"  # q/k/v biases


@dataclasses.dataclass(frozen=True)
class Row:
    """Our parameter paths matching ``ours`` (a regex) are Hugging Face's ``theirs``."""

    ours: str
    theirs: str
    layout: Layout


Table = tuple[Row, ...]


def _in_block(ours: str, theirs: str, layout: Layout) -> Row:
    """A row of each Transformer block's parameters."""
    return Row(r"lm/transformer/x_layers_(\d+)/" + ours, "model.layers.{}." + theirs, layout)


#: Llama and the families built like it (Mistral, Qwen2, Qwen3): a row whose parameter
#: a model lacks (biases, q/k norms, a tied lm_head) is simply not used.
LLAMA_TABLE: Table = (
    Row("lm/embedding/emb_var", "model.embed_tokens.weight", Layout.COPY),
    Row("lm/softmax/emb_var", "model.embed_tokens.weight", Layout.COPY),  # Tied.
    Row("lm/softmax/w", "lm_head.weight", Layout.TRANSPOSE),
    Row("lm/final_ln/scale", "model.norm.weight", Layout.COPY),
    _in_block("layer_norm/scale", "input_layernorm.weight", Layout.COPY),
    *(_in_block(f"self_attention/w_{x}", f"self_attn.{x}_proj.weight", Layout.HEADS_IN)
      for x in "qkv"),
    *(_in_block(f"self_attention/b_{x}", f"self_attn.{x}_proj.bias", Layout.HEADS_BIAS)
      for x in "qkv"),
    _in_block("self_attention/w_post", "self_attn.o_proj.weight", Layout.HEADS_OUT),
    _in_block("self_attention/b_post", "self_attn.o_proj.bias", Layout.COPY),
    _in_block("self_attention/query_norm/scale", "self_attn.q_norm.weight", Layout.COPY),
    _in_block("self_attention/key_norm/scale", "self_attn.k_norm.weight", Layout.COPY),
    _in_block("ff_layer/layer_norm/scale", "post_attention_layernorm.weight", Layout.COPY),
    _in_block("ff_layer/ffn_layer1/w", "mlp.gate_proj.weight", Layout.TRANSPOSE),
    _in_block("ff_layer/ffn_layer1_gate/w", "mlp.up_proj.weight", Layout.TRANSPOSE),
    _in_block("ff_layer/ffn_layer2/w", "mlp.down_proj.weight", Layout.TRANSPOSE),
)  # fmt: skip


def their_names(table: Table, ours: list[str]) -> dict[str, tuple[str, Layout]]:
    """``{our path: (Hugging Face's name, layout)}`` for each of ``ours`` the table names
    (the first row that matches wins)."""
    named = {}
    for path in ours:
        for row in table:
            match = re.fullmatch(row.ours, path)
            if match:
                named[path] = (row.theirs.format(*match.groups()), row.layout)
                break
    return named


def their_shape(layout: Layout, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape Hugging Face stores our array of ``shape`` in."""
    if layout is Layout.COPY:
        return shape
    if layout is Layout.TRANSPOSE:
        return shape[::-1]
    if layout is Layout.HEADS_IN:
        d, n, h = shape
        return (n * h, d)
    if layout is Layout.HEADS_OUT:
        n, h, d = shape
        return (d, n * h)
    n, h = shape
    return (n * h,)


def to_theirs(layout: Layout, array: np.ndarray) -> np.ndarray:
    """Our whole ``array`` in Hugging Face's layout (for saving)."""
    shape = their_shape(layout, array.shape)
    if layout in (Layout.COPY, Layout.HEADS_BIAS):
        return array.reshape(shape)
    if layout is Layout.TRANSPOSE:
        return array.T
    if layout is Layout.HEADS_IN:
        return array.reshape(shape[1], shape[0]).T
    n, h, d = array.shape
    return array.reshape(n * h, d).T


def read_slice(
    layout: Layout, shape: tuple[int, ...], index: tuple[slice, ...], read: SliceReader
) -> np.ndarray:
    """Our array's ``index`` (a device's slice of our ``shape``), read from Hugging Face's
    tensor through ``read`` (which gets slices of their layout)."""
    index = tuple(slice(*s.indices(size)) for s, size in zip(index, shape, strict=True))
    if layout is Layout.COPY:
        return read(index)
    if layout is Layout.TRANSPOSE:
        return read(index[::-1]).T
    if layout is Layout.HEADS_IN:
        d, n, h = index
        rows = read((_head_rows(n, shape[2]), d))  # [n*H, d]
        return rows.T.reshape(d.stop - d.start, n.stop - n.start, shape[2])[:, :, h]
    if layout is Layout.HEADS_OUT:
        n, h, d = index
        cols = read((d, _head_rows(n, shape[1])))  # [d, n*H]
        return cols.T.reshape(n.stop - n.start, shape[1], d.stop - d.start)[:, h, :]
    n, h = index
    return read((_head_rows(n, shape[1]),)).reshape(n.stop - n.start, shape[1])[:, h]


def _head_rows(heads: slice, head_dim: int) -> slice:
    """The rows of Hugging Face's ``[N*H, ...]`` that hold ``heads``."""
    return slice(heads.start * head_dim, heads.stop * head_dim)
