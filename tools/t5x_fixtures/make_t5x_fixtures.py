"""Writes the flan-t5-style Hugging Face fixture's weights as a T5X legacy checkpoint.

Runs in paxlite's own venv (numpy, msgpack via flax, tensorstore, safetensors), by hand, from
the repository root:

    python tools/t5x_fixtures/make_t5x_fixtures.py tests/fixtures/hf/t5_flan tests/fixtures/t5x

Writes ``<out>/flan_legacy/`` as T5X's ``train.py`` leaves a model dir (learned from T5X's
``t5x/checkpoints.py``, ``t5x/adafactor.py``, ``t5x/gin_utils.py`` and
``t5x/examples/t5/{network,layers}.py``; no T5X code is used or copied):

- ``config.gin``: the operative gin config (``gin_utils.summarize_gin_config``), with the
  ``network.T5Config`` of the fixture's sizes;
- ``checkpoint_7/checkpoint``: a flax msgpack of ``{'version': 3, 'optimizer': {'target':
  params, 'state': {'step': 7, 'param_states': ...}}}`` whose large leaves are tensorstore
  spec dicts (zarr, kvstore ``gcs`` on ``t5x-dummy-bucket`` with the leaf's path joined by
  ``.``, as T5X writes from a ``gs://`` model dir) and whose small ones are arrays;
- ``checkpoint_7/<target|state>.<path>/``: the zarr arrays (gzip; ``decoder.logits_dense``
  zstd).

And ``<out>/flan_orbax/`` as T5X at HEAD saves by default (its orbax manager; this needs
orbax-checkpoint and jax, as paxlite's venv has): ``config.gin`` and ``checkpoint_7/`` holding
``_CHECKPOINT_METADATA`` and the ``state/`` item (``_METADATA``, the OCDBT database
``manifest.ocdbt`` + ``d/`` + ``ocdbt.process_0/``, one zarr array per leaf under the key
``target.<path>`` / ``state.step``); see :func:`write_orbax_checkpoint`.

T5X puts a leaf in tensorstore when it has logical axes (every parameter, Adafactor's
unfactored ``v`` and momentum ``m``) and inline otherwise (``step``, the factored ``v_row`` and
``v_col``, the ``(1,)`` placeholders). Here the layer norm scales and their ``v`` are inline as
well (which keeps the fixture under 300 KB), so both kinds of parameter leaves are read. The
weights are the Hugging Face fixture's, bit for bit: T5X's dense kernels are ``[in, out]`` with
heads joined (``[E, H*D]``; ``out``: ``[H*D, E]``), its relative bias ``[H, buckets]``; torch's
are ``[out, in]`` and ``[buckets, H]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil

import numpy as np
import tensorstore as ts
from flax import serialization
from safetensors.numpy import load_file

STEP = 7
VERSION = 3
_ZSTD = {"decoder/logits_dense/kernel"}


def t5x_params(hf: dict[str, np.ndarray], gated: bool) -> dict[str, np.ndarray]:
    """``{T5X path ('/' between keys): array}`` of the Hugging Face tensors ``hf``."""
    out = {
        "token_embedder/embedding": hf["shared.weight"],
        "decoder/logits_dense/kernel": hf["lm_head.weight"].T,
        "encoder/encoder_norm/scale": hf["encoder.final_layer_norm.weight"],
        "decoder/decoder_norm/scale": hf["decoder.final_layer_norm.weight"],
    }
    for stack in ("encoder", "decoder"):
        bias = hf[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        out[f"{stack}/relpos_bias/rel_embedding"] = bias.T
    # Per stack: (T5X's attention norm and module, Hugging Face's sub-layer and module) of
    # each attention, then the MLP's norm and sub-layer.
    attentions = {
        "encoder": [("pre_attention_layer_norm", "attention", 0, "SelfAttention")],
        "decoder": [
            ("pre_self_attention_layer_norm", "self_attention", 0, "SelfAttention"),
            ("pre_cross_attention_layer_norm", "encoder_decoder_attention", 1, "EncDecAttention"),
        ],
    }
    mlp_names = ("wi_0", "wi_1", "wo") if gated else ("wi", "wo")
    for stack, stack_attentions in attentions.items():
        layer = 0
        while f"{stack}.block.{layer}.layer.0.layer_norm.weight" in hf:
            ours, theirs = f"{stack}/layers_{layer}", f"{stack}.block.{layer}.layer"
            for norm, name, index, hf_name in stack_attentions:
                out[f"{ours}/{norm}/scale"] = hf[f"{theirs}.{index}.layer_norm.weight"]
                for x, t5x in zip("qkvo", ("query", "key", "value", "out"), strict=True):
                    out[f"{ours}/{name}/{t5x}/kernel"] = hf[
                        f"{theirs}.{index}.{hf_name}.{x}.weight"
                    ].T
            index = len(stack_attentions)
            out[f"{ours}/pre_mlp_layer_norm/scale"] = hf[f"{theirs}.{index}.layer_norm.weight"]
            for t5x in mlp_names:
                out[f"{ours}/mlp/{t5x}/kernel"] = hf[
                    f"{theirs}.{index}.DenseReluDense.{t5x}.weight"
                ].T
            layer += 1
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def adafactor_state(params: dict[str, np.ndarray], rng: np.random.Generator) -> dict:
    """T5X Adafactor's ``param_states`` (no momentum): a 2-D kernel or table factored (``v_row``
    without its largest dim, ``v_col`` without its second largest; ``v`` a ``(1,)`` zero), any
    other parameter with a whole ``v``; ``m`` a ``(1,)`` zero. Second moments are positive."""
    states = {}
    for path, value in params.items():
        placeholder = np.zeros((1,), np.float32)
        state = {"v_row": placeholder, "v_col": placeholder, "v": placeholder, "m": placeholder}
        factored = value.ndim == 2 and not path.endswith("rel_embedding")
        if factored:
            d1, d0 = np.argsort(value.shape, kind="stable")[-2:]
            state["v_row"] = rng.uniform(0.1, 1, np.delete(value.shape, d0)).astype(np.float32)
            state["v_col"] = rng.uniform(0.1, 1, np.delete(value.shape, d1)).astype(np.float32)
        else:
            state["v"] = rng.uniform(0.1, 1, value.shape).astype(np.float32)
        states[path] = state
    return states


def _write_zarr(step_dir: pathlib.Path, name: str, value: np.ndarray, compressor: str) -> dict:
    """Writes ``value`` as T5X does and returns the spec dict its msgpack holds."""
    metadata = {
        "compressor": {
            "id": compressor,
        },
        "shape": list(value.shape),
    }
    metadata["chunks"] = list(value.shape) or []
    spec = {
        "driver": "zarr",
        "dtype": np.dtype(value.dtype).name,
        "kvstore": {"driver": "gcs", "bucket": "t5x-dummy-bucket"},
        "path": name,
        "metadata": metadata,
    }
    written = ts.Spec(spec).to_json()  # T5X stores the spec as tensorstore spells it.
    local = dict(written, kvstore={"driver": "file", "path": str(step_dir / name)})
    ts.open(local, create=True, open=True).result().write(value).result()
    return written


def _nest(flat: dict[str, object]) -> dict:
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, last = path.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return tree


def write_checkpoint(model_dir: pathlib.Path, params: dict[str, np.ndarray]) -> None:
    step_dir = model_dir / f"checkpoint_{STEP}"
    if step_dir.exists():
        shutil.rmtree(step_dir)
    step_dir.mkdir(parents=True)
    target = {}
    for path, value in params.items():
        if path.endswith("/scale"):
            target[path] = value  # Inline (forced here: see the module docstring).
        else:
            compressor = "zstd" if path in _ZSTD else "gzip"
            target[path] = _write_zarr(
                step_dir, f"target.{path.replace('/', '.')}", value, compressor
            )
    param_states = {}
    for path, state in adafactor_state(params, np.random.default_rng(0)).items():
        for key, value in state.items():
            name = f"state.param_states.{path.replace('/', '.')}.{key}"
            in_tensorstore = key == "v" and value.shape != (1,) and not path.endswith("/scale")
            param_states[f"{path}/{key}"] = (
                _write_zarr(step_dir, name, value, "gzip") if in_tensorstore else value
            )
    contents = {
        "version": VERSION,
        "optimizer": {
            "target": _nest(target),
            "state": {"step": np.int32(STEP), "param_states": _nest(param_states)},
        },
    }
    (step_dir / "checkpoint").write_bytes(serialization.msgpack_serialize(contents))


def write_orbax_checkpoint(model_dir: pathlib.Path, params: dict[str, np.ndarray]) -> None:
    """Writes ``params`` as T5X's orbax manager (``OrbaxCheckpointManagerInterface``) saves a
    step: an ``ocp.CheckpointManager`` with step prefix ``checkpoint`` whose ``state`` item is
    a ``PyTreeCheckpointHandler(use_ocdbt=True)`` save of the train state's ``state_dict()``
    (no ``version``/``optimizer`` wrapper), each leaf with a default ``ocp.SaveArgs()``.

    The state dict is an ``InferenceState``'s (``{'target': params, 'state': {'step'}}``):
    Adafactor's slots would add ~200 KB (mostly orbax's per-leaf ``_METADATA``) and nothing
    the legacy fixture does not already cover.
    """
    import jax  # Only this writer needs jax and orbax.
    import orbax.checkpoint as ocp

    if model_dir.exists():
        shutil.rmtree(model_dir)
    state_dict = {"target": _nest(params), "state": {"step": np.asarray(STEP, np.int32)}}
    options = ocp.CheckpointManagerOptions(
        step_prefix="checkpoint", enable_async_checkpointing=False
    )
    manager = ocp.CheckpointManager(
        model_dir.absolute(),
        item_handlers={"state": ocp.PyTreeCheckpointHandler(use_ocdbt=True)},
        options=options,
    )
    save_args = jax.tree_util.tree_map(lambda _: ocp.SaveArgs(), state_dict)
    state = ocp.args.PyTreeSave(state_dict, save_args=save_args)
    manager.save(STEP, args=ocp.args.Composite(state=state))
    manager.wait_until_finished()
    manager.close()


def gin_config(config: dict) -> str:
    """The operative config T5X writes to ``<model_dir>/config.gin`` (the network part and the
    optimizer: the rest of a real one, data and trainer, says nothing of the weights)."""
    gated = config.get("feed_forward_proj", "relu").startswith("gated")
    act = config.get("dense_act_fn", "relu").replace("gelu_new", "gelu")
    activations = f"('{act}', 'linear')" if gated else f"('{act}',)"
    fields = {
        "dropout_rate": "%DROPOUT_RATE",
        "dtype": "'float32'",
        "emb_dim": config["d_model"],
        "head_dim": config["d_kv"],
        "logits_via_embedding": "False" if gated else "True",
        "mlp_activations": activations,
        "mlp_dim": config["d_ff"],
        "num_decoder_layers": config["num_decoder_layers"],
        "num_encoder_layers": config["num_layers"],
        "num_heads": config["num_heads"],
        "vocab_size": config["vocab_size"],
    }
    rule = "# " + "=" * 78
    lines = [
        "from __gin__ import dynamic_registration",
        "from t5x import adafactor",
        "from t5x import models",
        "from t5x.examples.t5 import network",
        "",
        "# Macros:",
        rule,
        "DROPOUT_RATE = 0.0",
        "MODEL = @models.EncoderDecoderModel()",
        "OPTIMIZER = @adafactor.Adafactor()",
        "",
        "# Parameters for adafactor.Adafactor:",
        rule,
        "adafactor.Adafactor.decay_rate = 0.8",
        "adafactor.Adafactor.step_offset = 0",
        "",
        "# Parameters for models.EncoderDecoderModel:",
        rule,
        "models.EncoderDecoderModel.module = @network.Transformer()",
        "models.EncoderDecoderModel.optimizer_def = %OPTIMIZER",
        "",
        "# Parameters for network.T5Config:",
        rule,
        *(f"network.T5Config.{k} = {v}" for k, v in fields.items()),
        "",
        "# Parameters for network.Transformer:",
        rule,
        "network.Transformer.config = @network.T5Config()",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    args = parser.parse_args()
    config = json.loads((args.hf_dir / "config.json").read_text())
    gated = config.get("feed_forward_proj", "relu").startswith("gated")
    params = t5x_params(load_file(args.hf_dir / "model.safetensors"), gated)
    model_dir = args.out / "flan_legacy"
    write_checkpoint(model_dir, params)
    (model_dir / "config.gin").write_text(gin_config(config))
    orbax_dir = args.out / "flan_orbax"
    write_orbax_checkpoint(orbax_dir, params)
    (orbax_dir / "config.gin").write_text(gin_config(config))


if __name__ == "__main__":
    main()
