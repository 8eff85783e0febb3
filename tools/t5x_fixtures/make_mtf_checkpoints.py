"""Writes the Hugging Face T5 fixtures' weights as Mesh TensorFlow T5 checkpoints, with
TensorFlow itself (``tf.compat.v1`` variables under MTF's names, saved by
``tf.compat.v1.train.Saver``), as the T5 library's ``gs://t5-data/pretrained_models/...``
directories hold them.

Runs in paxlite's own venv (TensorFlow comes with SeqIO), by hand, from the repository root:

    python tools/t5x_fixtures/make_mtf_checkpoints.py tests/fixtures/hf tests/fixtures/mtf

Writes, each with a ``checkpoint`` state file, ``model.ckpt-<step>.index`` and
``model.ckpt-<step>.data-00000-of-00001`` and an ``operative_config.gin``:

- ``t5_1_1/``: ``t5_flan``'s weights (gated-GELU, a separate ``decoder/logits``) in float32
  under T5 1.1's norm names (``rms_norm``), with Adafactor's slots (``_slot_vr``/``_slot_vc``
  of 2-D variables, ``_slot_v`` of the rest) and ``global_step`` 1000;
- ``t5_1_0_bf16/``: ``t5_v1_0``'s (ReLU, logits through the shared table) in bfloat16 under
  T5 1.0's names (``layer_norm``, ``final_layer_norm``), step 500;
- ``per_block_bias/``: ``t5_v1_0``'s with a relative attention bias in every block, as MTF's
  ``relative_attention_type='bias'`` writes;
- ``decoder_only/``: a few variables of MTF's decoder-only ``transformer/`` form.

MTF's layouts (the names are T5X's ``checkpoint_importer.py``'s, the shapes Hugging Face's
``load_tf_weights_in_t5``'s transposes): dense kernels ``[in, out]`` (q/k/v ``[d_model,
heads*d_kv]``, o ``[heads*d_kv, d_model]``), the relative bias ``[heads, buckets]``, the
shared table ``[vocab, d_model]``, ``decoder/logits/kernel`` ``[d_model, vocab]``. Adafactor's
slots are MTF Adafactor's (``_factored_dims``): ``_slot_vr`` keeps the smaller dim of a 2-D
variable and, of two equal dims, the second (T5X's ``v_row`` keeps the first: T5X's importer,
which copies the slots unchanged, swaps a square kernel's).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import numpy as np
from safetensors.numpy import load_file

_OPERATIVE_CONFIG = """\
import mesh_tensorflow.optimize
import mesh_tensorflow.transformer.transformer_layers
import t5.models.mesh_transformer

# Macros:
# ==============================================================================
d_ff = {d_ff}
d_kv = {d_kv}
d_model = {d_model}
dropout_rate = 0.1
num_heads = {num_heads}
num_layers = {num_layers}

# Parameters for adafactor_decay_rate_pow:
# ==============================================================================
adafactor_decay_rate_pow.offset = 0

# Parameters for DenseReluDense:
# ==============================================================================
DenseReluDense.activation = {activation}
DenseReluDense.dropout_rate = %dropout_rate
DenseReluDense.hidden_size = %d_ff
DenseReluDense.use_bias = False

# Parameters for decoder/DenseReluDense:
# ==============================================================================
decoder/DenseReluDense.activation = {activation}

# Parameters for SelfAttention:
# ==============================================================================
SelfAttention.key_value_size = %d_kv
SelfAttention.num_heads = %num_heads
SelfAttention.relative_attention_type = '{relative}'

# Parameters for Unitransformer:
# ==============================================================================
decoder/Unitransformer.shared_embedding_and_softmax_weights = {tied}

# Parameters for SentencePieceVocabulary:
# ==============================================================================
SentencePieceVocabulary.sentencepiece_model_file = \\
    'gs://t5-data/vocabs/cc_all.32000/sentencepiece.model'
"""


def mtf_variables(hf: dict[str, np.ndarray], norm: str) -> dict[str, np.ndarray]:
    """Hugging Face T5 tensors under MTF's names and layouts (``norm``: 'rms_norm' or
    'layer_norm', the block norms' name)."""
    out = {"shared/embedding": hf["shared.weight"]}
    final = "rms_norm" if norm == "rms_norm" else "final_layer_norm"
    for name, value in hf.items():
        found = re.fullmatch(r"(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)\.weight", name)
        if found:
            stack, block, layer, rest = found.groups()
            prefix = f"{stack}/block_{int(block):03d}/layer_{int(layer):03d}/"
            out[prefix + _mtf_leaf(rest, norm)] = _mtf_layout(rest, value)
        elif name.endswith("final_layer_norm.weight"):
            out[f"{name.split('.')[0]}/{final}/scale"] = value
    if "lm_head.weight" in hf:
        out["decoder/logits/kernel"] = hf["lm_head.weight"].T
    return out


