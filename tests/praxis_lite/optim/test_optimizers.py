"""Optimizers against numpy references of their update rules, on a small quadratic."""

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from praxis_lite.config import Config
from praxis_lite.optim import optimizers, schedules
from tests.praxis_lite.optim.optax_steps import apply_steps

_RNG = np.random.default_rng(0)
_INIT = {
    "w": _RNG.normal(size=(3, 4)).astype(np.float32),
    "b": _RNG.normal(size=(4,)).astype(np.float32),
}
_CURV = {k: _RNG.uniform(0.5, 2.0, size=v.shape).astype(np.float32) for k, v in _INIT.items()}
_TARGET = {k: _RNG.normal(size=v.shape).astype(np.float32) for k, v in _INIT.items()}
# lr multiplier 0, 0.25, 0.5, 0.75 in warmup, then cosine decay: exercises the schedule plumbing.
_SCHEDULE = schedules.LinearRampupCosineDecay(4, 4, 10, min_ratio=0.1)
_NUM_STEPS = 6


def _grads(params):
    """Gradient of the quadratic 0.5 * sum(curv * (p - target)**2); works for numpy and jax."""
    return {k: _CURV[k] * (params[k] - _TARGET[k]) for k in params}


def _loss(params):
    return sum(0.5 * jnp.sum(_CURV[k] * (params[k] - _TARGET[k]) ** 2) for k in params)


def _run(opt, num_steps=_NUM_STEPS, grads_fn=_grads, init=_INIT):
    """``num_steps`` jitted steps from ``init``, each step's gradient ``grads_fn(params)``."""
    tx = opt.make()
    params = jax.tree.map(jnp.asarray, init)
    return apply_steps(tx, params, tx.init(params), [None] * num_steps, lambda p, _: grads_fn(p))


def _lr(opt, step):
    return opt.learning_rate * float(opt.lr_schedule(jnp.asarray(step)))


def _ref_sgd(opt, num_steps=_NUM_STEPS):
    params = {k: v.copy() for k, v in _INIT.items()}
    trace = {k: np.zeros_like(v) for k, v in params.items()}
    for t in range(num_steps):
        grads = _grads(params)
        for k in params:
            g = grads[k] + opt.weight_decay * params[k]
            trace[k] = g + opt.momentum * trace[k]
            direction = g + opt.momentum * trace[k] if opt.nesterov else trace[k]
            params[k] = params[k] - _lr(opt, t) * direction
    return params


