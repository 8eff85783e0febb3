"""MoeKnobs: which layers are MoE and how the stack holds them (all, every n-th, a list;
scanned groups or unscanned), its FLOPs (active weights), refusals in one line, and the tiny
MoE LM trained, evaluated and decoded through main.py."""

import re

import jax.numpy as jnp
import pytest
from fiddle import daglish

from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite import config as config_lib
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformers import StackedTransformer
from praxis_lite.moe import Dispatch, MoeFeedForward, TopKWeights
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import EXPERT
from tasks.lm.hf import HfCausalLm
from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyMoe
from tests import FIXTURES
from tests.paxlite.test_main import run_main_in_process, scalar_series


def _stack(**knobs):
    experiment = with_overrides(LmSyntheticTinyMoe, knobs)()
    experiment.validate()
    return experiment, experiment.task().model.lm_tpl.stacked_transformer_tpl


def _is_moe(block) -> bool:
    return block.tr_fflayer_tpl.__fn_or_cls__ is MoeFeedForward


def test_every_layer_moe_scans_the_moe_block():
    _, stack = _stack(MOE_EVERY_N=1)
    assert stack.__fn_or_cls__ is StackedTransformerRepeated and stack.num_layers == 4
    assert _is_moe(stack.block_tpl)


def test_every_second_layer_scans_groups_of_two():
    _, stack = _stack()
    assert stack.__fn_or_cls__ is StackedTransformerRepeated and stack.num_layers == 2
    group = stack.block_tpl
    assert group.__fn_or_cls__ is StackedTransformer and group.num_layers == 2
    assert group.moe_layers == (1,) and _is_moe(group.moe_block_tpl)
    assert not _is_moe(group.block_tpl)
    assert group.moe_block_tpl.hidden_dims == 128 and group.block_tpl.hidden_dims == 256


def test_a_list_of_layers_unscanned_or_scanned_as_one_group_when_it_does_not_repeat():
    _, stack = _stack(MOE_EVERY_N=1, MOE_LAYERS=(0, 3), USE_REPEATED_LAYER=False)
    assert stack.__fn_or_cls__ is StackedTransformer and stack.moe_layers == (0, 3)
    _, whole = _stack(MOE_EVERY_N=1, MOE_LAYERS=(0, 3))
    assert whole.num_layers == 1 and whole.block_tpl.num_layers == 4
    assert whole.block_tpl.moe_layers == (0, 3)
    _, periodic = _stack(MOE_EVERY_N=1, MOE_LAYERS=(0, 2))  # Repeats every 2 layers
    assert periodic.num_layers == 2 and periodic.block_tpl.moe_layers == (0,)


def test_flops_count_the_active_experts_and_the_router():
    experiment, _ = _stack()
    model = config_lib.instantiate(experiment.task().model)
    ids = jnp.zeros((2, experiment.MAX_SEQ_LEN), jnp.int32)
    counted = model.train_flops(NestedMap(ids=ids))
    d, f, moe_f, experts, layers = 64, 256, 128, 8, 4
    attention = 4 * d * d
    moe_ffn = 2 * (2 * d * moe_f) + d * experts  # top-2 experts and the router
    want = layers * attention + 2 * (2 * d * f) + 2 * moe_ffn
    assert counted.non_embedding_params == want
    assert "MoE 2/4 layers E=8 top-2 F=128 capacity" in counted.description
    assert counted.scan_trips == 2  # two groups of (dense, MoE)
    all_experts = 2 * (experts * 2 * d * moe_f + d * experts)
    assert want < layers * attention + 2 * (2 * d * f) + all_experts


def test_experts_go_first_on_their_mesh_axis():
    experiment = with_overrides(LmSyntheticTinyMoe, {})()
    assert experiment.logical_axis_rules()[0] == (EXPERT, "data")
    dense = LmSyntheticTiny()
    assert all(rule[0] != EXPERT for rule in dense.logical_axis_rules())


