"""Hugging Face models in and out: Llama 2/3, Mistral, Qwen2 and Qwen3 directories that
transformers wrote (tests/fixtures/hf, made by tools/hf_fixtures/make_fixtures.py).

Oracles: the logits and greedy tokens transformers computed for each fixture; the arrays
of the safetensors files themselves for the per-device reads; a reload of what
save_pretrained wrote.
"""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding
from safetensors import safe_open

from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from paxlite.pretrained import loading
from paxlite.pretrained.loading import PretrainedError, from_pretrained
from paxlite.runtime.mesh import create_mesh
from praxis_lite import config as config_lib
from praxis_lite.sharding import FSDP_AND_TENSOR_PARALLEL_RULES, filter_rules_for_mesh
from tests import FIXTURES, cpu_xla_flags

_HF = FIXTURES / "hf"
FAMILIES = ["llama2", "llama3", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2"]


def _outputs(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(_HF / name / "outputs.npz"))


def _assert_logits(got: np.ndarray, want: np.ndarray) -> None:
    """Within 1e-4 of the logits' scale."""
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=0)


def _greedy_matches(got: np.ndarray, want: np.ndarray, eos: set[int]) -> None:
    """Equal up to and including the first EOS (transformers stops there)."""
    n = len(want)
    stop = next((i + 1 for i, t in enumerate(want) if int(t) in eos), n)
    np.testing.assert_array_equal(got[:stop], want[:stop])


#: Fixtures saved back in shards of 60 KB (several files and an index).
SHARDED = ("qwen3", "qwen3_moe")


def load_and_resave(name: str, tmp_path_factory) -> tuple:
    """(name, fixture ``name`` loaded on the 8 fake devices, the directory it was saved to)."""
    lm = from_pretrained(_HF / name)
    saved = tmp_path_factory.mktemp("saved") / name
    max_shard = 60_000 if name in SHARDED else hf_checkpoint.DEFAULT_MAX_SHARD_BYTES
    lm.save_pretrained(saved, max_shard_bytes=max_shard)
    return name, lm, saved


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, tmp_path_factory):
    return load_and_resave(request.param, tmp_path_factory)


def assert_logits_and_greedy(name: str, lm) -> np.ndarray:
    """``lm``'s logits and greedy tokens are fixture ``name``'s (transformers'); returns
    the greedy tokens ``[2, N]``."""
    out = _outputs(name)
    _assert_logits(lm.logits(out["ids"]), out["logits"])
    eos = lm.generation.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    prompts = [out["prompt_0"].tolist(), out["prompt_1"].tolist()]  # Two lengths: one batch.
    wants = [out["greedy_0"], out["greedy_1"]]
    got = lm.generate(prompts, max_new_tokens=max(len(w) for w in wants))
    for row, want in zip(got, wants, strict=True):
        _greedy_matches(row, want, eos)
    return got


@pytest.mark.slow
def test_logits_and_greedy_tokens_are_transformers(loaded):
    name, lm, _ = loaded
    assert {leaf.sharding.mesh.devices.size for leaf in jax.tree_util.tree_leaves(lm.params)} == {8}
    assert_logits_and_greedy(name, lm)


def test_save_pretrained_round_trips(loaded):
    name, lm, saved = loaded
    files = {p.name for p in saved.iterdir()}
    assert {"config.json", "generation_config.json"} <= files
    if name == "qwen3":  # Saved over several shards, with an index.
        shards = {f for f in files if f.startswith("model-0")}
        assert hf_checkpoint.INDEX_FILE in files and len(shards) > 1, files
    else:
        assert hf_checkpoint.SINGLE_FILE in files
    config = json.loads((saved / "config.json").read_text())
    original = json.loads((_HF / name / "config.json").read_text())
    assert config["model_type"] == original["model_type"]
    assert config["architectures"] == original["architectures"]
    again = from_pretrained(saved)
    out = _outputs(name)
    _assert_logits(again.logits(out["ids"]), out["logits"])
    if lm.tokenizer is not None:
        text = "Hello, world! 123"
        assert again.tokenizer.encode(text) == lm.tokenizer.encode(text)
    # The same tensors as transformers wrote, under the same names.
    with safe_open(str(_HF / name / _first_file(_HF / name)), "numpy") as theirs:
        names = list(theirs.keys())
    ours = _tensors(saved)
    for tensor in names[:6]:
        with safe_open(str(_HF / name / _file_of(_HF / name, tensor)), "numpy") as f:
            np.testing.assert_array_equal(ours[tensor], f.get_tensor(tensor))


