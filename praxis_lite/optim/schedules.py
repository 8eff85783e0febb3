"""Learning-rate schedules: Pax's schedules as frozen, Fiddle-configurable dataclasses.

A schedule maps a training step (the optimizer's update count, starting at 0) to a
float. As in Pax, an optimizer's learning rate at step ``s`` is
``optimizer.learning_rate * schedule(s)``, so most schedules here are unit-free
multipliers that peak at ``max=1.0``.

Each schedule only holds and validates its fields; ``make()`` assembles the
equivalent ``optax.Schedule`` from optax's schedule functions, and calling the
schedule evaluates it::

    cfg = praxis_lite.config.Config(LinearRampupCosineDecay,
                                    warmup_steps=1000, decay_start=1000, decay_end=100_000)
    fdl.build(cfg)(jnp.asarray(500))  # -> 0.5
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax


class BaseSchedule(abc.ABC):
    """A function of the step, built from optax schedules by :meth:`make`."""

    @abc.abstractmethod
    def make(self) -> optax.Schedule:
        """Returns the optax schedule: step (int scalar, may be traced) -> value."""

    def __call__(self, step: jax.typing.ArrayLike) -> jax.Array:
        """The schedule's value at ``step``, as a float32 scalar."""
        return jnp.asarray(self.make()(step), dtype=jnp.float32)


def _check_boundaries(boundaries: Sequence[int], owner: str) -> tuple[int, ...]:
    """Returns ``boundaries`` as a tuple after checking they are increasing steps >= 0."""
    boundaries = tuple(boundaries)
    if any(b < 0 for b in boundaries):
        raise ValueError(f"{owner}: boundaries must be steps >= 0, got {boundaries}.")
    if any(b1 >= b2 for b1, b2 in itertools.pairwise(boundaries)):
        raise ValueError(f"{owner}: boundaries must be strictly increasing, got {boundaries}.")
    return boundaries


@dataclasses.dataclass(frozen=True)
class Constant(BaseSchedule):
    """The same value at every step.

    Attributes:
      value: the value (a multiplier of the optimizer's learning rate).
    """

    value: float = 1.0

    def make(self) -> optax.Schedule:
        return optax.constant_schedule(self.value)


@dataclasses.dataclass(frozen=True)
class Linear(BaseSchedule):
    """Linear interpolation from ``start`` to ``limit``, flat outside.

    ``y0`` before step ``x0``, ``y1`` from step ``x1`` on, linear in between.

    Attributes:
      start: ``(x0, y0)``: step (>= 0) and value where the ramp starts.
      limit: ``(x1, y1)``: step (> x0) and value where the ramp ends.
    """

    start: tuple[int, float]
    limit: tuple[int, float]

    def __post_init__(self) -> None:
        for name in ("start", "limit"):
            point = tuple(getattr(self, name))
            if len(point) != 2:
                raise ValueError(f"Linear: {name} must be a (step, value) pair, got {point}.")
            object.__setattr__(self, name, point)
        (x0, _), (x1, _) = self.start, self.limit
        if not 0 <= x0 < x1:
            raise ValueError(f"Linear: need 0 <= start step < limit step, got {x0} and {x1}.")

    def make(self) -> optax.Schedule:
        (x0, y0), (x1, y1) = self.start, self.limit
        return optax.linear_schedule(
            init_value=y0, end_value=y1, transition_steps=x1 - x0, transition_begin=x0
        )


@dataclasses.dataclass(frozen=True)
class RsqrtDecay(BaseSchedule):
    """T5's inverse square root: ``1 / sqrt(max(step, warmup_steps))``.

    T5X's ``create_learning_rate_scheduler(factors='constant * rsqrt_decay')`` with its
    ``base_learning_rate`` as the optimizer's learning rate (``t5_1_1`` pretraining: 1.0
    and 10,000 steps, so 0.01 until step 10,000, then falling as ``1 / sqrt(step)``).

    Attributes:
      warmup_steps: the flat start (> 0), in steps.
    """

    warmup_steps: int = 10_000

    def __post_init__(self) -> None:
        if self.warmup_steps < 1:
            raise ValueError(f"RsqrtDecay: warmup_steps must be >= 1, got {self.warmup_steps}.")

    def make(self) -> optax.Schedule:
        floor = float(self.warmup_steps)
        return lambda step: jax.lax.rsqrt(jnp.maximum(jnp.asarray(step, jnp.float32), floor))


