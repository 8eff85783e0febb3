"""Pax's C4 catalogues (c4.py, c4_multislice.py): every experiment builds, has the size its name
says, splits its global batch over ('replica', 'data') and shards evenly on an abstract mesh of its
own size (nothing is allocated: ``jax.eval_shape``)."""

from __future__ import annotations

import re

import jax
import pytest
import seqio

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import with_overrides
from praxis_lite import config as config_lib
from praxis_lite.optim import optimizers, schedules
from tasks.lm import c4, c4_multislice
from tests.tasks.lm.test_lm_cloud_catalogue import (
    _abstract_params,
    _assert_global_batch,
    _assert_params_shard_evenly,
    _param_count,
)

# Pax's global batch per experiment: PERCORE_BATCH_SIZE x ICI chips x slices.
GLOBAL_BATCH = {
    "C4Spmd1BAdam4Replicas": 128,
    "C4Spmd1B": 128,
    "C4Spmd1BAdam4ReplicasLimitSteps": 128,
    "C4Spmd2BAdam4Replicas": 128,
    "C4Spmd16BAdam32Replicas": 512,
    "C4Spmd32BAdam64Replicas": 512,
    "C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas": 1536,
    "C4Spmd22BAdam1xv4_128": 1024,
    "C4Spmd22BAdam2xv4_128": 2048,
    "C4Spmd22BAdam4xv4_128": 4096,
    "C4Spmd22BAdam1xv4_8": 64,
    "C4Spmd22BAdam2xv4_8": 128,
    "C4Spmd22BAdam4xv4_8": 256,
    "C4SpmdGpt3AdamDataParallel2x16x16": 256,
    "C4SpmdAdam": 8,
    "LmCloudSpmdAdam": 128,
    "LmCloudSpmdAdamLimitSteps": 128,
    "C4SpmdGpt3L16AdamOrgHP": 192,
    "C4Spmd22BAdamMaxText": 128,
    "C4Spmd22BAdam1xv4_128LimitSteps": 1024,
    "C4Spmd22BAdam2xv4_128LimitSteps": 2048,
    "C4Spmd22BAdam4xv4_128LimitSteps": 4096,
    "C4Spmd22BAdam1xv4_8LimitSteps": 64,
    "C4Spmd22BAdam2xv4_8LimitSteps": 128,
    "C4Spmd22BAdam4xv4_8LimitSteps": 256,
    "C4Spmd22BAdam1xv4_384": 1920,
    "C4Spmd22BAdam2xv4_384": 3840,
    "C4Spmd32BAdam1xv5_256": 256,
    "C4Spmd32BAdam2xv5_256": 512,
}
CATALOGUE = [
    cls
    for cls in registry.get_all().values()
    if cls.__module__ in (c4.__name__, c4_multislice.__name__) and cls.NUM_STAGES == 1
]  # Pipelined ones: tests/tasks/lm/test_pipeline_catalogue.py.
_ids = [cls.__name__ for cls in CATALOGUE]


def test_catalogue_is_registered():
    assert sorted(_ids) == sorted(GLOBAL_BATCH)


def _named_size(name: str) -> float | None:
    """The size the name says; None for Pax's small v4-8 stand-ins under the 22B name and
    for names without a size (the family bases, GPT-3's 16-layer cut)."""
    if "v4_8" in name or "L16" in name:
        return None
    if "Gpt3" in name:
        return 175e9
    size = re.search(r"Spmd(\d+)B", name)
    return int(size.group(1)) * 1e9 if size else None


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_param_count(cls: type):
    exp = cls()
    count = _param_count(cls)
    named = _named_size(cls.__name__)
    if named is not None:
        assert abs(count / named - 1) < 0.15, f"{count / 1e9:.2f}B params"
    # The stack is 12 * L * D^2 (q, k, v, post: 4 D^2; feed-forward: 8 D^2) plus V x D, plus
    # GPT-3's learned position table; biases and norms are < 0.1%.
    assert exp.HIDDEN_DIMS == 4 * exp.MODEL_DIMS
    table = exp.TRAINABLE_PE_MAX_SEQ_LEN if exp.TRAINABLE_POSITION_EMB else 0
    dense = (12 * exp.NUM_LAYERS * exp.MODEL_DIMS + exp.VOCAB_SIZE + table) * exp.MODEL_DIMS
    assert abs(count / dense - 1) < 1e-3


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_global_batch_splits_over_data_parallel_axes(cls: type):
    _assert_global_batch(cls, GLOBAL_BATCH[cls.__name__])


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_params_shard_evenly_on_its_mesh(cls: type):
    _assert_params_shard_evenly(cls)


_C4_INPUT = [cls for cls in CATALOGUE if issubclass(cls, c4.C4SpmdLmBase)]


@pytest.mark.parametrize("cls", _C4_INPUT, ids=[cls.__name__ for cls in _C4_INPUT])
def test_datasets_register_the_task_without_reading_files(cls: type):
    overrides = {"VOCAB_PATH": "/nowhere/spm.model", "TRAIN_MIXTURE": "c4_catalogue"}
    # One CPU device here: a whole per-device batch keeps the per-host batch whole.
    exp = with_overrides(cls, {**overrides, "PERCORE_BATCH_SIZE": 1})()
    train, evaluation = exp.datasets()
    assert seqio.get_mixture_or_task("c4_catalogue")
    for inp in (train, evaluation):
        assert inp.task_feature_lengths == {"targets": exp.MAX_SEQ_LEN}
        assert inp.model_vocab_size == exp.VOCAB_SIZE


def test_gpt3_keeps_paxs_original_hyperparameters():
    cls = c4.C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas
    opt = config_lib.instantiate(cls().task()).learner.optimizer
    assert isinstance(opt, optimizers.Adam)
    assert (opt.learning_rate, opt.weight_decay, opt.beta1, opt.beta2, opt.epsilon) == (
        6e-5, 0.1, 0.9, 0.95, 1e-8
    )  # fmt: skip
    assert opt.clip_gradient_norm_to_value == 1.0
    assert opt.lr_schedule == schedules.LinearRampupCosineDecay(
        warmup_steps=265, decay_start=266, decay_end=108_600, min_ratio=0.1, max=1.0
    )
    names = {
        jax.tree_util.keystr(path): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(_abstract_params(cls))
    }
    (table,) = [v for k, v in names.items() if "position_emb" in k]
    assert table.shape == (16384, 12288)
    assert any("b_q" in k for k in names)  # GPT-3 keeps attention biases.
