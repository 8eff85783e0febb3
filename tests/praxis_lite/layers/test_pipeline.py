"""The pipelined stack equals the plain stack (outputs and gradients) on a sharded CPU mesh.

GPipe and circular schedules, 2 and 4 stages, with and without remat, on 8 virtual
CPU devices with the stage dimension of the weights split over a 'stage' mesh axis; and the
aux losses and summaries that blocks record inside the stages equal the plain stack's.
"""

from __future__ import annotations

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from praxis_lite import instantiate
from praxis_lite.base_layer import AUX_LOSS, SUMMARIES, summaries_and_aux_losses
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined, PipelineShapeError
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformers import Transformer
from praxis_lite.sharding import (
    DEFAULT_RULES,
    filter_rules_for_mesh,
    logical_shardings,
    strip_boxes,
)
from tests.praxis_lite.layers import numpy_refs as ref

# SEQ differs from LAYERS, so activation and weight shapes stay distinct.
LAYERS, DIMS, BATCH, SEQ = 8, 16, 8, 6


def _block(block) -> None:
    block.input_dims, block.hidden_dims, block.num_heads = DIMS, 32, 4


def _pipeline(stages: int, repeat: int, remat: AutodiffCheckpointType, **fields):
    cfg = LayerwiseShardablePipelined.HParams.config(
        num_stages=stages, circular_repeat=repeat, **fields
    )
    cfg.stage_tpl.num_layers = LAYERS // (stages * repeat)
    cfg.stage_tpl.checkpoint_policy = remat
    _block(cfg.stage_tpl.block_tpl)
    return instantiate(cfg)


def _plain(cls, **fields):
    cfg = cls.HParams.config(num_layers=LAYERS, **fields)
    _block(cfg.block_tpl)
    return instantiate(cfg)


def _to_plain(tree, repeat: int):
    """Pipelined weights ([L, ...] or [R, L / R, ...]) -> the plain stack's [L, ...]."""
    lead = 1 if repeat == 1 else 2
    return jax.tree_util.tree_map(lambda a: a.reshape((LAYERS,) + a.shape[lead:]), tree)


def _to_pipelined(tree, repeat: int):
    """Inverse of :func:`_to_plain`."""
    lead = () if repeat == 1 else (repeat,)
    return jax.tree_util.tree_map(lambda a: a.reshape(lead + (-1,) + a.shape[1:]), tree)


def _inputs():
    x = jax.random.normal(jax.random.key(1), (BATCH, SEQ, DIMS))
    paddings = jnp.zeros((BATCH, SEQ)).at[1, 5:].set(1.0).at[6, 3:].set(1.0)
    segment_ids = jnp.ones((BATCH, SEQ), jnp.int32).at[2, 4:].set(2)
    positions = jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ)).at[2, 4:].add(-4)
    return x, dict(paddings=paddings, segment_ids=segment_ids, positions=positions)


def _loss(module, params, x, side):
    y = module.apply({"params": params}, x, **side)
    return jnp.sum(jnp.sin(y) * jnp.arange(DIMS)), y


def _gathered_shapes(hlo: str) -> set[tuple[int, ...]]:
    """The result shapes of the program's all-gathers, leading 1s dropped."""
    shapes = set()
    for dims in re.findall(r"= \w+\[([\d,]*)\][^=]*? all-gather(?:-start)?\(", hlo):
        shape = tuple(int(d) for d in dims.split(",") if d)
        while shape and shape[0] == 1:
            shape = shape[1:]
        shapes.add(shape)
    return shapes


def _weight_shapes(params) -> set[tuple[int, ...]]:
    """Every weight's shape and each of its trailing parts (a layer's or a stage's slice)."""
    leaves = jax.tree_util.tree_leaves(params)
    return {tuple(a.shape[i:]) for a in leaves for i in range(a.ndim - 1)}


