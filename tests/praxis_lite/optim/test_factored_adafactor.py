"""Adafactor with factor_rules against a numpy reference of T5X's Adafactor.

The reference follows ``t5x/adafactor.py``: ``set_param_axes`` (logical names -> factor
rule), ``_parse_rule`` with its fallback to the size heuristic for 2-D parameters
without batch dims, and ``apply_param_gradient``. It runs on the parameters as T5X
shapes them (attention kernels ``[E, H*D]`` named ('embed', 'joined_kv'), the fused QKV
kernel with a 'stack' dim), and our optimizer on ours (``[D, N, H]``), so agreement
says that our kernels are factored, clipped and scaled as T5X's are.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from praxis_lite.optim import optimizers, schedules
from praxis_lite.optim.factored_adafactor import (
    T5X_FACTOR_RULES,
    FactoredMoment,
    FactoredRmsState,
    FactorLayout,
    FullMoment,
)
from praxis_lite.sharding import strip_boxes
from tests.praxis_lite.optim.optax_steps import apply_steps

D, N, H, F, L, NUM_BUCKETS = 8, 3, 4, 16, 2, 5
MIN_DIM = 6  # D, N*H and F reach it; N and H do not.
_RNG = np.random.default_rng(0)

# name: (our shape, our logical axes, T5X's shape, T5X's logical axes)
_PARAMS = {
    "w_q": ((D, N, H), ("embed", "heads", "head_dim"), (D, N * H), ("embed", "joined_kv")),
    "w_post": ((N, H, D), ("heads", "head_dim", "embed"), (N * H, D), ("joined_kv", "embed")),
    "w_qkv": (
        (3, D, N, H),
        (None, "embed", "heads", "head_dim"),
        (3, D, N * H),
        ("stack", "embed", "joined_kv"),
    ),
    "wi": ((D, F), ("embed", "mlp"), (D, F), ("embed", "mlp")),
    "narrow": ((4, F), ("embed", "mlp"), (4, F), ("embed", "mlp")),  # 4 < MIN_DIM
    "scanned_wi": ((L, D, F), ("layers", "embed", "mlp"), (L, D, F), ("layers", "embed", "mlp")),
    "scale": ((D,), ("embed",), (D,), ("embed",)),
    "scanned_scale": ((L, D), ("layers", "embed"), (L, D), ("layers", "embed")),
    "rel_bias": ((N, NUM_BUCKETS), ("heads", None), (N, NUM_BUCKETS), ("heads", "relpos_buckets")),
}


def _init_value(shape):
    # Scanned and fused stacks get a different scale per slice, so that per-slice RMS matters.
    x = _RNG.normal(size=shape)
    if len(shape) > 1:
        x = x * np.geomspace(0.05, 2.0, shape[0]).reshape((-1,) + (1,) * (len(shape) - 1))
    return x.astype(np.float32)


_INIT = {k: _init_value(shape) for k, (shape, *_) in _PARAMS.items()}
# Gradients whose scale jumps between steps: the decayed second moment lags and clipping acts.
_GRADS = [
    {k: (s * _RNG.normal(size=v.shape)).astype(np.float32) for k, v in _INIT.items()}
    for s in (1.0, 5.0, 0.3, 12.0)
]
_SCHEDULE = schedules.LinearRampupCosineDecay(2, 2, 6, min_ratio=0.1)


def _boxed(values):
    return {k: nn.LogicallyPartitioned(jnp.asarray(v), _PARAMS[k][1]) for k, v in values.items()}


# --- T5X's Adafactor in numpy (float64) ------------------------------------------------
_T5X_RULES = {  # standard_logical_factor_rules()
    "vocab": "column", "embed": "row", "mlp": "column", "heads": "column", "kv": "column",
    "joined_kv": "column", "relpos_buckets": "none", "layers": "batch", "stack": "batch",
}  # fmt: skip


def _t5x_rule(axes):
    """``Adafactor.set_param_axes``: a partial ROW/COLUMN rule becomes NONE."""
    rule = tuple(_T5X_RULES[a] for a in axes)
    assert not {"row", "column", "none"} <= set(rule), "T5X raises on incomplete rules"
    if not {"row", "column"} <= set(rule):
        rule = tuple("none" if r in ("row", "column") else r for r in rule)
    return rule


def _dims(rule, kind):
    return tuple(i for i, r in enumerate(rule) if r == kind)


def _t5x_parse(rule, shape):
    """``_parse_rule`` and ``_factored_dims``: (averaging dims, (row dims, col dims) | None)."""
    batch = _dims(rule, "batch")
    if len(shape) <= 2 and not batch:  # the fallback to the size heuristic
        if len(shape) < 2 or sorted(shape)[-2] < MIN_DIM:
            return tuple(range(len(shape))), None
        order = np.argsort(shape, kind="stable")
        return tuple(range(len(shape))), ((int(order[-2]),), (int(order[-1]),))
    averaging = tuple(d for d in range(len(shape)) if d not in batch)
    rows, cols = _dims(rule, "row"), _dims(rule, "column")
    return averaging, ((rows, cols) if rows or cols else None)


def _t5x_param_step(opt, step, param, grad, state, rule):
    """``apply_param_gradient`` at 0-based ``step``; weight decay as ours (lr * wd * param)."""
    averaging, factored = _t5x_parse(rule, param.shape)
    lr = opt.learning_rate * float(opt.lr_schedule(jnp.asarray(step)))
    decay = 1.0 - (step + 1.0) ** -opt.decay_rate
    grad_sqr = grad * grad + opt.epsilon
    if factored is not None:
        rows, cols = factored
        v_row = decay * state.get("v_row", 0.0) + (1 - decay) * grad_sqr.mean(axis=cols)
        v_col = decay * state.get("v_col", 0.0) + (1 - decay) * grad_sqr.mean(axis=rows)
        state = dict(state, v_row=v_row, v_col=v_col)
        reduced_rows = tuple(d - sum(c < d for c in cols) for d in rows)
        row_factor = (v_row / v_row.mean(axis=reduced_rows, keepdims=True)) ** -0.5
        y = grad * np.expand_dims(row_factor, cols) * np.expand_dims(v_col**-0.5, rows)
    else:
        v = state["v"] = decay * state.get("v", 0.0) + (1 - decay) * grad_sqr
        y = grad * v**-0.5
    rms = lambda x: np.sqrt(np.mean(x * x, axis=averaging, keepdims=True))
    if opt.clipping_threshold is not None:
        y = y / np.maximum(1.0, rms(y) / opt.clipping_threshold)
    scale = (
        lr * np.maximum(opt.min_param_scale, rms(param)) if opt.multiply_by_parameter_scale else lr
    )
    subtrahend = scale * y
    if opt.momentum is not None:
        subtrahend = state["m"] = (
            opt.momentum * state.get("m", 0.0) + (1 - opt.momentum) * subtrahend
        )
    return param - subtrahend - lr * opt.weight_decay * param, state


def _t5x_run(opt):
    """T5X's updates of the T5X-shaped parameters, reshaped back to ours."""
    params = {k: v.astype(np.float64).reshape(_PARAMS[k][2]) for k, v in _INIT.items()}
    states = {k: {} for k in params}
    for step, grads in enumerate(_GRADS):
        for k in params:
            g = grads[k].astype(np.float64).reshape(_PARAMS[k][2])
            rule = _t5x_rule(_PARAMS[k][3])
            params[k], states[k] = _t5x_param_step(opt, step, params[k], g, states[k], rule)
    return {k: v.reshape(_INIT[k].shape) for k, v in params.items()}


