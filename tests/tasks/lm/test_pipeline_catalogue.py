"""Pax's pipelined experiments: each builds, has its size, splits its batch into microbatches
over the data axes, and stores each stage's layers on its own stage devices (abstract mesh of
its own size; nothing is allocated: ``jax.eval_shape``)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import pytest

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite.sharding import STAGES, logical_shardings
from tasks.lm import c4, lm_cloud, synthetic
from tests.tasks.lm.test_lm_cloud_catalogue import (
    _abstract_params,
    _assert_global_batch,
    _assert_params_shard_evenly,
    _is_box,
    _mesh,
)

# name: (global batch, microbatches, parameters in billions)
EXPECTED = {
    "C4SpmdPipelineGpt3SmallAdam64Replicas": (512, 32, 2.93),
    "C4SpmdPipelineGpt3SmallAdam8Replicas": (512, 64, 2.93),
    "LmCloudSpmdPipeline9B": (512, 128, 9.80),
    "LmCloudSpmdPipelineMultislice2B": (128, 32, 2.14),
    "LmCloudSpmdPipelineMultislice2BCircular": (128, 16, 2.14),
    "LmCloudSpmdPipeline175B": (96, 48, 174.35),
    "C4SpmdPipelineAdam": (8, 4, 1.27),
    # GPT-3 175B: 174.6B plus the 16384-row learned position table.
    "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas": (1536, 192, 174.79),
    "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas": (1536, 192, 174.79),
    "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas": (2048, 256, 174.79),
    "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas": (3072, 192, 174.79),
    "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas": (4096, 512, 174.79),
    "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas": (8192, 512, 174.79),
}
CATALOGUE = [
    cls
    for cls in registry.get_all().values()
    if cls.__module__ in (c4.__name__, lm_cloud.__name__)
    and issubclass(cls, lm_cloud.LmCloudSpmd)
    and cls.NUM_STAGES > 1
]
_ids = [cls.__name__ for cls in CATALOGUE]


def test_catalogue_is_registered():
    assert sorted(_ids) == sorted(EXPECTED)


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_batch_microbatches_and_mesh(cls: type):
    exp = cls()
    batch, microbatches, _ = EXPECTED[cls.__name__]
    _assert_global_batch(cls, batch)
    assert exp.MESH_AXIS_NAMES == ("stage", "replica", "data", "mdl")
    assert _mesh(exp).shape["stage"] == exp.NUM_STAGES
    assert batch // exp.MICROBATCH_SIZE == microbatches
    stack = exp.task().model.lm_tpl.stacked_transformer_tpl
    assert (stack.num_stages, stack.microbatch_size, stack.circular_repeat) == (
        exp.NUM_STAGES,
        exp.MICROBATCH_SIZE,
        exp.CIRCULAR_REPEAT,
    )
    assert stack.stage_tpl.num_layers * exp.NUM_STAGES * exp.CIRCULAR_REPEAT == exp.NUM_LAYERS


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_params_count_and_stage_sharding(cls: type):
    exp = cls()
    params = _abstract_params(cls)
    leaves = jax.tree_util.tree_leaves(params, is_leaf=_is_box)
    count = sum(math.prod(p.value.shape) for p in leaves)
    assert abs(count / 1e9 - EXPECTED[cls.__name__][2]) < 0.01, f"{count / 1e9:.2f}B"
    staged = [p for p in leaves if STAGES in p.names]
    repeat = exp.CIRCULAR_REPEAT
    leading = (exp.NUM_LAYERS,) if repeat == 1 else (repeat, exp.NUM_LAYERS // repeat)
    assert staged and all(p.value.shape[: len(leading)] == leading for p in staged)
    # Every stacked weight is split over 'stage' on its layer axis: a stage's layers stay home.
    mesh = _mesh(exp)
    shardings = logical_shardings(params, mesh, exp.logical_axis_rules())
    specs = {
        jax.tree_util.keystr(path): s.spec
        for path, s in jax.tree_util.tree_leaves_with_path(nn.unbox(shardings))
    }
    stacked_specs = [spec for key, spec in specs.items() if "transformer" in key]
    assert stacked_specs and all(spec[len(leading) - 1] == "stage" for spec in stacked_specs)
    _assert_params_shard_evenly(cls)


def test_tiny_pipeline_is_the_tiny_model_in_stages():
    exp = synthetic.LmSyntheticTinyPipeline()
    assert (exp.NUM_LAYERS, exp.NUM_STAGES, exp.NUM_MICROBATCHES) == (4, 2, 4)
    plain = with_overrides(
        synthetic.LmSyntheticTinyPipeline, {"NUM_STAGES": 1, "ICI_MESH_SHAPE": (1, 1, 2, 1)}
    )()
    assert plain.task().model.lm_tpl.stacked_transformer_tpl.num_layers == 4


@pytest.mark.parametrize(
    "overrides, phrase",
    [
        ({"NUM_LAYERS": 20}, "NUM_LAYERS=20 does not split into NUM_STAGES=16"),
        ({"MICROBATCH_SIZE": 6}, "microbatches of MICROBATCH_SIZE=6"),
        ({"MICROBATCH_SIZE": 2}, "microbatch of 2 examples does not split over the 4"),
        ({"ICI_MESH_SHAPE": (8, 8, 1, 1)}, "NUM_STAGES=16 but the mesh has 8"),
        ({"CIRCULAR_REPEAT": 2}, "multiple of 32"),
    ],
)
def test_pipeline_knobs_are_checked(overrides, phrase):
    with pytest.raises(KnobError, match=phrase):
        with_overrides(lm_cloud.LmCloudSpmdPipeline9B, overrides)()
