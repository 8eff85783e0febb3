"""Pax's LmCloudSpmd catalogue: every leaf builds, has the size its name says, and shards
cleanly on an abstract mesh of its own size (nothing is allocated: ``jax.eval_shape``)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite import config as config_lib
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import BATCH, LAYERS, filter_rules_for_mesh, logical_shardings
from tasks.lm import lm_cloud

# Pax's global batch per leaf: PERCORE_BATCH_SIZE x chips.
GLOBAL_BATCH = {
    "LmCloudSpmdTest": 4,
    "LmCloudSpmd2B": 32,
    "LmCloudSpmd2BLimitSteps": 32,
    "LmCloudSpmd32B": 512,
    "LmCloudSpmd64B": 512,
    "LmCloudSpmd128B": 1024,
    "LmCloudSpmd256B": 2048,
    "LmCloudSpmd512B": 4096,
    "LmCloudSpmd1024B": 4096,
    "LmCloudSpmdMultislice2B": 128,
}
CATALOGUE = [  # Pipelined leaves: tests/tasks/lm/test_pipeline_catalogue.py; the MLPs and the
    # data-parallel (pmap) LMs over all devices: tests/tasks/lm/test_pax_catalogue.py.
    cls
    for cls in registry.get_all().values()
    if cls.__module__ == lm_cloud.__name__
    and issubclass(cls, lm_cloud.LmCloudSpmd)
    and cls.NUM_STAGES == 1
    and -1 not in cls.ICI_MESH_SHAPE
]
_ids = [cls.__name__ for cls in CATALOGUE]


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def test_catalogue_is_registered():
    assert sorted(_ids) == sorted(GLOBAL_BATCH)


def _mesh(exp: Any) -> AbstractMesh:
    """The experiment's mesh, ICI x DCN per axis, without devices."""
    dcn = exp.DCN_MESH_SHAPE or (1,) * len(exp.ICI_MESH_SHAPE)
    shape = tuple(i * d for i, d in zip(exp.ICI_MESH_SHAPE, dcn, strict=True))
    return AbstractMesh(shape, exp.MESH_AXIS_NAMES)


@functools.cache
def _abstract_params(cls: type) -> Any:
    """The boxed params (logical axis names kept) from ``jax.eval_shape`` of the model's init."""
    exp = cls()
    task = config_lib.instantiate(exp.task())
    ids = jax.ShapeDtypeStruct((2, exp.MAX_SEQ_LEN), jnp.int32)
    floats = jax.ShapeDtypeStruct((2, exp.MAX_SEQ_LEN), jnp.float32)
    batch = NestedMap(ids=ids, labels=ids, paddings=floats, weights=floats)
    init = lambda key, batch: task.model.init({"params": key, "dropout": key}, batch)
    variables = jax.eval_shape(init, jax.random.key(0), batch)
    return variables["params"]


def _param_count(cls: type) -> int:
    """The number of parameters; a scanned stack's weights are stacked NUM_LAYERS deep."""
    params = jax.tree_util.tree_leaves(_abstract_params(cls), is_leaf=_is_box)
    stacked = [p for p in params if LAYERS in p.names]
    if cls.USE_REPEATED_LAYER:
        assert stacked and all(p.value.shape[0] == cls.NUM_LAYERS for p in stacked)
    else:  # Pax's unscanned bases: one set of weights per layer.
        assert not stacked
    return sum(math.prod(p.value.shape) for p in params)


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_param_count_matches_name(cls: type):
    exp = cls()
    count = _param_count(cls)
    size = re.search(r"(\d+)B(LimitSteps)?$", cls.__name__)
    if size is not None:  # Not Pax's LmCloudSpmdTest, which names no size.
        named = int(size.group(1)) * 1e9
        assert abs(count / named - 1) < 0.15, f"{count / 1e9:.1f}B params"
    # The stack is 12 * L * D^2 (q, k, v, post: 4 D^2; feed-forward: 8 D^2) plus V x D and
    # the shared softmax's bias of V (praxis's).
    dense = 12 * exp.NUM_LAYERS * exp.MODEL_DIMS**2 + exp.VOCAB_SIZE * (exp.MODEL_DIMS + 1)
    assert abs(count / dense - 1) < 1e-3


def _assert_global_batch(cls: type, expected: int) -> None:
    """PERCORE_BATCH_SIZE x ICI x DCN chips == expected, split evenly over ('replica', 'data')."""
    exp = cls()
    mesh = _mesh(exp)
    devices = math.prod(mesh.axis_sizes)
    assert devices == math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE or (1,))
    global_batch = exp.global_batch_size(devices)
    assert global_batch == exp.PERCORE_BATCH_SIZE * devices == expected
    (batch_axes,) = nn.logical_to_mesh_axes(
        (BATCH,), filter_rules_for_mesh(exp.logical_axis_rules(), mesh)
    )
    assert batch_axes == ("replica", "data")
    assert global_batch % math.prod(mesh.shape[a] for a in batch_axes) == 0


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_global_batch_splits_over_data_parallel_axes(cls: type):
    _assert_global_batch(cls, GLOBAL_BATCH[cls.__name__])


def _assert_params_shard_evenly(cls: type) -> None:
    """Every sharded dim of every weight divides by its mesh axes; 'mdl' is used if it exists."""
    exp = cls()
    mesh = _mesh(exp)
    params = _abstract_params(cls)
    shardings = logical_shardings(params, mesh, exp.logical_axis_rules())
    values = jax.tree_util.tree_leaves(nn.unbox(params))
    specs = [s.spec for s in jax.tree_util.tree_leaves(shardings)]
    assert len(values) == len(specs)
    uneven, model_split = [], 0
    for value, spec in zip(values, specs, strict=True):
        for dim, axes in zip(value.shape, spec, strict=False):
            axes = (axes,) if isinstance(axes, str) else (axes or ())
            ways = math.prod(mesh.shape[a] for a in axes)
            model_split += "mdl" in axes
            if dim % ways:
                uneven.append((value.shape, spec))
    assert not uneven
    assert model_split or mesh.shape["mdl"] == 1


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_params_shard_evenly_on_its_mesh(cls: type):
    _assert_params_shard_evenly(cls)


@pytest.mark.parametrize("cls", CATALOGUE, ids=_ids)
def test_pax_attention_and_synthetic_input(cls: type):
    exp = cls()
    names = {
        jax.tree_util.keystr(path)
        for path, _ in jax.tree_util.tree_leaves_with_path(_abstract_params(cls), is_leaf=_is_box)
    }
    assert any("w_qkv" in n for n in names) and not any("b_q" in n for n in names)
    (train_cfg,) = exp.datasets()
    train = config_lib.instantiate(train_cfg)
    assert train.is_training and train.random_tokens
    assert train.batch_size == exp.PERCORE_BATCH_SIZE * jax.device_count()
    assert train.get_next().ids.shape == (train.batch_size, exp.MAX_SEQ_LEN)


def test_heads_must_tile_model_dims():
    with pytest.raises(KnobError, match="DIMS_PER_HEAD"):
        with_overrides(lm_cloud.LmCloudSpmd2B, {"NUM_HEADS": 16})()