def _first_file(directory: pathlib.Path) -> str:
    index = directory / hf_checkpoint.INDEX_FILE
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    return hf_checkpoint.SINGLE_FILE


def _file_of(directory: pathlib.Path, tensor: str) -> str:
    index = directory / hf_checkpoint.INDEX_FILE
    if index.is_file():
        return json.loads(index.read_text())["weight_map"][tensor]
    return hf_checkpoint.SINGLE_FILE


def _tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    out = {}
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), "numpy") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    return out


def read_on_4x2_devices(name: str, rules: Any) -> tuple[Any, dict, list[tuple[str, int]]]:
    """Fixture ``name``'s weights read onto 8 devices as 4 ('data') x 2 ('mdl') by ``rules``:
    (its family, ``{leaf: array}``, each read's ``(leaf, bytes)``)."""
    family, model_cfg = hf_models.build_model(hf_models.HfConfig.load(_HF / name))
    model = config_lib.instantiate(model_cfg)
    mesh = create_mesh((1, 4, 2), None, ("replica", "data", "mdl"), jax.devices())
    rules = filter_rules_for_mesh(rules, mesh)
    abstract, shardings = loading._abstract_params(model, mesh, rules)
    run_params = traverse_util.flatten_dict(
        jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
        ),
        sep="/",
    )
    reads: list[tuple[str, int]] = []
    source = hf_checkpoint.HfSource(_HF / name, lambda leaf, n: reads.append((leaf, n)))
    arrays = source.read({n: n for n in source.run_names(run_params)}, run_params)
    assert set(arrays) == set(run_params)
    return family, arrays, reads


def test_each_device_reads_only_its_slice(tmp_path):
    """8 devices as 4 (FSDP, 'data') x 2 (tensor, 'mdl'): each read asks for one device
    slice, together each array once; the arrays are transformers' tensors."""
    name = "qwen2"  # q/k/v biases and GQA: every layout.
    family, arrays, reads = read_on_4x2_devices(name, FSDP_AND_TENSOR_PARALLEL_RULES)
    named = hf_layout.their_names(family.table, list(arrays))
    tensors = _tensors(_HF / name)
    split = 0
    for leaf, array in arrays.items():
        assert isinstance(array.sharding, NamedSharding)
        asked = [n for path, n in reads if path == leaf]
        shards = {
            tuple((s.start, s.stop) for s in idx)
            for idx in array.sharding.devices_indices_map(array.shape).values()
        }
        assert sum(asked) == array.nbytes and len(asked) == len(shards), leaf
        assert max(asked) == array.nbytes // len(shards), leaf
        split += len(shards) > 1
        where = named[leaf]
        np.testing.assert_array_equal(
            hf_layout.to_theirs(where.layout, np.asarray(array)), tensors[where.theirs]
        )
    assert split >= 10