@functools.cache
def _reference():
    """The plain scanned stack (no remat): weights, and loss, output, gradients on _inputs()."""
    x, side = _inputs()
    plain = _plain(StackedTransformerRepeated, checkpoint_policy=AutodiffCheckpointType.NONE)
    params = nn.unbox(plain.init(jax.random.key(0), x)["params"])["repeat"]["block"]
    step = jax.jit(
        jax.value_and_grad(lambda p: _loss(plain, {"repeat": {"block": p}}, x, side), has_aux=True)
    )
    return params, step(params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "remat",
    [AutodiffCheckpointType.NONE, AutodiffCheckpointType.SAVE_NOTHING],
    ids=lambda r: r.name,
)
@pytest.mark.parametrize("stages, repeat", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_pipelined_equals_plain_stack_outputs_and_gradients(stages, repeat, remat):
    x, side = _inputs()
    pipe = _pipeline(stages, repeat, remat, num_microbatches=4)
    mesh = Mesh(
        np.array(jax.devices()).reshape(stages, 1, 4 // stages, 2),
        ("stage", "replica", "data", "mdl"),
    )
    rules = filter_rules_for_mesh(DEFAULT_RULES, mesh)
    plain_params, ((r_loss, r_out), r_grad) = _reference()
    with nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(lambda: pipe.init(jax.random.key(0), x))["params"]
        shardings = strip_boxes(logical_shardings(abstract, mesh, rules))
    params = jax.device_put({"repeat": {"block": _to_pipelined(plain_params, repeat)}}, shardings)
    w1 = params["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    # Each device stores only its stage's layers.
    expected_spec = ("stage", None, "mdl") if repeat == 1 else (None, "stage", None, "mdl")
    assert w1.sharding.spec == PartitionSpec(*expected_spec)
    assert {s.data.shape[repeat - 1] for s in w1.addressable_shards} == {LAYERS // repeat // stages}

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        step = jax.jit(jax.value_and_grad(lambda p: _loss(pipe, p, x, side), has_aux=True))
        compiled = step.lower(params).compile()
        (p_loss, p_out), p_grad = compiled(params)
    # Activations move stage to stage; weights never leave their stage. The only
    # all-gathers are of activations split over 'mdl' on their model dim (praxis's a_bld).
    hlo = compiled.as_text()
    assert re.search(r"\bcollective-permute(?:-start)?\(", hlo)
    assert not _gathered_shapes(hlo) & _weight_shapes(params), _gathered_shapes(hlo)

    np.testing.assert_allclose(p_out, r_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p_loss, r_loss, rtol=1e-5)
    p_grad = _to_plain(jax.device_get(p_grad)["repeat"]["block"], repeat)
    leaves_p, leaves_r = jax.tree_util.tree_leaves(p_grad), jax.tree_util.tree_leaves(r_grad)
    assert len(leaves_p) == len(leaves_r) > 10
    scale = max(float(np.abs(b).max()) for b in leaves_r)
    for a, b in zip(leaves_p, leaves_r, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.optimized  # Asserts two programs' bits equal: as compiled for users.
@pytest.mark.slow
def test_initial_weights_are_the_plain_stacks():
    """Circular: [R, L / R, ...] holds the plain stack's layers in order (GPipe: [L, ...], as
    the main.py test shows through equal losses)."""
    x, _ = _inputs()
    repeat = 2
    pipe = _pipeline(2, repeat, AutodiffCheckpointType.NONE)
    boxed = jax.jit(pipe.init)(jax.random.key(0), x)["params"]["repeat"]["block"]
    leading = ("stages",) if repeat == 1 else (None, "stages")
    assert boxed["self_attention"]["w_q"].names == leading + ("embed", "heads", "head_dim")
    # The plain stack's init compiled here too (not _reference()'s, which an earlier test may
    # have compiled without the backend optimizations: other bits).
    plain = _plain(StackedTransformerRepeated, checkpoint_policy=AutodiffCheckpointType.NONE)
    plain_params = nn.unbox(jax.jit(plain.init)(jax.random.key(0), x)["params"])["repeat"]["block"]
    ours = _to_plain(nn.unbox(boxed), repeat)
    for a, b in zip(
        jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(plain_params), strict=True
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_dropout_differs_per_microbatch_and_is_reproducible():
    cfg = LayerwiseShardablePipelined.HParams.config(num_stages=2, num_microbatches=2)
    cfg.stage_tpl.num_layers = 1
    _block(cfg.stage_tpl.block_tpl)
    cfg.stage_tpl.block_tpl.residual_dropout_prob = 0.5
    pipe = instantiate(cfg)
    # Rows 0 and 2 form microbatch 0, rows 1 and 3 microbatch 1: same input, other masks.
    x = jnp.tile(jax.random.normal(jax.random.key(1), (1, SEQ, DIMS)), (4, 1, 1))
    params = jax.jit(pipe.init)(jax.random.key(0), x)["params"]
    run = jax.jit(lambda key: pipe.apply({"params": params}, x, train=True, rngs={"dropout": key}))
    y = run(jax.random.key(5))
    np.testing.assert_array_equal(y, run(jax.random.key(5)))
    assert not np.allclose(y[0], y[1])  # Different microbatches, different masks.
    assert not np.allclose(y, run(jax.random.key(6)))
    assert not np.allclose(y[0], y[2])  # One microbatch, two examples.


@pytest.mark.parametrize(
    "fields, batch, message",
    [
        (dict(num_microbatches=3), 8, "batch 8 does not split into 3 microbatches"),
        (dict(microbatch_size=3), 8, "microbatches of 3"),
        (dict(num_microbatches=2, microbatch_size=4), 8, "not both"),
        (dict(num_microbatches=2, circular_repeat=2), 8, "at least as many microbatches"),
        (dict(num_microbatches=6, stream_io=True), 12, "6 microbatches over the 4 stages"),
    ],
)
def test_bad_batch_or_schedule_is_named(fields, batch, message):
    repeat = fields.pop("circular_repeat", 1)
    pipe = _pipeline(4, repeat, AutodiffCheckpointType.NONE, **fields)
    x = jax.ShapeDtypeStruct((batch, SEQ, DIMS), jnp.float32)
    params = jax.eval_shape(pipe.init, jax.random.key(0), x)["params"]
    with pytest.raises(PipelineShapeError, match=message):  # Raised while tracing.
        jax.eval_shape(lambda p, x: pipe.apply({"params": p}, x), params, x)


class _RecordingBlock(Transformer):
    """A Transformer block that records an aux loss and a summary of its output (batch means)."""

    def __call__(self, x, **kwargs):
        y = super().__call__(x, **kwargs)
        self.add_aux_loss("output_mean_square", jnp.mean(y**2))
        self.add_summary("output_mean", jnp.mean(y))
        return y


def _recording(stack_cfg) -> None:
    """Makes the blocks of ``stack_cfg`` (a StackedTransformerRepeated config) record."""
    stack_cfg.block_tpl = _RecordingBlock.HParams.config()
    _block(stack_cfg.block_tpl)


def _recorded(module, params):
    """What ``module`` records on _inputs(): (the collections, the total aux loss)."""
    x, side = _inputs()
    apply = functools.partial(module.apply, mutable=[SUMMARIES, AUX_LOSS])
    _, mutables = ref.fast_jit(apply)({"params": params}, x, **side)
    return mutables, summaries_and_aux_losses(mutables)[1]


@functools.cache
def _plain_recorded():
    """The plain recording stack: its (noised) weights and what it records."""
    cfg = StackedTransformerRepeated.HParams.config(
        num_layers=LAYERS, checkpoint_policy=AutodiffCheckpointType.NONE
    )
    _recording(cfg)
    plain = instantiate(cfg)
    # Noised weights: a bubble iteration (zero input) would record non-zero values.
    params = ref.init_variables(plain, _inputs()[0])["params"]
    return params, *_recorded(plain, params)


@pytest.mark.slow
@pytest.mark.parametrize("stages, repeat", [(2, 1), (2, 2)])
def test_aux_losses_and_summaries_recorded_in_stages_match_the_plain_stack(stages, repeat):
    """Per layer, averaged over the microbatches: the plain stack's values for batch means."""
    params, want, want_aux = _plain_recorded()
    cfg = LayerwiseShardablePipelined.HParams.config(
        num_stages=stages, circular_repeat=repeat, num_microbatches=4
    )
    cfg.stage_tpl.num_layers = LAYERS // (stages * repeat)
    _recording(cfg.stage_tpl)
    pipe_params = {"repeat": {"block": _to_pipelined(params["repeat"]["block"], repeat)}}
    got, got_aux = _recorded(instantiate(cfg), pipe_params)
    per_layer = want[AUX_LOSS]["repeat"]["block"]["output_mean_square"][0]
    assert per_layer.shape == (LAYERS,) and len(np.unique(np.round(per_layer, 4))) > 1
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_aux, want_aux, rtol=1e-5)


@pytest.mark.slow
def test_stream_io_splits_the_microbatch_buffer_and_computes_the_same():
    """Pax's stream_io: the [M, mb, T, D] buffer lives split over the stages; same numbers."""
    x, side = _inputs()
    pipe = _pipeline(2, 1, AutodiffCheckpointType.NONE, num_microbatches=4, stream_io=True)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 1, 2, 2), ("stage", "replica", "data", "mdl"))
    rules = filter_rules_for_mesh(DEFAULT_RULES, mesh)
    plain_params, ((r_loss, r_out), _) = _reference()
    with nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(lambda: pipe.init(jax.random.key(0), x))["params"]
        shardings = strip_boxes(logical_shardings(abstract, mesh, rules))
    params = jax.device_put({"repeat": {"block": _to_pipelined(plain_params, 1)}}, shardings)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        step = jax.jit(lambda p: _loss(pipe, p, x, side))
        hlo = step.lower(params).as_text()
        p_loss, p_out = step(params)
    # The [M=4, mb, T, D] buffer is constrained with 'stage' on its microbatch dimension (and
    # its model dim split over 'mdl' as the layers' activations are).
    assert re.search(r'\[\{"stage"\}, \{"replica", "data"\}, \{\}, \{"mdl"\}\]> : tensor<4x', hlo)
    np.testing.assert_allclose(p_out, r_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p_loss, r_loss, rtol=1e-5)