def test_a_bfloat16_model_computes_its_experts_in_bfloat16():
    experiment = with_overrides(LmSyntheticTinyMoe, {"FPROP_DTYPE": jnp.bfloat16})()
    moe = [
        value
        for value, _ in daglish.iterate(experiment.task().model)
        if getattr(value, "__fn_or_cls__", None) is MoeFeedForward
    ]
    assert moe and all(cfg.fprop_dtype == jnp.bfloat16 for cfg in moe)
    assert all(cfg.dtype == jnp.float32 for cfg in moe)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (dict(MOE_EVERY_N=1, MOE_LAYERS=(4,)), r"MOE_LAYERS = \[4\]: \[4\] are not layers"),
        (dict(NUM_EXPERTS_PER_TOKEN=9), "num_experts_per_token=9 must be between 1 and"),
        (dict(NUM_GROUPS=3), "NUM_GROUPS = 3 does not divide the 512 tokens"),
        (dict(EXPERT_CAPACITY_FACTOR=0.01), "expert capacity rounds to 0"),
        (dict(GATING_FUNC="expert_choice"), r"'expert_choice' \(experts choosing tokens\)"),
        (dict(EXPERT_MESH_AXIS="expert"), "'expert' is not an axis of MESH_AXIS_NAMES"),
        (dict(ICI_MESH_SHAPE=(1, 3, 1)), "NUM_EXPERTS=8 does not split evenly over the 3"),
        (dict(MOE_EVERY_N=5), "MOE_EVERY_N = 5 selects none of the 4 layers"),
        (
            dict(MOE_DISPATCH=Dispatch.DROPLESS, EXPERT_CAPACITY_FACTOR=1.0),
            "MOE_DISPATCH = 'dropless' reads no EXPERT_CAPACITY_FACTOR",
        ),
        (dict(MOE_TOP_K_WEIGHTS=TopKWeights.SOFTMAX), "'capacity' reads no MOE_TOP_K_WEIGHTS"),
        (
            dict(LORA_RANK=4, LORA_TARGET_MODULES="all-linear"),
            "LoRA adapters on the feed-forward .* are not built for mixture-of-experts",
        ),
        (dict(NUM_GROUPS=256, GRAD_ACCUM_STEPS=4), "NUM_GROUPS = 256 does not divide the 128"),
    ],
)
def test_bad_moe_knobs_are_one_line(knobs, message):
    with pytest.raises(KnobError) as e:
        with_overrides(LmSyntheticTinyMoe, knobs)().validate()
    assert re.search(message, str(e.value)) and "\n" not in str(e.value)


def test_moe_knobs_without_experts_are_refused():
    with pytest.raises(KnobError, match="NUM_GROUPS set but NUM_EXPERTS = 0"):
        with_overrides(LmSyntheticTiny, {"NUM_GROUPS": 4})().validate()


def test_a_pipeline_of_mixed_layers_is_refused_and_one_of_moe_layers_built():
    knobs = {
        "NUM_LAYERS": 4,
        "NUM_STAGES": 2,
        "MESH_AXIS_NAMES": ("stage", "replica", "data", "mdl"),
        "ICI_MESH_SHAPE": (2, 1, 1, 1),
    }
    with pytest.raises(KnobError, match="pipeline .* of dense and MoE layers mixed"):
        with_overrides(LmSyntheticTinyMoe, knobs)().task()
    task = with_overrides(LmSyntheticTinyMoe, {**knobs, "MOE_EVERY_N": 1})().task()
    stage = task.model.lm_tpl.stacked_transformer_tpl.stage_tpl
    assert _is_moe(stage.block_tpl)


def test_a_hugging_face_model_refuses_the_moe_knobs():
    knobs = {"HF_MODEL": str(FIXTURES / "hf" / "llama2"), "NUM_EXPERTS": 4}
    with pytest.raises(KnobError, match="has no knob 'NUM_EXPERTS'; HF_MODEL's config.json"):
        with_overrides(HfCausalLm, knobs)()


@pytest.mark.slow
def test_the_tiny_moe_lm_trains_evaluates_and_decodes(tmp_path):
    job = tmp_path / "job"
    exp = "tasks.lm.synthetic.LmSyntheticTinyMoe"
    code, out, err = run_main_in_process(
        "--mode=train_and_eval",
        f"--job_log_dir={job}",
        "--set=NUM_TRAIN_STEPS=75",
        "--set=EVAL_INTERVAL_STEPS=75",
        "--set=SUMMARY_INTERVAL_STEPS=25",
        "--set=ICI_MESH_SHAPE=1,8,1",  # 8 experts over 8 devices on 'data'
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=NUM_GROUPS=8",
        exp=exp,
    )
    assert code == 0, err
    assert "MoE 2/4 layers E=8 top-2 F=128 capacity" in out + err
    losses = scalar_series(job / "summaries" / "train", "train/loss")
    assert losses[-1][1] < 0.3 * losses[0][1]
    aux = scalar_series(job / "summaries" / "train", "train/aux_loss")
    assert all(1.9 < value < 4.0 for _, value in aux)  # two layers, each >= 1 (GShard's)
    group = "train/summaries/lm/transformer/repeat/block/x_layers_1/ff_layer/"
    dispatched = scalar_series(job / "summaries" / "train", group + "dispatch_2")
    assert 0.0 < dispatched[-1][1] <= 1.0
    code, out, err = run_main_in_process(
        "--mode=decode",
        f"--job_log_dir={job}",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=2",
        "--set=NUM_GROUPS=8",
        exp=exp,
    )
    assert code == 0, err
    assert "exact_match" in out + err