def _ref_adam(opt, num_steps=_NUM_STEPS):
    params = {k: v.copy() for k, v in _INIT.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    b1, b2 = opt.beta1, opt.beta2
    for t in range(num_steps):
        grads = _grads(params)
        for k in params:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            m_hat, v_hat = m[k] / (1 - b1 ** (t + 1)), v[k] / (1 - b2 ** (t + 1))
            raw = m_hat / (np.sqrt(v_hat + opt.epsilon_root) + opt.epsilon)
            if opt.clip_threshold > 0:  # praxis's update capping, per tensor
                raw = raw / max(1.0, np.sqrt(np.mean(raw**2)) / opt.clip_threshold)
            direction = raw + opt.weight_decay * params[k]
            params[k] = params[k] - _lr(opt, t) * direction
    return params


def _assert_close(got, want):
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize(
    "momentum, nesterov, weight_decay",
    [
        (0.0, False, 0.0),
        (0.9, False, 0.0),
        (0.9, True, 0.0),
        (0.8, False, 0.05),
    ],
)
def test_sgd_matches_reference(momentum, nesterov, weight_decay):
    opt = optimizers.Sgd(
        learning_rate=0.3,
        lr_schedule=_SCHEDULE,
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
    )
    got, _ = _run(opt)
    _assert_close(got, _ref_sgd(opt))


@pytest.mark.parametrize(
    "weight_decay, epsilon_root, clip_threshold",
    [
        (0.0, 0.0, -1.0),  # Adam
        (0.1, 0.0, -1.0),  # AdamW
        (0.1, 0.0, 0.5),  # praxis's update capping bites: the first updates have RMS 1
        (0.0, 0.3, 1.0),  # epsilon inside the root
    ],
)
def test_adam_matches_reference(weight_decay, epsilon_root, clip_threshold):
    opt = optimizers.Adam(
        learning_rate=0.2,
        lr_schedule=_SCHEDULE,
        beta1=0.8,
        beta2=0.95,
        epsilon=1e-6,
        epsilon_root=epsilon_root,
        clip_threshold=clip_threshold,
        weight_decay=weight_decay,
    )
    got, _ = _run(opt)
    _assert_close(got, _ref_adam(opt))


def test_adam_update_capping_changes_the_run():
    """The capped and uncapped runs differ (so the reference above tests the capping)."""
    common = dict(learning_rate=0.2, lr_schedule=_SCHEDULE, beta1=0.8, beta2=0.95)
    capped, _ = _run(optimizers.Adam(clip_threshold=0.5, **common))
    free, _ = _run(optimizers.Adam(clip_threshold=-1.0, **common))
    assert not np.allclose(capped["w"], free["w"], atol=1e-4)


def test_adafactor_decreases_loss_and_factors_state():
    init = {"w": _INIT["w"], "b": _INIT["b"]}
    opt = optimizers.Adafactor(learning_rate=0.1, min_dim_size_to_factor=2)
    params, state = _run(opt, num_steps=20, init=init)
    assert float(_loss(params)) < 0.5 * float(_loss(init))
    assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, init)
    factored = next(s for s in state if isinstance(s, optax.FactoredState))
    # A [3, 4] weight keeps a row and a column second-moment vector, not a [3, 4] one.
    assert factored.v_row["w"].shape == (3,) and factored.v_col["w"].shape == (4,)
    assert factored.v["b"].shape == (4,)  # 1-D: unfactored
    assert int(factored.count) == 20


# --- Adafactor against the published rule ---------------------------------------------
# Gradients independent of the parameters, their scale jumping between steps, so that the
# second-moment average lags the current gradient and update clipping does something.
_GRAD_RNG = np.random.default_rng(1)
_ADAFACTOR_GRADS = [
    {k: (scale * _GRAD_RNG.normal(size=v.shape)).astype(np.float32) for k, v in _INIT.items()}
    for scale in (1.0, 4.0, 0.5, 8.0, 1.0, 16.0)
]


def _run_on_gradients(opt, grads_seq):
    """Applies ``opt`` to _INIT with the given gradient of each step (float32, jitted)."""
    tx = opt.make()
    params = jax.tree.map(jnp.asarray, _INIT)
    return apply_steps(tx, params, tx.init(params), grads_seq, lambda _, grads: grads)


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(a**2)))


def _ref_adafactor(opt, grads_seq=_ADAFACTOR_GRADS, decay_exponent=None, clipping="opt"):
    """Adafactor (Shazeer & Stern 2018, Algorithms 4 and 5) as T5X runs it, in float64.

    Step ``t = 1, 2, ...``: second-moment decay ``1 - t ** -decay_rate``; ``g^2 + eps1``
    averaged per row and per column of a factored (2-D, both dims >= min_dim_size_to_factor)
    parameter, ``V = R C / mean(R)``, else elementwise; ``U = G / sqrt(V)``, divided by
    ``max(1, RMS(U) / d)``; step size ``lr(t)`` times ``max(eps2 = 1e-3, RMS(param))`` when
    parameters scale it; decoupled decay ``lr(t) * weight_decay * param``.
    ``decay_exponent`` / ``clipping`` override the optimizer's (to show they matter).
    """
    exponent = opt.decay_rate if decay_exponent is None else decay_exponent
    threshold = opt.clipping_threshold if clipping == "opt" else clipping
    params = {k: v.astype(np.float64) for k, v in _INIT.items()}
    moments = {}
    for t, grads in enumerate(grads_seq, start=1):
        decay = 1.0 - t**-exponent
        for k, g in grads.items():
            g2 = g.astype(np.float64) ** 2 + opt.epsilon
            if g.ndim == 2 and min(g.shape) >= opt.min_dim_size_to_factor:
                row, col = moments.get(k, (0.0, 0.0))
                row = decay * row + (1 - decay) * g2.mean(axis=1)
                col = decay * col + (1 - decay) * g2.mean(axis=0)
                moments[k] = row, col
                v = np.outer(row, col) / row.mean()
            else:
                v = moments[k] = decay * moments.get(k, 0.0) + (1 - decay) * g2
            u = g / np.sqrt(v)
            if threshold is not None:
                u = u / max(1.0, _rms(u) / threshold)
            lr = _lr(opt, t - 1)
            step_size = lr * max(1e-3, _rms(params[k])) if opt.multiply_by_parameter_scale else lr
            params[k] = params[k] - step_size * u - lr * opt.weight_decay * params[k]
    return params


