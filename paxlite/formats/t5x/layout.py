"""T5X's parameter names and layouts for our T5: the name-and-layout table.

T5X's ``t5x/examples/t5/network.py`` (``Transformer``) names its parameters
``token_embedder/embedding [V, E]``, ``{encoder,decoder}/relpos_bias/rel_embedding [N,
buckets]``, ``encoder/layers_{i}/{pre_attention_layer_norm, attention, pre_mlp_layer_norm,
mlp}``, ``decoder/layers_{i}/{pre_self_attention_layer_norm, self_attention,
pre_cross_attention_layer_norm, encoder_decoder_attention, pre_mlp_layer_norm, mlp}``,
``encoder/encoder_norm``, ``decoder/decoder_norm`` and ``decoder/logits_dense/kernel [E, V]``
(absent when ``logits_via_embedding``). Its ``DenseGeneral`` stores every kernel as 2-D
``[in, out]`` with heads joined: ``query``/``key``/``value`` ``[E, N*H]`` (our ``[D, N, H]``
reshaped), ``out`` ``[N*H, E]`` (our ``[N, H, D]``), the MLP's ``wi``/``wi_0``/``wi_1``/``wo``
as ours. Those are :class:`hf_layout.Layout`'s ``CONV_HEADS_IN``/``CONV_HEADS_OUT``/``COPY``,
so the rows are :class:`hf_layout.Row` and are read with ``hf_layout.read_slice``; ``{}`` in
T5X's name is the layer.
"""

from __future__ import annotations

from paxlite.formats.hf.layout import Layout, Row, Table

_LAYER = r"x_layers_(\d+)/"


def _block(stack: str, ours: str, theirs: str, layout: Layout = Layout.COPY) -> Row:
    return Row(f"network/{stack}/{_LAYER}{ours}", f"{stack}/layers_{{}}/{theirs}", layout)


def _attention(stack: str, ours: str, theirs: str) -> tuple[Row, ...]:
    """q, k, v and the output projection of one attention of each block of ``stack``."""
    return (
        *(
            _block(stack, f"{ours}/w_{x}", f"{theirs}/{t5x}/kernel", Layout.CONV_HEADS_IN)
            for x, t5x in zip("qkv", ("query", "key", "value"), strict=True)
        ),
        _block(stack, f"{ours}/w_post", f"{theirs}/out/kernel", Layout.CONV_HEADS_OUT),
    )


def _mlp(stack: str, gated: bool) -> tuple[Row, ...]:
    """A block's MLP: gated (``wi_0`` activated, ``wi_1`` its linear gate) or not (``wi``)."""
    return (
        _block(stack, "ff_layer/layer_norm/scale", "pre_mlp_layer_norm/scale"),
        _block(stack, "ff_layer/ffn_layer1/w", "mlp/wi_0/kernel" if gated else "mlp/wi/kernel"),
        _block(stack, "ff_layer/ffn_layer1_gate/w", "mlp/wi_1/kernel"),
        _block(stack, "ff_layer/ffn_layer2/w", "mlp/wo/kernel"),
    )


def t5x_table(gated: bool) -> Table:
    """T5X's ``network.Transformer`` (T5 1.1 and flan-t5 gated, T5 1.0 not): one token table,
    the logits through ``logits_dense`` or the table (tied), a relative bias per stack."""
    return (
        Row("network/embedding/emb_var", "token_embedder/embedding", Layout.COPY),
        Row("network/softmax/emb_var", "token_embedder/embedding", Layout.COPY),  # Tied.
        Row("network/softmax/w", "decoder/logits_dense/kernel", Layout.COPY),
        *(
            Row(
                f"network/{stack}/relative_bias/rel_embedding",
                f"{stack}/relpos_bias/rel_embedding",
                Layout.COPY,
            )
            for stack in ("encoder", "decoder")
        ),
        Row("network/encoder_ln/scale", "encoder/encoder_norm/scale", Layout.COPY),
        Row("network/decoder_ln/scale", "decoder/decoder_norm/scale", Layout.COPY),
        _block("encoder", "layer_norm/scale", "pre_attention_layer_norm/scale"),
        *_attention("encoder", "self_attention", "attention"),
        *_mlp("encoder", gated),
        _block("decoder", "layer_norm/scale", "pre_self_attention_layer_norm/scale"),
        *_attention("decoder", "self_attention", "self_attention"),
        _block("decoder", "cross_layer_norm/scale", "pre_cross_attention_layer_norm/scale"),
        *_attention("decoder", "cross_attention", "encoder_decoder_attention"),
        *_mlp("decoder", gated),
    )
