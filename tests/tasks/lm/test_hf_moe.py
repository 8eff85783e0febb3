"""Fine-tuning Hugging Face mixtures of experts (HfCausalLm with a Mixtral or Qwen-MoE
HF_MODEL): the router's aux loss, LoRA on the attention and its PEFT export, and sizing a
full-size MoE from its config.json alone.

Oracles: the loss of transformers' own logits on a fixture batch (the first step's loss);
our exported adapter read back against the job it came from (PEFT loads it to the same
logits: tools/hf_fixtures/make_peft_fixtures.py --check-adapter); the published parameter
counts of Mixtral-8x7B and Qwen3-30B-A3B (tests/fixtures/hf_configs: their Hub config.json).
"""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import absltest

from paxlite.experiments.base_experiment import KnobError
from paxlite.pretrained import export
from paxlite.pretrained.loading import from_pretrained
from praxis_lite import config as config_lib
from praxis_lite.moe import MoeFeedForward
from praxis_lite.py_utils import NestedMap
from tasks.lm import hf_model
from tests import FIXTURES
from tests.tasks.lm.test_hf_lora import _close, _experiment, _loss, _train
from tests.tasks.lm.test_hf_synthetic import _synthetic

_HF = FIXTURES / "hf"
_CONFIGS = FIXTURES / "hf_configs"


def _moe_feed_forwards(model: config_lib.Config) -> list[config_lib.Config]:
    stack = model.lm_tpl.stacked_transformer_tpl
    blocks = [stack.block_tpl, getattr(stack, "moe_block_tpl", None)]
    return [b.tr_fflayer_tpl for b in blocks if b is not None and
            b.tr_fflayer_tpl.__fn_or_cls__ is MoeFeedForward]  # fmt: skip


@pytest.mark.slow
def test_lora_on_a_mixture_of_experts_fine_tunes_and_exports_what_loads_back(tmp_path):
    """LoRA on q_proj,v_proj of qwen2_moe (shared expert, q/k/v biases), scanned, on 2 fake
    devices; no aux loss, so the first step's loss is transformers'; the adapter and the
    merged export give the job's logits."""
    knobs = dict(
        ICI_MESH_SHAPE=(1, 2, 1),
        LORA_RANK=4,
        LORA_ALPHA=8.0,
        LORA_TARGET_MODULES="q_proj,v_proj",
        ROUTER_AUX_LOSS_COEF=0.0,
        NUM_TRAIN_STEPS=4,
        LEARNING_RATE=3e-2,
    )
    exp = _experiment("qwen2_moe", 2, HF_MODEL=str(_HF / "qwen2_moe"), **knobs)
    job = tmp_path / "job"
    losses = [s["loss"] for _, s in _train(exp, job).history]
    expected = np.load(_HF / "qwen2_moe" / "outputs.npz")
    np.testing.assert_allclose(losses[0], _loss(expected["logits"], expected["ids"]), rtol=1e-5)
    assert losses[-1] < 0.9 * losses[0], losses
    ours = from_pretrained(job).logits(expected["ids"])
    assert np.abs(ours - expected["logits"]).max() > 1e-3
    written = export.export(job, tmp_path / "adapter", adapter=True)
    assert sorted(written) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"] == ["q_proj", "v_proj"]
    _close(from_pretrained(tmp_path / "adapter").logits(expected["ids"]), ours)
    export.export(job, tmp_path / "merged")
    _close(from_pretrained(tmp_path / "merged").logits(expected["ids"]), ours)


@pytest.mark.slow
def test_the_router_aux_loss_is_added_in_training(tmp_path):
    """mixtral with router_aux_loss_coef: the objective is the cross-entropy (transformers'
    loss, reported as the loss) plus the aux loss: each MoE layer's load-balancing loss
    weighted coef / 2 layers (its summary: the mean over the scanned layers)."""
    coef = json.loads((_HF / "mixtral" / "config.json").read_text())["router_aux_loss_coef"]
    exp = _experiment("mixtral", 2, HF_MODEL=str(_HF / "mixtral"), NUM_TRAIN_STEPS=1)
    [(_, first)] = _train(exp, tmp_path / "job").history
    expected = np.load(_HF / "mixtral" / "outputs.npz")
    np.testing.assert_allclose(first["loss"], _loss(expected["logits"], expected["ids"]), rtol=1e-5)
    [summary] = [v for k, v in first.items() if k.endswith("ff_layer/load_balancing_loss")]
    np.testing.assert_allclose(first["aux_loss"], 2 * summary, rtol=1e-5)
    assert 1.0 < first["aux_loss"] / coef < 8.0  # E sum_e f_e P_e: k = 2 at balance, k E at worst.


