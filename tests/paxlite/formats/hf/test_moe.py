"""Hugging Face's mixtures of experts in and out: the Mixtral, Qwen2-MoE and Qwen3-MoE
directories transformers wrote (tests/fixtures/hf/{mixtral,qwen2_moe,qwen3_moe}, made by
tools/hf_fixtures/make_fixtures.py, with beam cases by make_generate_fixtures.py).

Oracles: the logits, greedy and beam tokens transformers computed for each fixture; the
tensors transformers saved (names, shapes, values) for save_pretrained; the safetensors
arrays themselves for the per-device reads.
"""

import collections
import json
import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from paxlite.checkpoints import checkpoint_sources
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import layout as hf_layout
from paxlite.formats.hf import models as hf_models
from paxlite.pretrained import loading
from paxlite.pretrained.loading import from_pretrained
from paxlite.runtime.mesh import create_mesh
from praxis_lite import config as config_lib
from praxis_lite.moe import Dispatch, MoeFeedForward, TopKWeights
from praxis_lite.sharding import (
    EXPERTS_OVER_DATA_RULES,
    FSDP_AND_TENSOR_PARALLEL_RULES,
    filter_rules_for_mesh,
)
from tests import FIXTURES
from tests.paxlite.formats.hf.test_models import (
    _assert_logits,
    _outputs,
    _tensors,
    assert_logits_and_greedy,
    load_and_resave,
    read_on_4x2_devices,
)
from tests.paxlite.pretrained.test_hf_generate import _check_run

_HF = FIXTURES / "hf"
MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]


def _beam_cases(name: str) -> dict[str, list[dict]]:
    cases = json.loads((_HF / name / "generate_cases.json").read_text())["cases"]
    by_name = collections.defaultdict(list)
    for case in cases:
        by_name[case["name"]].append(case)
    return by_name


@pytest.fixture(scope="module", params=MOE)
def loaded(request, tmp_path_factory):
    return load_and_resave(request.param, tmp_path_factory)


@pytest.mark.slow
def test_logits_greedy_and_beam_tokens_are_transformers(loaded):
    name, lm, _ = loaded
    got = assert_logits_and_greedy(name, lm)
    row = MOE.index(name) % 2  # One prompt's beams each (each EOS compiles its own search).
    _check_run(lm, _beam_cases(name)["beam4"][row], f"{name} beam4 {row}")
    if name == "mixtral":  # Sampling: the seed's, reproducible.
        sampled = [lm.generate(got[:, :2].tolist(), 6, do_sample=True, seed=s) for s in (1, 1, 2)]
        assert sampled[0].shape == (2, 6) and np.array_equal(sampled[0], sampled[1])
        assert not np.array_equal(sampled[0], sampled[2])


def test_save_pretrained_writes_what_transformers_wrote(loaded):
    """Every tensor under transformers' per-expert names, shapes and values (qwen3_moe in
    shards with an index); reloaded, transformers' logits."""
    name, _, saved = loaded
    files = {p.name for p in saved.iterdir()}
    if name == "qwen3_moe":
        assert hf_checkpoint.INDEX_FILE in files and len(files - {"config.json"}) > 3, files
    ours, theirs = _tensors(saved), _tensors(_HF / name)
    assert sorted(ours) == sorted(theirs)
    assert any(".experts.3." in tensor for tensor in ours)
    for tensor, value in theirs.items():
        np.testing.assert_array_equal(ours[tensor], value, err_msg=tensor)
    config = json.loads((saved / "config.json").read_text())
    assert (
        config["architectures"]
        == json.loads((_HF / name / "config.json").read_text())["architectures"]
    )
    out = _outputs(name)
    _assert_logits(from_pretrained(saved).logits(out["ids"]), out["logits"])


