"""Schedules against plain-Python references of Pax's definitions; Fiddle configs; validation."""

import bisect
import math

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.config import Config
from praxis_lite.optim import schedules


def _ref_rampup_decay(step, warmup, decay_start, decay_end, min_ratio, peak, decay):
    """Linear 0 -> peak over warmup, hold peak, decay to peak * min_ratio, hold."""
    if step < warmup:
        return peak * step / warmup
    if step < decay_start:
        return peak
    t = min(step - decay_start, decay_end - decay_start) / (decay_end - decay_start)
    if decay == "exp":
        return peak * min_ratio**t
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _probe_steps(warmup, decay_start, decay_end):
    """Warmup start, mid-warmup, peak, hold, decay start, mid-decay, end, beyond end."""
    steps = {0, warmup // 2, warmup, (warmup + decay_start) // 2, decay_start}
    steps |= {decay_start + 1, (decay_start + decay_end) // 2, decay_end - 1, decay_end}
    return sorted(steps | {decay_end + 1, 10 * decay_end})


def _assert_matches(schedule, reference, steps):
    got = np.array([float(schedule(jnp.asarray(s))) for s in steps])
    want = np.array([reference(s) for s in steps])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    jitted = jax.jit(schedule)(jnp.asarray(steps))
    np.testing.assert_allclose(np.asarray(jitted), want, rtol=1e-5, atol=1e-7)


def test_constant():
    _assert_matches(schedules.Constant(0.3), lambda s: 0.3, [0, 1, 1000])
    assert schedules.Constant()(jnp.asarray(7)).dtype == jnp.float32


def test_rsqrt_decay_is_t5s_inverse_square_root():
    schedule = schedules.RsqrtDecay(warmup_steps=10_000)
    steps = np.array([0, 1, 9_999, 10_000, 40_000, 1_000_000])
    expected = 1.0 / np.sqrt(np.maximum(steps, 10_000))
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps"):
        schedules.RsqrtDecay(warmup_steps=0)


def test_linear():
    sched = schedules.Linear(start=(10, 1.0), limit=(30, 0.2))

    def ref(s):
        return float(np.interp(s, [10, 30], [1.0, 0.2]))

    _assert_matches(sched, ref, [0, 10, 15, 20, 29, 30, 1000])


@pytest.mark.parametrize(
    "cls, decay",
    [
        (schedules.LinearRampupExponentialDecay, "exp"),
        (schedules.LinearRampupCosineDecay, "cos"),
    ],
)
@pytest.mark.parametrize(
    "warmup, decay_start, decay_end, min_ratio, peak",
    [
        (10, 20, 120, 0.01, 1.0),
        (8, 8, 40, 0.1, 2.5),  # no hold
        (0, 5, 25, 0.5, 1.0),  # no warmup
        (0, 0, 7, 0.2, 1.0),  # decay only
    ],
)
def test_linear_rampup_decay(cls, decay, warmup, decay_start, decay_end, min_ratio, peak):
    sched = cls(warmup, decay_start, decay_end, min_ratio=min_ratio, max=peak)

    def ref(s):
        return _ref_rampup_decay(s, warmup, decay_start, decay_end, min_ratio, peak, decay)

    _assert_matches(sched, ref, _probe_steps(warmup, decay_start, decay_end))


def test_cosine_decay_to_zero():
    sched = schedules.LinearRampupCosineDecay(4, 4, 12, min_ratio=0.0)
    np.testing.assert_allclose(float(sched(jnp.asarray(8))), 0.5, rtol=1e-6)
    assert float(sched(jnp.asarray(12))) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    "boundaries, values",
    [
        ((), (0.7,)),
        ((5,), (1.0, 0.1)),
        ((3, 10, 20), (1.0, 0.0, 0.25, 0.5)),  # a zero value is fine
    ],
)
def test_piecewise_constant(boundaries, values):
    sched = schedules.PiecewiseConstant(boundaries=boundaries, values=values)

    def ref(s):
        return values[bisect.bisect_right(boundaries, s)]

    steps = sorted({0, 1, 100} | {b + d for b in boundaries for d in (-1, 0, 1)})
    _assert_matches(sched, ref, steps)


def test_piecewise_passes_relative_steps():
    warmup = schedules.Linear(start=(0, 0.0), limit=(10, 1.0))
    decay = schedules.LinearRampupCosineDecay(0, 0, 50, min_ratio=0.1)
    sched = schedules.Piecewise(
        boundaries=[10, 60], schedules=[warmup, decay, schedules.Constant(0.1)]
    )

    def ref(s):
        if s < 10:
            return s / 10
        if s < 60:
            return _ref_rampup_decay(s - 10, 0, 0, 50, 0.1, 1.0, "cos")
        return 0.1

    _assert_matches(sched, ref, [0, 5, 9, 10, 11, 35, 59, 60, 1000])


def test_builds_from_fiddle_config():
    cfg = Config(schedules.LinearRampupExponentialDecay, warmup_steps=10, decay_start=20)
    cfg.decay_end = 100
    cfg.min_ratio = 0.05
    built = fdl.build(cfg)
    assert built == schedules.LinearRampupExponentialDecay(10, 20, 100, min_ratio=0.05)

    pw = Config(
        schedules.Piecewise,
        boundaries=[5],
        schedules=[Config(schedules.Constant, value=2.0), fdl.Config(schedules.Constant)],
    )
    built = fdl.build(pw)
    assert built.schedules == (schedules.Constant(2.0), schedules.Constant(1.0))
    assert built.boundaries == (5,)
    hash(built)  # frozen and hashable once lists became tuples


def test_fiddle_typo_raises():
    with pytest.raises(AttributeError, match="Did you mean 'value'"):
        Config(schedules.Constant, valeu=1.0)
    cfg = Config(schedules.LinearRampupCosineDecay)
    with pytest.raises(AttributeError, match="warmup_steps"):
        cfg.warmup_step = 10


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: schedules.LinearRampupCosineDecay(10, 5, 20), "decay_start"),
        (lambda: schedules.LinearRampupCosineDecay(0, 20, 20), "decay_end"),
        (lambda: schedules.LinearRampupCosineDecay(-1, 0, 20), "warmup_steps"),
        (lambda: schedules.LinearRampupCosineDecay(0, 0, 20, max=0.0), "max"),
        (lambda: schedules.LinearRampupCosineDecay(0, 0, 20, min_ratio=1.5), "min_ratio"),
        (lambda: schedules.LinearRampupExponentialDecay(0, 0, 20, min_ratio=0.0), "min_ratio"),
        (lambda: schedules.PiecewiseConstant([5, 5], [1.0, 0.5, 0.1]), "strictly increasing"),
        (lambda: schedules.PiecewiseConstant([10, 5], [1.0, 0.5, 0.1]), "strictly increasing"),
        (lambda: schedules.PiecewiseConstant([-1], [1.0, 0.5]), ">= 0"),
        (lambda: schedules.PiecewiseConstant([5], [1.0]), "len"),
        (lambda: schedules.Piecewise([5], [schedules.Constant()]), "len"),
        (lambda: schedules.Linear(start=(5, 1.0), limit=(5, 0.0)), "start step"),
        (lambda: schedules.Linear(start=(5,), limit=(6, 0.0)), "pair"),
    ],
)
def test_invalid_fields_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_piecewise_rejects_unbuilt_configs():
    with pytest.raises(TypeError, match="built schedules"):
        schedules.Piecewise([5], [schedules.Constant(), Config(schedules.Constant)])