@dataclasses.dataclass(frozen=True)
class _LinearRampupDecay(BaseSchedule):
    """Ramps linearly 0 -> ``max``, holds ``max``, then decays to ``max * min_ratio``.

    Steps ``[0, warmup_steps)``: linear from 0 (at step 0) to ``max`` (at
    ``warmup_steps``). Steps ``[warmup_steps, decay_start)``: ``max``. Steps
    ``[decay_start, decay_end)``: the subclass's decay. From ``decay_end`` on:
    ``max * min_ratio``.

    Attributes:
      warmup_steps: length of the linear ramp, in steps (0: no ramp).
      decay_start: step at which the decay starts (>= warmup_steps).
      decay_end: step at which the decay ends (> decay_start).
      min_ratio: final value as a fraction of ``max``.
      max: peak value (a multiplier of the optimizer's learning rate).
    """

    warmup_steps: int
    decay_start: int
    decay_end: int
    min_ratio: float = 0.01
    max: float = 1.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.warmup_steps < 0:
            raise ValueError(f"{name}: warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.decay_start < self.warmup_steps:
            raise ValueError(
                f"{name}: decay_start ({self.decay_start}) must be >= warmup_steps "
                f"({self.warmup_steps})."
            )
        if self.decay_end <= self.decay_start:
            raise ValueError(
                f"{name}: decay_end ({self.decay_end}) must be > decay_start ({self.decay_start})."
            )
        if self.max <= 0:
            raise ValueError(f"{name}: max must be > 0, got {self.max}.")
        if not 0 <= self.min_ratio <= 1:
            raise ValueError(f"{name}: min_ratio must be in [0, 1], got {self.min_ratio}.")

    @abc.abstractmethod
    def _decay(self) -> optax.Schedule:
        """The decay from ``max`` to ``max * min_ratio``, in steps since decay_start."""

    def make(self) -> optax.Schedule:
        schedules, boundaries = [], []
        if self.warmup_steps > 0:
            schedules.append(optax.linear_schedule(0.0, self.max, self.warmup_steps))
            boundaries.append(self.warmup_steps)
        if self.decay_start > self.warmup_steps:
            schedules.append(optax.constant_schedule(self.max))
            boundaries.append(self.decay_start)
        schedules.append(self._decay())
        return optax.join_schedules(schedules, boundaries)


@dataclasses.dataclass(frozen=True)
class LinearRampupExponentialDecay(_LinearRampupDecay):
    """Linear rampup, hold, then exponential decay (Pax's schedule of that name).

    In the decay, ``value = max * min_ratio ** ((step - decay_start) / (decay_end -
    decay_start))``; ``min_ratio`` must be > 0. See :class:`_LinearRampupDecay`
    for the fields.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_ratio == 0:
            raise ValueError("LinearRampupExponentialDecay: min_ratio must be > 0, got 0.")

    def _decay(self) -> optax.Schedule:
        return optax.exponential_decay(
            init_value=self.max,
            transition_steps=self.decay_end - self.decay_start,
            decay_rate=self.min_ratio,
            end_value=self.max * self.min_ratio,
        )


@dataclasses.dataclass(frozen=True)
class LinearRampupCosineDecay(_LinearRampupDecay):
    """Linear rampup, hold, then cosine decay (Pax's schedule of that name).

    In the decay, ``value = max * (min_ratio + (1 - min_ratio) * (1 + cos(pi * t)) / 2)``
    with ``t = (step - decay_start) / (decay_end - decay_start)``. See
    :class:`_LinearRampupDecay` for the fields.
    """

    def _decay(self) -> optax.Schedule:
        return optax.cosine_decay_schedule(
            init_value=self.max,
            decay_steps=self.decay_end - self.decay_start,
            alpha=self.min_ratio,
        )


@dataclasses.dataclass(frozen=True)
class PiecewiseConstant(BaseSchedule):
    """A step function: ``values[i]`` on steps ``[boundaries[i-1], boundaries[i])``.

    ``values[0]`` before ``boundaries[0]``; ``values[-1]`` from ``boundaries[-1]`` on.

    Attributes:
      boundaries: steps at which the value changes, strictly increasing.
      values: one more value than boundaries.
    """

    boundaries: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        boundaries = _check_boundaries(self.boundaries, "PiecewiseConstant")
        object.__setattr__(self, "boundaries", boundaries)
        object.__setattr__(self, "values", tuple(self.values))
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError(
                f"PiecewiseConstant: need len(values) == len(boundaries) + 1, got "
                f"{len(self.values)} values and {len(self.boundaries)} boundaries."
            )

    def make(self) -> optax.Schedule:
        pieces = [optax.constant_schedule(v) for v in self.values]
        return optax.join_schedules(pieces, self.boundaries)


@dataclasses.dataclass(frozen=True)
class Piecewise(BaseSchedule):
    """Sub-schedules one after another, each given the steps since its own start.

    ``schedules[i]`` runs on steps ``[boundaries[i-1], boundaries[i])`` and is
    evaluated at ``step - boundaries[i-1]`` (Pax's ``PiecewiseSchedule``).

    Attributes:
      boundaries: steps at which the next sub-schedule takes over, strictly increasing.
      schedules: one more sub-schedule than boundaries.
    """

    boundaries: tuple[int, ...]
    schedules: tuple[BaseSchedule, ...]

    def __post_init__(self) -> None:
        boundaries = _check_boundaries(self.boundaries, "Piecewise")
        object.__setattr__(self, "boundaries", boundaries)
        object.__setattr__(self, "schedules", tuple(self.schedules))
        if len(self.schedules) != len(self.boundaries) + 1:
            raise ValueError(
                f"Piecewise: need len(schedules) == len(boundaries) + 1, got "
                f"{len(self.schedules)} schedules and {len(self.boundaries)} boundaries."
            )
        for s in self.schedules:
            if not isinstance(s, BaseSchedule):
                raise TypeError(f"Piecewise: schedules must be built schedules, got {s!r}.")

    def make(self) -> optax.Schedule:
        return optax.join_schedules([s.make() for s in self.schedules], self.boundaries)


#: T5X's ``create_learning_rate_scheduler`` factor names.
T5X_FACTORS = (
    "constant",
    "linear_warmup",
    "linear_decay",
    "rsqrt_decay",
    "rsqrt_normalized_decay",
    "decay_every",
    "cosine_decay",
)


#: The steps fields of T5xFactors -> the factors that divide by them.
_T5X_FACTOR_FIELDS = {
    "warmup_steps": (
        "linear_warmup",
        "linear_decay",
        "rsqrt_decay",
        "rsqrt_normalized_decay",
        "cosine_decay",
    ),
    "steps_per_decay": ("decay_every",),
    "steps_per_cycle": ("cosine_decay",),
}


@dataclasses.dataclass(frozen=True)
class T5xFactors(BaseSchedule):
    """T5X's ``utils.create_learning_rate_scheduler``: a product of named factors, floored at
    ``min_learning_rate``. It is the whole learning rate (its ``constant`` factor is
    ``base_learning_rate``): use it with the optimizer's ``learning_rate`` 1.0.

    With ``s = max(0, step - step_offset)`` and ``w = warmup_steps``: ``constant`` is
    ``base_learning_rate``; ``linear_warmup`` ``min(1, s / w)``; ``linear_decay``
    ``base_learning_rate * min(s / w, 1 + decay_factor * (w - s))``; ``rsqrt_decay``
    ``1 / sqrt(max(s, w))``; ``rsqrt_normalized_decay`` ``sqrt(w) / sqrt(max(s, w))``;
    ``decay_every`` ``decay_factor ** (s // steps_per_decay)``; ``cosine_decay``
    ``max(0, (1 + cos(pi * frac(max(0, s - w) / steps_per_cycle))) / 2)``.

    Attributes:
      factors: the names, as T5X writes them (``'constant * rsqrt_decay'``).
      base_learning_rate, warmup_steps (steps), decay_factor, steps_per_decay (steps),
      steps_per_cycle (steps), step_offset (steps), min_learning_rate: T5X's arguments.
    """

    factors: str = "constant * linear_warmup * rsqrt_decay"
    base_learning_rate: float = 0.5
    warmup_steps: int = 1000
    decay_factor: float = 0.5
    steps_per_decay: int = 20000
    steps_per_cycle: int = 100000
    step_offset: int = 0
    min_learning_rate: float = 1e-8

    def __post_init__(self) -> None:
        unknown = [name for name in self.names() if name not in T5X_FACTORS]
        if unknown:
            raise ValueError(
                f"T5xFactors: unknown factor(s) {unknown} in {self.factors!r}; T5X's are "
                f"{', '.join(T5X_FACTORS)}."
            )
        names = self.names()
        for field, users in _T5X_FACTOR_FIELDS.items():
            used_by = [name for name in names if name in users]
            if used_by and getattr(self, field) < 1:
                raise ValueError(
                    f"T5xFactors: {field} must be >= 1 for {', '.join(used_by)}, got "
                    f"{getattr(self, field)}."
                )

    def names(self) -> list[str]:
        """The factors' names, in order."""
        return [name.strip() for name in self.factors.split("*")]

    def make(self) -> optax.Schedule:
        names = self.names()

        def schedule(step: jax.typing.ArrayLike) -> jax.Array:
            s = jnp.maximum(0.0, jnp.asarray(step, jnp.float32) - self.step_offset)
            value = jnp.asarray(1.0, jnp.float32)
            for name in names:
                value = value * self._factor(name, s)
            return jnp.maximum(value, self.min_learning_rate)

        return schedule

    def _factor(self, name: str, s: jax.Array) -> jax.Array:
        w = float(self.warmup_steps)
        if name == "constant":
            return jnp.asarray(self.base_learning_rate, jnp.float32)
        if name == "linear_warmup":
            return jnp.minimum(1.0, s / w)
        if name == "linear_decay":
            return self.base_learning_rate * jnp.minimum(s / w, 1.0 + self.decay_factor * (w - s))
        if name == "rsqrt_decay":
            return jax.lax.rsqrt(jnp.maximum(s, w))
        if name == "rsqrt_normalized_decay":
            return jnp.sqrt(w) * jax.lax.rsqrt(jnp.maximum(s, w))
        if name == "decay_every":
            return jnp.asarray(self.decay_factor, jnp.float32) ** jnp.floor(
                s / self.steps_per_decay
            )
        progress = jnp.maximum(0.0, (s - w) / self.steps_per_cycle)  # cosine_decay
        return jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0))))
