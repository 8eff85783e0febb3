"""Activation layouts of Pax's training-optimized sharding: the [batch, length, model]
activations at layer boundaries split over 'mdl' (praxis's a_bld), and a pipelined LM's
embeddings and softmax data-parallel over the 'stage' axis too (Pax's batch_dims)."""

from __future__ import annotations

import pytest

from paxlite.cli import overrides
from paxlite.experiments import base_experiment
from paxlite.perf import aot
from praxis_lite.sharding import (
    ACTIVATION_EMBED,
    BATCH,
    LM_BATCH,
    TENSOR_PARALLEL_RULES,
    with_defaults,
)
from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyPipeline

#: Large enough that the saved layer inputs dominate XLA's temporaries (8 CPU devices).
ACTIVATION_HEAVY = {
    "ICI_MESH_SHAPE": (1, 2, 4),
    "NUM_LAYERS": 8,
    "MODEL_DIMS": 256,
    "HIDDEN_DIMS": 512,
    "NUM_HEADS": 4,
    "PERCORE_BATCH_SIZE": 8,
    "MAX_SEQ_LEN": 128,
}


def _temp_bytes(rules) -> int:
    cls = base_experiment.with_overrides(
        LmSyntheticTiny, {**ACTIVATION_HEAVY, "LOGICAL_AXIS_RULES": rules}
    )
    exp = cls()
    task_cfg, dataset_cfgs, _ = overrides.resolve_configs(exp, [], [])
    job = aot.build_compile_job(exp, task_cfg, dataset_cfgs, None)
    return aot.compile_train_step(job)["temp_bytes_per_device"]


@pytest.mark.slow
def test_splitting_layer_boundary_activations_over_mdl_saves_device_memory():
    split = _temp_bytes(TENSOR_PARALLEL_RULES)
    whole = _temp_bytes(((ACTIVATION_EMBED, None), *TENSOR_PARALLEL_RULES))
    assert split < 0.75 * whole, (split, whole)


def _first_rules(cls, **knobs) -> dict:
    exp = base_experiment.with_overrides(cls, knobs)()
    return dict(reversed(with_defaults(exp.logical_axis_rules())))


def test_a_pipelined_lm_splits_its_embeddings_and_softmax_over_the_stages_too():
    pipelined = _first_rules(LmSyntheticTinyPipeline, ICI_MESH_SHAPE=(2, 1, 4, 1))
    assert pipelined[LM_BATCH] == ("replica", "data", "stage")
    assert pipelined[BATCH] != pipelined[LM_BATCH]  # Inside the stages: replica x data.
    plain = _first_rules(LmSyntheticTiny, ICI_MESH_SHAPE=(1, 8, 1))
    assert plain[LM_BATCH] == plain[BATCH]