def test_the_aux_loss_weight_is_router_aux_loss_coef_over_the_moe_layers():
    coef = json.loads((_HF / "qwen3_moe" / "config.json").read_text())["router_aux_loss_coef"]
    exp = _experiment("qwen3_moe", 2, HF_MODEL=str(_HF / "qwen3_moe"))
    hf_model._say_plain_stack.cache_clear()  # Said once a process: this test's.
    with absltest.mock.patch.object(hf_model.logging, "warning") as warning:
        model = exp.model()  # USE_REPEATED_LAYER's default: the plain stack, and one warning.
        exp.model()
    assert model.lm_tpl.stacked_transformer_tpl.moe_layers == (0, 2)
    [(args, _)] = warning.call_args_list
    assert "only layers [0, 2] of the 3" in args[0] % args[1:]
    [ff] = _moe_feed_forwards(model)
    assert math.isclose(ff.load_balance_loss_weight, coef / 2)  # Layers 0 and 2 of 3.
    exp = _experiment("mixtral", 2, HF_MODEL=str(_HF / "mixtral"), ROUTER_AUX_LOSS_COEF=0.5)
    [ff] = _moe_feed_forwards(exp.model())
    assert math.isclose(ff.load_balance_loss_weight, 0.25)  # Scanned, 2 layers.
    exp = _experiment("mixtral", 2, HF_MODEL=str(_HF / "mixtral"), ROUTER_AUX_LOSS_COEF=0.0)
    [ff] = _moe_feed_forwards(exp.model())
    assert ff.load_balance_loss_weight == 0.0


@pytest.mark.parametrize(
    "name, knobs, message",
    [
        ("mixtral", dict(LORA_RANK=4, LORA_TARGET_MODULES="q_proj,w1"),
         "LoRA on mixtral's feed-forwards (its experts, router, shared expert and dense layers; "
         "asked: w1) is not implemented yet; adapt the attention projections: q_proj, k_proj, "
         "v_proj, o_proj."),
        ("qwen3_moe", dict(LORA_RANK=4, LORA_TARGET_MODULES="all-linear"), "asked: all-linear"),
        ("qwen2_moe", dict(LORA_RANK=4, LORA_TARGET_MODULES="shared_expert_gate"),
         "asked: shared_expert_gate"),
        ("llama3", dict(ROUTER_AUX_LOSS_COEF=0.01), "ROUTER_AUX_LOSS_COEF is set but"),
    ],
    ids=["lora-experts", "lora-all-linear", "lora-shared-gate", "aux-on-dense"],
)  # fmt: skip
def test_moe_knob_errors_are_one_line(name, knobs, message):
    with pytest.raises((KnobError, ValueError), match=re.escape(message)) as e:
        _experiment(name, 2, HF_MODEL=str(_HF / name), **knobs).model()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, total, active",
    [("mixtral_8x7b", 46_702_792_704, 32 * (4096 * 128 * 80 + 2 * 3 * 4096 * 14336 + 4096 * 8)
      + 4096 * 32000),
     ("qwen3_30b_a3b", 30_532_122_624, 48 * (2048 * 128 * 72 + 8 * 3 * 2048 * 768 + 2048 * 128)
      + 2048 * 151936)],
)  # fmt: skip
def test_a_full_size_moe_config_alone_sizes_the_job(name, total, active):
    """The Hub's config.json alone: the built model's parameters are the published total;
    the FLOPs count the active ones (attention, k experts and the router a layer; logits)."""
    exp = _synthetic(_CONFIGS / name, MAX_SEQ_LEN=32)
    model_cfg = exp.model()
    model = config_lib.instantiate(model_cfg)
    ids = jnp.zeros((1, 32), jnp.int32)
    batch = NestedMap(ids=ids, labels=ids, weights=jnp.ones((1, 32)), paddings=jnp.zeros((1, 32)))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
    assert sum(math.prod(v.shape) for v in jax.tree_util.tree_leaves(shapes["params"])) == total
    assert config_lib.instantiate(model_cfg.lm_tpl).lm_shape().matmul_params == active