# --- Ours, as the trainer runs it -------------------------------------------------------
def _run(opt):
    """init on boxed params, boxes stripped, then jitted updates (as paxlite.train.pure_steps)."""
    tx = opt.make()
    state = strip_boxes(tx.init(_boxed(_INIT)))
    params = jax.tree.map(jnp.asarray, _INIT)
    return apply_steps(tx, params, state, _GRADS, lambda _, grads: grads)


def _t5x_adafactor(**fields):
    return optimizers.Adafactor(
        learning_rate=0.05,
        lr_schedule=_SCHEDULE,
        min_dim_size_to_factor=MIN_DIM,
        factor_rules=T5X_FACTOR_RULES,
        **fields,
    )


@pytest.mark.parametrize(
    "fields",
    [
        dict(),  # T5 1.1's: decay 0.8, clipping 1.0, parameter scale, no momentum
        dict(momentum=0.9, weight_decay=0.1, clipping_threshold=1.5, decay_rate=0.5),
        dict(clipping_threshold=None, multiply_by_parameter_scale=False),
    ],
    ids=["t5_1_1", "momentum_decay_clip1.5", "no_clip_absolute_lr"],
)
def test_matches_t5x_on_t5x_shaped_params(fields):
    opt = _t5x_adafactor(**fields)
    got, _ = _run(opt)
    want = _t5x_run(opt)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-6, atol=1e-7, err_msg=k)