@pytest.mark.parametrize(
    "fields",
    [
        dict(min_dim_size_to_factor=2),  # The defaults (T5X's); w [3, 4] factored
        dict(decay_rate=0.5, clipping_threshold=None, multiply_by_parameter_scale=False),
        dict(min_dim_size_to_factor=3, clipping_threshold=1.5, weight_decay=0.1),
    ],
    ids=["t5x_factored", "unfactored_no_clip_absolute_lr", "clip1.5_weight_decay"],
)
def test_adafactor_matches_published_rule(fields):
    opt = optimizers.Adafactor(learning_rate=0.05, lr_schedule=_SCHEDULE, **fields)
    got, state = _run_on_gradients(opt, _ADAFACTOR_GRADS)
    want = _ref_adafactor(opt)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
    factored = next(s for s in state if isinstance(s, optax.FactoredState))
    assert (factored.v_row["w"].shape == (3,)) == (opt.min_dim_size_to_factor <= 3)
    # The decay schedule and the clipping each change the result on these gradients.
    other_exponent = _ref_adafactor(opt, decay_exponent=opt.decay_rate / 2)
    assert not np.allclose(want["w"], other_exponent["w"], rtol=1e-4)
    if opt.clipping_threshold is not None:
        assert not np.allclose(want["w"], _ref_adafactor(opt, clipping=None)["w"], rtol=1e-4)


def test_global_norm_clipping_rescales_the_gradient():
    clip = 0.5
    huge = {k: 1e4 * _RNG.normal(size=v.shape).astype(np.float32) for k, v in _INIT.items()}
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in huge.values()))
    opt = optimizers.Sgd(learning_rate=0.1, clip_gradient_norm_to_value=clip)
    got, _ = _run(opt, num_steps=1, grads_fn=lambda p: huge)
    for k in _INIT:
        want = _INIT[k] - 0.1 * huge[k] * (clip / norm)
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, err_msg=k)
    # A gradient under the clip norm passes unchanged.
    small = {k: (g * (0.5 * clip / norm)).astype(np.float32) for k, g in huge.items()}
    got, _ = _run(opt, num_steps=1, grads_fn=lambda p: small)
    _assert_close(got, {k: _INIT[k] - 0.1 * small[k] for k in _INIT})


@pytest.mark.parametrize("cls", [optimizers.Sgd, optimizers.Adam, optimizers.Adafactor])
def test_weight_decay_shrinks_params_with_zero_gradient(cls):
    lr, wd = 0.5, 0.1
    zeros = lambda p: jax.tree.map(jnp.zeros_like, p)
    got, _ = _run(cls(learning_rate=lr, weight_decay=wd), num_steps=1, grads_fn=zeros)
    _assert_close(got, {k: v * (1 - lr * wd) for k, v in _INIT.items()})
    unchanged, _ = _run(cls(learning_rate=lr), num_steps=1, grads_fn=zeros)
    _assert_close(unchanged, _INIT)


def test_learning_rate_at():
    opt = optimizers.Adam(learning_rate=3e-3, lr_schedule=_SCHEDULE)
    for step in [0, 2, 4, 7, 100]:
        lr = opt.learning_rate_at(jnp.asarray(step))
        assert lr.dtype == jnp.float32
        np.testing.assert_allclose(float(lr), 3e-3 * float(_SCHEDULE(step)), rtol=1e-6)
    jitted = jax.jit(opt.learning_rate_at)(jnp.arange(3))
    np.testing.assert_allclose(np.asarray(jitted), [0.0, 7.5e-4, 1.5e-3], rtol=1e-6)
    assert float(optimizers.Sgd(learning_rate=0.1).learning_rate_at(5)) == pytest.approx(0.1)