def _t5x_reference(step, factors, base, warmup, decay_factor, per_decay, per_cycle, offset, floor):
    """T5X's create_learning_rate_scheduler, factor by factor, in numpy (float64)."""
    s = max(0.0, step - offset)
    value = 1.0
    for name in (n.strip() for n in factors.split("*")):
        value *= {
            "constant": base,
            "linear_warmup": min(1.0, s / warmup),
            "linear_decay": base * min(s / warmup, 1.0 + decay_factor * (warmup - s)),
            "rsqrt_decay": 1.0 / math.sqrt(max(s, warmup)),
            "rsqrt_normalized_decay": math.sqrt(warmup) / math.sqrt(max(s, warmup)),
            "decay_every": decay_factor ** (s // per_decay),
            "cosine_decay": max(
                0.0, 0.5 * (1.0 + math.cos(math.pi * (max(0.0, (s - warmup) / per_cycle) % 1.0)))
            ),
        }[name]
    return max(value, floor)


@pytest.mark.parametrize(
    "factors",
    [
        "constant * rsqrt_decay",
        "constant",
        "constant * linear_warmup * rsqrt_decay",
        "constant * linear_warmup * cosine_decay",
        "linear_decay",
        "constant * rsqrt_normalized_decay * decay_every",
    ],
)
def test_t5x_factors_match_t5x_s_formulas(factors):
    args = dict(
        factors=factors,
        base_learning_rate=0.7,
        warmup_steps=40,
        decay_factor=0.5,
        steps_per_decay=30,
        steps_per_cycle=70,
        step_offset=5,
        min_learning_rate=1e-4,
    )
    schedule = schedules.T5xFactors(**args)
    steps = [0, 3, 5, 20, 44, 45, 90, 111, 200, 400]
    ours = [float(schedule(jnp.asarray(step))) for step in steps]
    expected = [_t5x_reference(step, *args.values()) for step in steps]
    np.testing.assert_allclose(ours, expected, rtol=2e-6)


def test_t5x_factors_refuse_unknown_names():
    with pytest.raises(ValueError, match="unknown factor"):
        schedules.T5xFactors(factors="constant * rsqrt")