def _mtf_leaf(rest: str, norm: str) -> str:
    if rest == "layer_norm":
        return f"{norm}/scale"
    attention, _, matrix = rest.rpartition(".")
    if matrix == "relative_attention_bias":
        return f"{attention}/relative_attention_bias"
    if attention.endswith("DenseReluDense"):
        return f"DenseReluDense/{matrix}/kernel"
    return f"{attention}/{matrix}"


def _mtf_layout(rest: str, value: np.ndarray) -> np.ndarray:
    """torch's ``[out, in]`` Linear weights and ``[buckets, heads]`` bias transposed."""
    return value if value.ndim == 1 else np.ascontiguousarray(value.T)


def adafactor_slots(variables: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Positive second moments: ``_slot_vr`` (the smaller dim kept) and ``_slot_vc`` of 2-D
    variables, ``_slot_v`` of the rest."""
    rng = np.random.default_rng(seed)
    slots = {}
    for name, value in variables.items():
        if value.ndim == 2:  # MTF's _factored_dims: of two equal dims, vr keeps the second.
            row = 0 if value.shape[0] < value.shape[1] else 1
            slots[name + "_slot_vr"] = rng.uniform(0.1, 1.0, value.shape[row]).astype(np.float32)
            slots[name + "_slot_vc"] = rng.uniform(0.1, 1.0, value.shape[1 - row]).astype(
                np.float32
            )
        else:
            slots[name + "_slot_v"] = rng.uniform(0.1, 1.0, value.shape).astype(np.float32)
    return slots


def save(out: pathlib.Path, variables: dict[str, np.ndarray], step: int, dtype: str) -> None:
    """Saves ``variables`` (cast to ``dtype``; slots stay float32) and ``global_step`` with
    ``tf.compat.v1.train.Saver`` as ``out/model.ckpt-<step>``."""
    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        tf_vars = {}
        for name, value in variables.items():
            cast = tf.bfloat16 if dtype == "bfloat16" and "_slot_" not in name else tf.float32
            initial = tf.cast(tf.constant(value.astype(np.float32)), cast)
            tf_vars[name] = tf.compat.v1.Variable(initial, name="v")
        tf_vars["global_step"] = tf.compat.v1.Variable(np.int64(step), name="global_step")
        saver = tf.compat.v1.train.Saver(var_list=tf_vars, save_relative_paths=True)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(out / "model.ckpt"), global_step=step, write_meta_graph=False)


def write(hf_dir: pathlib.Path, out: pathlib.Path, variant: str) -> None:
    hf = load_file(hf_dir / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text())
    gated = "lm_head.weight" in hf
    norm = "rms_norm" if gated else "layer_norm"
    variables = mtf_variables(hf, norm)
    relative = "bias_shared"
    if variant == "t5_1_1":
        variables.update(adafactor_slots(variables, seed=0))
        step, dtype = 1000, "float32"
    elif variant == "t5_1_0_bf16":
        step, dtype = 500, "bfloat16"
    else:  # per_block_bias: every block of each stack has its own bias.
        rng = np.random.default_rng(1)
        for stack, blocks in (("encoder", config["num_layers"]), ("decoder", 2)):
            bias = variables[f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"]
            for block in range(1, blocks):
                name = f"{stack}/block_{block:03d}/layer_000/SelfAttention/relative_attention_bias"
                variables[name] = rng.normal(size=bias.shape).astype(np.float32)
        step, dtype, relative = 100, "float32", "bias"
    save(out, variables, step, dtype)
    activation = "['gelu', 'linear']" if gated else "'relu'"
    (out / "operative_config.gin").write_text(
        _OPERATIVE_CONFIG.format(
            d_ff=config["d_ff"],
            d_kv=config["d_kv"],
            d_model=config["d_model"],
            num_heads=config["num_heads"],
            num_layers=config["num_layers"],
            activation=activation,
            relative=relative,
            tied=not gated,
        )
    )


def write_decoder_only(out: pathlib.Path) -> None:
    """MTF's decoder-only LM form (``transformer/``), which paxlite's T5 is not."""
    rng = np.random.default_rng(2)
    variables = {
        "shared/embedding": rng.normal(size=(16, 8)).astype(np.float32),
        "transformer/block_000/layer_000/SelfAttention/q": rng.normal(size=(8, 8)),
        "transformer/block_000/layer_000/rms_norm/scale": np.ones(8),
        "transformer/rms_norm/scale": np.ones(8),
    }
    save(out, {k: np.asarray(v, np.float32) for k, v in variables.items()}, 10, "float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hf_fixtures", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    args = parser.parse_args()
    write(args.hf_fixtures / "t5_flan", args.out / "t5_1_1", "t5_1_1")
    write(args.hf_fixtures / "t5_v1_0", args.out / "t5_1_0_bf16", "t5_1_0_bf16")
    write(args.hf_fixtures / "t5_v1_0", args.out / "per_block_bias", "per_block_bias")
    write_decoder_only(args.out / "decoder_only")


if __name__ == "__main__":
    main()