def test_routing_is_each_familys():
    """Top-k dropless routing with each family's weights, experts and dense layers."""
    expected = {  # weights, shared expert dims, MoE layers of the fixture's
        "mixtral": (TopKWeights.RENORMALIZED, 0, None),
        "qwen2_moe": (TopKWeights.SOFTMAX, 48, None),
        "qwen3_moe": (TopKWeights.RENORMALIZED, 0, (0, 2)),
    }
    for name, (weights, shared, layers) in expected.items():
        family, model = hf_models.build_model(hf_models.HfConfig.load(_HF / name))
        assert family.mixture_of_experts
        stack = model.lm_tpl.stacked_transformer_tpl
        block = stack.moe_block_tpl if layers else stack.block_tpl
        ff = block.tr_fflayer_tpl
        assert ff.__fn_or_cls__ is MoeFeedForward and ff.dispatch is Dispatch.DROPLESS
        assert (ff.num_experts, ff.num_experts_per_token) == (4, 2)
        assert (ff.top_k_weights, ff.shared_expert_dims) == (weights, shared)
        assert stack.moe_layers == (layers or ())


def test_each_device_reads_only_its_experts():
    """8 devices as 4 ('data', the experts' axis and FSDP) x 2 ('mdl'): each expert's tensor
    is read only by the devices holding that expert, each device slice once."""
    rules = EXPERTS_OVER_DATA_RULES + FSDP_AND_TENSOR_PARALLEL_RULES
    _, arrays, reads = read_on_4x2_devices("mixtral", rules)
    tensors = _tensors(_HF / "mixtral")
    experts = [leaf for leaf in arrays if leaf.endswith(("wi_0", "wi_gate_0", "wo_0"))]
    assert len(experts) == 6
    for leaf in experts:
        array = arrays[leaf]
        slices = array.sharding.devices_indices_map(array.shape).values()
        assert {(s[0].start, s[0].stop) for s in slices} == {(0, 1), (1, 2), (2, 3), (3, 4)}
        asked = [n for path, n in reads if path == leaf]
        # One read per (device slice, expert in it): 8 slices of one expert each.
        assert len(asked) == 8 and sum(asked) == array.nbytes, leaf
        where = hf_layout.their_names(hf_layout.MIXTRAL_TABLE, [leaf])[leaf]
        for e, tensor in enumerate(where.tensor_names(array.shape)):
            np.testing.assert_array_equal(
                hf_layout.to_theirs(where.layout, np.asarray(array)[e]), tensors[tensor]
            )


def test_a_scanned_mixtral_reads_and_writes_the_same_tensors(tmp_path):
    """Every layer's experts in one ``[L, E, ...]`` array: each (layer, expert) slice read
    from its own tensor on 8 devices (FSDP); transformers' logits; saved back the same."""
    config = hf_models.HfConfig.load(_HF / "mixtral")
    family, model_cfg = hf_models.build_model(config)
    model = config_lib.instantiate(hf_models.scanned(model_cfg))
    mesh = create_mesh((1, 8, 1), None, ("replica", "data", "mdl"), jax.devices())
    rules = filter_rules_for_mesh(loading.FSDP_RULES, mesh)
    params = loading._load_params(
        model, {str(_HF / "mixtral"): CheckpointLoadingRules()}, (1, 1), mesh, rules
    )
    flat = traverse_util.flatten_dict(params, sep="/")
    assert flat["lm/transformer/repeat/block/ff_layer/wi_0"].shape[:2] == (2, 4)
    lm = loading.PretrainedLm(model, params, None, mesh, rules)
    out = _outputs("mixtral")
    _assert_logits(lm.logits(out["ids"]), out["logits"])
    hf_checkpoint.save(tmp_path, {p: np.asarray(v) for p, v in flat.items()}, family, config.fields)
    ours, theirs = _tensors(tmp_path), _tensors(_HF / "mixtral")
    assert set(ours) == set(theirs)
    for tensor, value in theirs.items():
        np.testing.assert_array_equal(ours[tensor], value, err_msg=tensor)