def test_factoring_by_size_differs_from_t5x():
    # optax's rule leaves [D, N, H] unfactored and averages RMS over whole stacks: not T5X.
    opt = _t5x_adafactor()
    by_size, _ = _run(dataclasses.replace(opt, factor_rules=None))
    want = _t5x_run(opt)
    for k in ("w_q", "w_post", "w_qkv", "scanned_wi", "scanned_scale"):
        assert not np.allclose(by_size[k], want[k], rtol=1e-4), k


def _factored_rms(state):
    return next(s for s in state if isinstance(s, FactoredRmsState))


def _moments(state):
    return _factored_rms(state).moments


def test_state_shapes_and_logical_names():
    moments = _moments(_t5x_adafactor().make().init(_boxed(_INIT)))
    w_q = moments["w_q"]
    assert isinstance(w_q, FactoredMoment)
    assert w_q.layout == FactorLayout(row_dims=(0,), col_dims=(1, 2))
    assert (w_q.v_row.value.shape, w_q.v_row.names) == ((D,), ("embed",))
    assert (w_q.v_col.value.shape, w_q.v_col.names) == ((N, H), ("heads", "head_dim"))
    assert w_q.v_row.value.dtype == jnp.float32
    stack = moments["scanned_wi"]
    assert (stack.v_row.value.shape, stack.v_row.names) == ((L, D), ("layers", "embed"))
    assert (stack.v_col.value.shape, stack.v_col.names) == ((L, F), ("layers", "mlp"))
    qkv = moments["w_qkv"]  # the unnamed 3 is a batch dim, as T5X's 'stack'
    assert qkv.layout == FactorLayout(row_dims=(1,), col_dims=(2, 3), batch_dims=(0,))
    assert (qkv.v_col.value.shape, qkv.v_col.names) == ((3, N, H), (None, "heads", "head_dim"))
    for k in ("narrow", "scale", "rel_bias"):
        assert isinstance(moments[k], FullMoment), k
    assert moments["scanned_scale"].layout == FactorLayout(batch_dims=(0,))
    assert moments["scale"].v.names == ("embed",)
    # The reduced names are what sharding reads.
    specs = nn.get_partition_spec(moments)
    assert specs["w_q"].v_col == jax.sharding.PartitionSpec("heads", "head_dim")
    # optax's rule, same min_dim_size_to_factor: N, H < MIN_DIM, so [D, N, H] is not factored.
    by_size = optimizers.Adafactor(learning_rate=0.1, min_dim_size_to_factor=MIN_DIM)
    factored = next(s for s in by_size.make().init(_INIT) if isinstance(s, optax.FactoredState))
    assert factored.v["w_q"].shape == (D, N, H) and factored.v_row["w_q"].shape == (1,)


def test_plain_arrays_use_optax_rule():
    moments = _moments(_t5x_adafactor().make().init(_INIT))
    assert isinstance(moments["w_q"], FullMoment)  # N, H < MIN_DIM
    assert moments["wi"].layout == FactorLayout(row_dims=(0,), col_dims=(1,))
    assert moments["scanned_wi"].layout == FactorLayout(row_dims=(1,), col_dims=(2,))


def test_unknown_axis_name_raises():
    tx = _t5x_adafactor().make()
    with pytest.raises(ValueError, match=r"\['spam'\].*\['w'\]"):
        tx.init({"w": nn.LogicallyPartitioned(jnp.zeros((D, F)), ("embed", "spam"))})


def test_eval_shape_and_jit_keep_the_layouts():
    tx = _t5x_adafactor().make()
    abstract = strip_boxes(jax.eval_shape(tx.init, _boxed(_INIT)))
    _, state = _run(_t5x_adafactor())  # after jitted steps
    # The treedefs (layouts included, as static metadata) and shapes agree: a restore target.
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    assert jax.tree.map(lambda x: x.shape, abstract) == jax.tree.map(np.shape, state)
    assert _moments(state)["w_q"].layout == FactorLayout(row_dims=(0,), col_dims=(1, 2))
    assert int(_factored_rms(state).count) == len(_GRADS)


def test_factor_rules_must_be_factor_dims():
    with pytest.raises(TypeError, match="FactorDim"):
        optimizers.Adafactor(learning_rate=1.0, factor_rules=(("embed", "row"),))
