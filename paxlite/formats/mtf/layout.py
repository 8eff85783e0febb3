"""Mesh TensorFlow's T5 names and layouts for our T5: the name-and-layout table.

MTF's T5 (``mesh_tensorflow.transformer``, as T5X's ``checkpoint_importer.py`` maps it) names
its variables ``shared/embedding [V, D]``, ``{encoder,decoder}/block_NNN/layer_NNN/...``
(``NNN`` three digits): the encoder's ``layer_000`` is its self-attention and ``layer_001``
its MLP; the decoder's ``layer_000`` self-attention, ``layer_001`` the attention to the
encoder (``EncDecAttention``), ``layer_002`` the MLP. An attention's ``q``, ``k``, ``v`` are
``[D, N*H]`` and ``o`` ``[N*H, D]`` (T5X's layouts: :class:`hf_layout.Layout`'s
``CONV_HEADS_IN``/``CONV_HEADS_OUT``), each stack's relative bias ``[N, buckets]`` is held by
``block_000/layer_000/SelfAttention/relative_attention_bias`` (shared by the stack), the MLP
is ``DenseReluDense/wi/kernel`` or ``wi_0``/``wi_1`` (gated) and ``wo/kernel``, each sub-layer
starts with a norm scale (``layer_norm/scale``, or ``rms_norm/scale`` in T5 1.1's), each
stack ends with one (``final_layer_norm/scale`` or ``rms_norm/scale``), and the logits are
``decoder/logits/kernel [D, V]`` or the shared table (T5 1.0). Adafactor keeps a variable's
second moment as ``<name>_slot_vr``/``_slot_vc`` (factored) or ``<name>_slot_v``: T5X's
``v_row``/``v_col``/``v``. ``{}`` in MTF's name is the block.
"""

from __future__ import annotations

import dataclasses

from paxlite.formats.hf.layout import Layout, Row, Table

_LAYER = r"x_layers_(\d+)/"
SHARED_EMBEDDING = "shared/embedding"
LOGITS = "decoder/logits/kernel"
GLOBAL_STEP = "global_step"
#: MTF's Adafactor slot suffixes -> T5X's slot names.
SLOTS = {"_slot_vr": "v_row", "_slot_vc": "v_col", "_slot_v": "v"}
#: A stack's first relative bias; any other block's means a bias per block.
RELATIVE_BIAS = "{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"


@dataclasses.dataclass(frozen=True)
class Names:
    """How a checkpoint spells what varies between MTF's T5s.

    Attributes:
      norm: the block norms' scope, 'layer_norm' (T5 1.0) or 'rms_norm' (T5 1.1).
      final_norm: the stacks' last norm, 'final_layer_norm' or 'rms_norm'.
      gated: the MLP is ``wi_0``/``wi_1`` (else ``wi``).
    """

    norm: str
    final_norm: str
    gated: bool


def block_name(stack: str, layer: int, rest: str) -> str:
    """MTF's name of ``rest`` in sub-layer ``layer`` of each block of ``stack``."""
    return f"{stack}/block_{{:0>3}}/layer_{layer:03d}/{rest}"


def _block(stack: str, ours: str, layer: int, theirs: str, layout: Layout = Layout.COPY) -> Row:
    return Row(f"network/{stack}/{_LAYER}{ours}", block_name(stack, layer, theirs), layout)


def _attention(stack: str, ours: str, layer: int, theirs: str) -> tuple[Row, ...]:
    return (
        *(
            _block(stack, f"{ours}/w_{x}", layer, f"{theirs}/{x}", Layout.CONV_HEADS_IN)
            for x in "qkv"
        ),
        _block(stack, f"{ours}/w_post", layer, f"{theirs}/o", Layout.CONV_HEADS_OUT),
    )


def _mlp(stack: str, layer: int, names: Names) -> tuple[Row, ...]:
    first = "wi_0" if names.gated else "wi"
    return (
        _block(stack, "ff_layer/layer_norm/scale", layer, f"{names.norm}/scale"),
        _block(stack, "ff_layer/ffn_layer1/w", layer, f"DenseReluDense/{first}/kernel"),
        _block(stack, "ff_layer/ffn_layer1_gate/w", layer, "DenseReluDense/wi_1/kernel"),
        _block(stack, "ff_layer/ffn_layer2/w", layer, "DenseReluDense/wo/kernel"),
    )


def mtf_table(names: Names) -> Table:
    """MTF's T5: one shared table, the logits through ``decoder/logits`` or the table (tied),
    a relative bias per stack in its first block."""
    return (
        Row("network/embedding/emb_var", SHARED_EMBEDDING, Layout.COPY),
        Row("network/softmax/emb_var", SHARED_EMBEDDING, Layout.COPY),  # Tied.
        Row("network/softmax/w", LOGITS, Layout.COPY),
        *(
            Row(
                f"network/{stack}/relative_bias/rel_embedding",
                RELATIVE_BIAS.format(stack=stack),
                Layout.COPY,
            )
            for stack in ("encoder", "decoder")
        ),
        Row("network/encoder_ln/scale", f"encoder/{names.final_norm}/scale", Layout.COPY),
        Row("network/decoder_ln/scale", f"decoder/{names.final_norm}/scale", Layout.COPY),
        _block("encoder", "layer_norm/scale", 0, f"{names.norm}/scale"),
        *_attention("encoder", "self_attention", 0, "SelfAttention"),
        *_mlp("encoder", 1, names),
        _block("decoder", "layer_norm/scale", 0, f"{names.norm}/scale"),
        *_attention("decoder", "self_attention", 0, "SelfAttention"),
        _block("decoder", "cross_layer_norm/scale", 1, f"{names.norm}/scale"),
        *_attention("decoder", "cross_attention", 1, "EncDecAttention"),
        *_mlp("decoder", 2, names),
    )


def expected_names(names: Names, blocks: dict[str, int], tied: bool) -> list[str]:
    """The parameters an MTF T5 spelled ``names`` with ``blocks`` per stack has (``tied``:
    its logits are the shared table's)."""
    attentions = {"encoder": ("SelfAttention",), "decoder": ("SelfAttention", "EncDecAttention")}
    mlp = ("wi_0", "wi_1", "wo") if names.gated else ("wi", "wo")
    out = [SHARED_EMBEDDING] + ([] if tied else [LOGITS])
    for stack, count in blocks.items():
        out += [RELATIVE_BIAS.format(stack=stack), f"{stack}/{names.final_norm}/scale"]
        for block in range(count):
            for layer, attention in enumerate(attentions[stack]):
                prefix = block_name(stack, layer, "").format(block)
                out += [f"{prefix}{attention}/{x}" for x in "qkvo"]
                out.append(f"{prefix}{names.norm}/scale")
            prefix = block_name(stack, len(attentions[stack]), "").format(block)
            out += [f"{prefix}DenseReluDense/{w}/kernel" for w in mlp]
            out.append(f"{prefix}{names.norm}/scale")
    return out