def test_dense_layers_among_moe_ones_cannot_be_scanned():
    _, model_cfg = hf_models.build_model(hf_models.HfConfig.load(_HF / "qwen3_moe"))
    with pytest.raises(hf_models.HfConfigError, match=r"only layers \[0, 2\] of the 3") as e:
        hf_models.scanned(model_cfg)
    assert "\n" not in str(e.value) and "USE_REPEATED_LAYER=False" in str(e.value)


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("mixtral", {"num_experts_per_tok": 5},
         r"num_experts_per_tok=5 is not supported \(it must be between 1 and num_local_experts=4"),
        ("qwen3_moe", {"n_group": 2, "topk_group": 1},
         r"n_group=2 is not supported \(DeepSeek's grouped routing is not implemented"),
        ("qwen3_moe", {"model_type": "deepseek_v3"},
         r"model_type=\"deepseek_v3\" is not supported \(DeepSeek's grouped routing, .*"
         r"multi-head latent attention \(kv_lora_rank\) is not implemented in paxlite; its "
         r"mixtures of experts: mixtral, qwen2_moe, qwen3_moe\)"),
        ("qwen3_moe", {"model_type": "gpt_oss"}, r"gpt-oss' attention sinks"),
        ("qwen2_moe", {"scoring_func": "sigmoid"}, r'scoring_func="sigmoid" is not supported'),
    ],
    ids=["k-over-experts", "grouped-routing", "deepseek", "gpt-oss", "sigmoid-router"],
)  # fmt: skip
def test_an_moe_config_paxlite_cannot_build_is_one_line(tmp_path, name, change, message):
    config = json.loads((_HF / name / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(hf_models.HfConfigError, match=message) as e:
        hf_models.build_model(hf_models.HfConfig.load(tmp_path))
    assert "\n" not in str(e.value)


def test_an_expert_missing_from_the_checkpoint_is_one_line(tmp_path):
    copy = tmp_path / "mixtral"
    shutil.copytree(_HF / "mixtral", copy)
    file = copy / hf_checkpoint.SINGLE_FILE
    with safe_open(str(file), "numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    missing = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    del tensors[missing]
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(checkpoint_sources.CheckpointSourceError) as e:
        from_pretrained(copy)
    message = str(e.value)
    assert "\n" not in message and f"it lacks 1 ({missing}): an interrupted" in message


def test_what_changes_nothing_is_taken_and_jitter_is_a_training_setting(tmp_path):
    """DeepSeek-style fields at values that change nothing build the same model; Mixtral's
    router_jitter_noise becomes the layer's training-time input jitter; MixtralConfig's
    defaults fill what config.json leaves out."""
    config = json.loads((_HF / "mixtral" / "config.json").read_text())
    want = config_lib.to_json(hf_models.build_model(hf_models.HfConfig.load(_HF / "mixtral"))[1])
    inert = {"scoring_func": "softmax", "routed_scaling_factor": 1.0, "n_group": 1}
    got = hf_models.build_model(hf_models.HfConfig({**config, **inert}, "x"))[1]
    assert config_lib.to_json(got) == want
    jittered = hf_models.build_model(
        hf_models.HfConfig({**config, "router_jitter_noise": 0.01}, "x")
    )
    ff = jittered[1].lm_tpl.stacked_transformer_tpl.block_tpl.tr_fflayer_tpl
    assert ff.input_jitter == 0.01
    bare = {k: v for k, v in config.items() if k not in ("rope_parameters", "rms_norm_eps")}
    cfg = hf_models.HfConfig(bare, "x")
    hf_models.build_model(cfg)
    assert cfg.fields["rope_theta"] == 1e6 and cfg.fields["rms_norm_eps"] == 1e-5


def test_a_peft_adapter_on_the_experts_is_one_line(tmp_path):
    """PEFT's LoRA on Mixtral's experts (w1, w2, w3: a common QLoRA target): refused, naming
    what paxlite adapts, until LoRA on experts is built."""
    config = json.loads((_HF / "llama3_lora" / "adapter_config.json").read_text())
    config.update(base_model_name_or_path=str(_HF / "mixtral"), target_modules=["w1", "q_proj"])
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    prefix = "base_model.model.model.layers.0."
    tensors = {
        f"{prefix}block_sparse_moe.experts.1.w1.lora_A.weight": np.zeros((4, 64), np.float32),
        f"{prefix}self_attn.q_proj.lora_A.weight": np.zeros((4, 64), np.float32),
    }
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"LoRA on mixtral's feed-forwards .*asked: w1\)") as e:
        from_pretrained(_HF / "mixtral", adapter=tmp_path)
    assert "\n" not in str(e.value) and "q_proj, k_proj, v_proj, o_proj" in str(e.value)