def test_transformers_4_spelling_of_rope_gives_the_same_model(tmp_path):
    """Llama 3's rope_parameters (5.x) rewritten as rope_theta + rope_scaling (4.x)."""
    copy = tmp_path / "llama3"
    shutil.copytree(_HF / "llama3", copy)
    config = json.loads((copy / "config.json").read_text())
    params = dict(config.pop("rope_parameters", None) or config.pop("rope_scaling"))
    config["rope_theta"] = params.pop("rope_theta", config.get("rope_theta"))
    params["type"] = params.pop("rope_type")
    config["rope_scaling"] = params
    (copy / "config.json").write_text(json.dumps(config))
    want = hf_models.build_model(hf_models.HfConfig.load(_HF / "llama3"))[1]
    got = hf_models.build_model(hf_models.HfConfig.load(copy))[1]
    assert config_lib.to_json(got) == config_lib.to_json(want)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
         r'rope type="yarn" is not supported \(supported: default, linear, llama3\)'),
        ({"model_type": "falcon"},
         r'model_type="falcon" is not supported \(supported: gemma, gemma2, gpt2, llama,'),
        ({"hidden_act": "quick_gelu"},
         r'hidden_act="quick_gelu" is not supported \(supported: silu, gelu_pytorch_tanh,'),
        ({"mlp_bias": True}, r"mlp_bias=true is not supported"),
    ],
    ids=["rope-yarn", "model-type", "activation", "mlp-bias"],
)  # fmt: skip
def test_a_config_it_cannot_honour_is_one_line(tmp_path, change, message):
    copy = tmp_path / "model"
    copy.mkdir()
    config = json.loads((_HF / "llama3" / "config.json").read_text())
    config.pop("rope_scaling", None)
    (copy / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(hf_models.HfConfigError, match=message) as e:
        hf_models.build_model(hf_models.HfConfig.load(copy))
    assert "\n" not in str(e.value)


def test_unknown_fields_give_one_warning_and_inert_ones_none(tmp_path, caplog):
    config = json.loads((_HF / "mistral" / "config.json").read_text())
    cfg = hf_models.HfConfig({**config, "my_new_knob": 3, "another": True}, "x/config.json")
    with caplog.at_level(logging.WARNING):
        hf_models.build_model(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "x/config.json: ignoring fields paxlite does not know for mistral: another, my_new_knob."
    ]


def test_a_hub_id_or_exp_with_a_hf_dir_is_one_line():
    with pytest.raises(PretrainedError, match="looks like a Hugging Face hub id") as e:
        from_pretrained("meta-llama/Llama-3.2-1B")
    assert "\n" not in str(e.value) and "huggingface-cli download" in str(e.value)
    with pytest.raises(PretrainedError, match="without exp="):
        from_pretrained(_HF / "qwen2", exp="tasks.lm.synthetic.LmSyntheticTiny")


def test_dtype_casts_the_weights():
    lm = from_pretrained(_HF / "qwen2", dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(lm.params)} == {jnp.dtype("bfloat16")}
    out = _outputs("qwen2")
    got = lm.logits(out["ids"])
    assert np.abs(got - out["logits"]).max() < 0.05 * np.abs(out["logits"]).max()


@pytest.mark.slow
def test_strings_in_strings_out_with_the_generation_configs_defaults():
    """Llama 3: BOS added to each prompt, generation stops at either EOS id of its list;
    the defaults are generation_config.json's (and transformers' top_k=50 when unset)."""
    lm = from_pretrained(_HF / "llama3")
    assert lm.generation.eos_token_id == (318, 317) and lm.generation.pad_token_id == 319
    assert lm.generation.top_k == 50 and not lm.generation.do_sample
    texts = ["Hello, world!", "The cat sat"]
    ids = [lm.tokenizer.encode(t) for t in texts]
    assert all(row[0] == lm.tokenizer.bos_token_id for row in ids)
    tokens = lm.generate(ids, max_new_tokens=6)
    want = []
    for row in tokens.tolist():
        kept = row[: next((i for i, t in enumerate(row) if t in (318, 317)), len(row))]
        want.append(lm.tokenizer.decode(kept))
    assert lm.generate(texts, max_new_tokens=6) == want
    assert lm.generate(texts[0], max_new_tokens=6) == want[0]
    sampled = lm.generate(ids, max_new_tokens=6, do_sample=True, temperature=0.7, seed=1)
    assert sampled.shape == (2, 6) and not np.array_equal(sampled, tokens)


@pytest.mark.slow
def test_loading_and_generating_imports_neither_seqio_nor_tensorflow():
    """The GPU machines have neither: a Hugging Face model must load and generate without."""
    code = (
        "import sys; from paxlite.pretrained.loading import from_pretrained; "
        f"lm = from_pretrained({str(_HF / 'qwen2')!r}); lm.generate('Hi', max_new_tokens=2); "
        "assert not {'seqio', 'tensorflow'} & set(sys.modules), sorted(sys.modules)"
    )
    # One device, as on a one-GPU machine (no 8-way partitioning to compile).
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = cpu_xla_flags(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_gpt2_as_the_hub_first_stored_it(tmp_path):
    """Names without ``transformer.`` and the attention's causal-mask buffers (the
    original openai-community/gpt2 files): the same model, the buffers not read."""
    from safetensors.numpy import save_file

    copy = tmp_path / "gpt2"
    shutil.copytree(_HF / "gpt2", copy)
    tensors = {k.removeprefix("transformer."): v for k, v in _tensors(copy).items()}
    t = _outputs("gpt2")["ids"].shape[1]
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, t, t), np.float32))
    save_file(tensors, str(copy / hf_checkpoint.SINGLE_FILE), metadata={"format": "pt"})
    lm = from_pretrained(copy)
    out = _outputs("gpt2")
    _assert_logits(lm.logits(out["ids"]), out["logits"])


