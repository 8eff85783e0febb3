"""Analytic model FLOPs: a hand count, the real parameter count, and XLA's count of the step."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.perf import aot, flops, mfu
from paxlite.runtime.job import build_job
from praxis_lite import config as config_lib
from praxis_lite.config import unbound_layer
from praxis_lite.flops import FlopsDefinition, LmShape
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.models.base import BaseModel
from tasks.lm.synthetic import LmSyntheticTiny


def lm_shape(model) -> LmShape:
    """The shape a LanguageModel (config or built) counts its FLOPs from."""
    return unbound_layer(unbound_layer(model).lm_tpl).lm_shape()


def tiny_job(tmp_path, **knobs):
    cls = base_experiment.with_overrides(LmSyntheticTiny, {"ICI_MESH_SHAPE": (1, 1, 1), **knobs})
    exp = cls()
    return exp, build_job(exp, exp.task(), exp.datasets(), tmp_path, jax.devices()[:1])


def test_hand_counted_tiny_lm():
    # LmSyntheticTiny: L=2, D=64, F=256, 4 heads of 16, V=64, T=32, global batch 16 x 8 devices.
    shape = lm_shape(LmSyntheticTiny().task().model)
    assert shape == LmShape(
        num_layers=2,
        model_dims=64,
        hidden_dims=256,
        num_heads=4,
        num_kv_heads=4,
        dims_per_head=16,
        gated=False,
        vocab_size=64,
    )
    # One block: q, k, v, post = 4 * 64 * 64 = 16,384; feed-forward 2 * 64 * 256 = 32,768.
    assert shape.block_params == 49_152
    assert shape.non_embedding_params == 98_304
    assert shape.matmul_params == 98_304 + 64 * 64
    # Per token: 6N = 589,824; attention L*H*Q*T = 2*4*16*32 = 4,096.
    # palm = 6 * 102,400 + 12 * 4,096 = 663,552; causal = 614,400 + 24,576 = 638,976.
    tokens = 128 * 32
    assert shape.all_definitions(128, 32) == {
        "6N": 589_824 * tokens,
        "palm": 663_552 * tokens,
        "causal": 638_976 * tokens,
    }
    assert shape.flops_per_step(128, 32) == 2_617_245_696  # the default: causal


def test_non_embedding_params_match_the_model_weights(tmp_path):
    """N_blocks equals the model's own projection weights (GQA, gated, biases left out)."""
    exp, job = tiny_job(
        tmp_path, NUM_KV_HEADS=2, USE_GATED_ACTIVATION=True, DIMS_PER_HEAD=8, NUM_LAYERS=3
    )
    model = config_lib.instantiate(job.task.model)
    batch = jax.tree_util.tree_map(np.asarray, job.train_input.get_next())
    params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), batch))["params"]
    weights = {
        jax.tree_util.keystr(path): leaf.size
        for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        if str(path[-1].key).startswith("w")
    }
    shape = lm_shape(job.task.model)
    assert (shape.num_layers, shape.num_kv_heads, shape.gated) == (3, 2, True)
    assert shape.non_embedding_params == sum(weights.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {
            "MODEL_DIMS": 128,
            "HIDDEN_DIMS": 512,
            "VOCAB_SIZE": 512,
            "MAX_SEQ_LEN": 64,
            "NUM_KV_HEADS": 2,
            "USE_GATED_ACTIVATION": True,
        },
    ],
    ids=["tiny", "gqa-gated-v512"],
)
def test_analytic_count_agrees_with_xla(tmp_path, knobs):
    """XLA counts all executed work of the plain (non-scanned) stack's step.

    The PaLM count (full attention map, no remat) is the matmul part of that work;
    the rest (norms, softmax, activations, Adam) is small: XLA's count is within
    15% above it for these small models (the share shrinks as D grows).
    """
    exp, job = tiny_job(tmp_path, USE_REPEATED_LAYER=False, PERCORE_BATCH_SIZE=0.5, **knobs)
    figures = aot.compile_train_step(job)
    shape = lm_shape(job.task.model)
    palm = shape.flops_per_step(figures["global_batch"], exp.MAX_SEQ_LEN, FlopsDefinition.PALM)
    assert unbound_layer(job.task.model.lm_tpl).stack_layout().scan_trips == 1
    assert palm <= figures["xla_flops_per_step"] <= palm / 0.85


def test_layers_multiply_through_nested_stacks():
    """A pipeline counts every block of every stage and repeat (not its microbatches)."""
    lm = LmSyntheticTiny().task().model.lm_tpl
    pipeline = config_lib.Config(
        LayerwiseShardablePipelined, num_stages=2, circular_repeat=2, num_microbatches=8
    )
    pipeline.stage_tpl = config_lib.Config(StackedTransformerRepeated, num_layers=3)
    pipeline.stage_tpl.block_tpl = lm.stacked_transformer_tpl.block_tpl
    lm.stacked_transformer_tpl = pipeline
    layout = unbound_layer(lm).stack_layout()
    assert (layout.num_layers, layout.pipelined) == (12, True)
    assert unbound_layer(lm).lm_shape().num_layers == 12


class _Uncounted(BaseModel):
    """A model that does not count its FLOPs (the contract's default)."""

    def __call__(self, batch, *, train=False):
        raise NotImplementedError


def test_a_model_without_a_count_gets_xla_only():
    batch = {"x": jax.ShapeDtypeStruct((8, 3), np.float32)}
    cost = flops.step_cost(_Uncounted(), batch, num_devices=1)
    assert cost.analytic_flops == {} and cost.global_batch == 8
    assert "not counted" in cost.describe()


def test_achieved_flops_per_device_and_mfu():
    peak = mfu.Peak(tflops=2.0, source="test", device_kind="x", dtype="float32")
    # 4 steps/s x 3 TFLOP per step over 2 devices: 6 TFLOP/s per device, 3x a 2 TFLOP/s peak.
    achieved = flops.achieved_flops(3e12, 4.0, 2, peak)
    assert achieved.tflops_per_sec_per_device == pytest.approx(6.0)
    assert achieved.mfu == pytest.approx(3.0)
    assert flops.achieved_flops(3e12, 4.0, 2, None) == (achieved.tflops_per_sec_per_device, None)


def test_format_flops():
    assert flops.format_flops(2_617_245_696) == "2.617 GFLOP"
    assert flops.format_flops(1.5e15) == "1.5 PFLOP"