@pytest.mark.parametrize("cls", [optimizers.Sgd, optimizers.Adam, optimizers.Adafactor])
def test_builds_from_fiddle_config(cls):
    cfg = Config(cls, learning_rate=1e-2, clip_gradient_norm_to_value=1.0)
    cfg.lr_schedule = Config(schedules.PiecewiseConstant, boundaries=[10], values=[1.0, 0.1])
    opt = fdl.build(cfg)
    assert isinstance(opt, cls)
    assert opt.lr_schedule == schedules.PiecewiseConstant((10,), (1.0, 0.1))
    assert float(opt.learning_rate_at(10)) == pytest.approx(1e-3)
    _run(opt, num_steps=2)  # the built transformation runs
    assert fdl.build(Config(cls, learning_rate=1.0)).lr_schedule == schedules.Constant(1.0)


def test_fiddle_typo_raises():
    with pytest.raises(AttributeError, match="Did you mean 'learning_rate'"):
        Config(optimizers.Adam, learning_rat=1e-3)
    cfg = Config(optimizers.Sgd, learning_rate=0.1)
    with pytest.raises(AttributeError, match="momentum"):
        cfg.momentun = 0.9


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: optimizers.Sgd(learning_rate=-1.0), "learning_rate"),
        (lambda: optimizers.Sgd(learning_rate=0.1, momentum=1.0), "momentum"),
        (lambda: optimizers.Adam(learning_rate=0.1, beta2=1.5), "beta2"),
        (lambda: optimizers.Adam(learning_rate=0.1, weight_decay=-0.1), "weight_decay"),
        (lambda: optimizers.Adam(learning_rate=0.1, clip_gradient_norm_to_value=-1.0), "clip"),
        (
            lambda: optimizers.Adafactor(learning_rate=0.1, clipping_threshold=0.5),
            "clipping_threshold",
        ),
    ],
)
def test_invalid_fields_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unbuilt_schedule_raises():
    with pytest.raises(TypeError, match="lr_schedule"):
        optimizers.Adam(learning_rate=0.1, lr_schedule=Config(schedules.Constant))


def test_optax_chain_is_optax_s_chain_of_the_named_calls():
    """Oracle: the same optax transformations built by hand."""
    schedule = {
        "name": "warmup_cosine_decay_schedule",
        "init_value": 0.0,
        "peak_value": 1e-2,
        "warmup_steps": 2,
        "decay_steps": 10,
    }
    chain = optimizers.OptaxChain(
        transformations=(
            {"name": "clip", "max_delta": 0.5},
            {"name": "adamw", "learning_rate": schedule, "weight_decay": 0.1},
        )
    )
    by_hand = optax.chain(
        optax.clip(0.5),
        optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10), weight_decay=0.1),
    )
    params = {"w": jnp.arange(6.0).reshape(2, 3)}
    grads = {"w": jnp.linspace(-2.0, 2.0, 6).reshape(2, 3)}
    ours, theirs = chain.make(), by_hand
    state_a, state_b = ours.init(params), theirs.init(params)
    for _ in range(3):
        update_a, state_a = ours.update(grads, state_a, params)
        update_b, state_b = theirs.update(grads, state_b, params)
        np.testing.assert_array_equal(update_a["w"], update_b["w"])
    assert float(chain.learning_rate_at(1)) == pytest.approx(5e-3)


def test_optax_chain_refuses_unknown_calls():
    with pytest.raises(ValueError, match="optax has no function 'adamz'"):
        optimizers.OptaxChain(transformations=({"name": "adamz"},))
    with pytest.raises(ValueError, match="optax.clip"):
        optimizers.OptaxChain(transformations=({"name": "clip", "max_dleta": 1.0},))