@pytest.mark.parametrize("name", ["llama3", "gpt2"])  # Linear heads; Conv1D with fused q/k/v.
def test_a_scanned_stack_reads_and_writes_the_same_tensors(name, tmp_path):
    """The blocks in one ``[L, ...]`` array per parameter (``StackedTransformerRepeated``,
    what training scans): each layer's slice read from its own tensor, on 8 devices (FSDP);
    transformers' logits; saved back to the same tensors."""
    config = hf_models.HfConfig.load(_HF / name)
    family, model_cfg = hf_models.build_model(config)
    model = config_lib.instantiate(hf_models.scanned(model_cfg))
    mesh = create_mesh((1, 8, 1), None, ("replica", "data", "mdl"), jax.devices())
    rules = filter_rules_for_mesh(loading.FSDP_RULES, mesh)
    params = loading._load_params(
        model, {str(_HF / name): CheckpointLoadingRules()}, (1, 1), mesh, rules
    )
    assert "repeat" in params["lm"]["transformer"]
    lm = loading.PretrainedLm(model, params, None, mesh, rules)
    out = _outputs(name)
    _assert_logits(lm.logits(out["ids"]), out["logits"])
    flat = traverse_util.flatten_dict(params, sep="/")
    host = {path: np.asarray(value) for path, value in flat.items()}
    hf_checkpoint.save(tmp_path, host, family, config.fields)
    ours, theirs = _tensors(tmp_path), _tensors(_HF / name)
    assert set(ours) == set(theirs)
    for tensor, value in theirs.items():
        np.testing.assert_array_equal(ours[tensor], value, err_msg=tensor)


def test_gemma2s_alternating_windows_cannot_be_scanned():
    _, model_cfg = hf_models.build_model(hf_models.HfConfig.load(_HF / "gemma2"))
    with pytest.raises(hf_models.HfConfigError, match="sliding windows differ") as e:
        hf_models.scanned(model_cfg)
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_generate_messages_formats_them_with_the_chat_template():
    """qwen2's template (transformers' rendering stored in chat_cases.json): the prompt is
    the rendered conversation with the assistant's header, tokenized without extra BOS."""
    lm = from_pretrained(_HF / "qwen2")
    cases = json.loads((_HF / "qwen2" / "chat_cases.json").read_text())["cases"]
    single = next(c for c in cases if c["messages"][-1]["role"] == "user")
    prompt = lm.tokenizer.encode(single["rendered_with_prompt"], add_special_tokens=False)
    want = lm.tokenizer.decode(lm.generate([prompt], max_new_tokens=5)[0].tolist()[:5])
    reply = lm.generate(messages=single["messages"], max_new_tokens=5)
    assert isinstance(reply, str) and want.startswith(reply)  # The reply stops at an EOS.
    assert lm.generate(messages=[single["messages"]] * 2, max_new_tokens=5) == [reply, reply]
    with pytest.raises(ValueError, match="no chat template"):
        from_pretrained(_HF / "mistral").generate(messages=single["messages"], max_new_tokens=2)
