"""Optimizers as frozen, Fiddle-configurable dataclasses over optax.

An optimizer holds its hyperparameters; ``make()`` returns the optax
``GradientTransformation``. The learning rate at step ``s`` (the optimizer's
update count, 0 for the first update) is ``learning_rate * lr_schedule(s)``, as in
Pax; :meth:`BaseOptimizer.learning_rate_at` returns it for logging. When
``clip_gradient_norm_to_value > 0``, gradients are first rescaled so that their
global L2 norm (over all parameters) is at most that value::

    cfg = praxis_lite.config.Config(Adam, learning_rate=3e-4, weight_decay=0.1,
                                    clip_gradient_norm_to_value=1.0)
    cfg.lr_schedule = praxis_lite.config.Config(
        schedules.LinearRampupCosineDecay, warmup_steps=1000, decay_start=1000, decay_end=100_000)
    tx = fdl.build(cfg).make()
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from praxis_lite.optim import factored_adafactor, schedules

# Adafactor's factor_rules, re-exported beside the optimizer that takes them.
FactorDim = factored_adafactor.FactorDim
T5X_FACTOR_RULES = factored_adafactor.T5X_FACTOR_RULES


@dataclasses.dataclass(frozen=True)
class BaseOptimizer(abc.ABC):
    """Fields and chaining shared by all optimizers; subclasses pick the optax transform.

    Attributes:
      learning_rate: base learning rate; the rate at step ``s`` is
        ``learning_rate * lr_schedule(s)``.
      lr_schedule: unit-free multiplier of ``learning_rate`` as a function of the step
        (default: ``Constant(1.0)``).
      clip_gradient_norm_to_value: if > 0, the global L2 norm the gradients are clipped
        to before the optimizer sees them; 0 turns clipping off.
      weight_decay: per-step decay rate of the parameters (0: off); how it enters the
        update is said by each subclass.
    """

    learning_rate: float
    lr_schedule: schedules.BaseSchedule = schedules.Constant()
    clip_gradient_norm_to_value: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.learning_rate < 0:
            raise ValueError(f"{name}: learning_rate must be >= 0, got {self.learning_rate}.")
        if not isinstance(self.lr_schedule, schedules.BaseSchedule):
            raise TypeError(
                f"{name}: lr_schedule must be a built schedule, got {self.lr_schedule!r}."
            )
        if self.clip_gradient_norm_to_value < 0:
            raise ValueError(
                f"{name}: clip_gradient_norm_to_value must be >= 0 (0: off), "
                f"got {self.clip_gradient_norm_to_value}."
            )
        if self.weight_decay < 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {self.weight_decay}.")

    @abc.abstractmethod
    def _transform(self, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        """The optax optimizer, with weight decay, driven by ``learning_rate(step)``."""

    def _learning_rate_fn(self) -> optax.Schedule:
        schedule = self.lr_schedule.make()
        peak = self.learning_rate
        return lambda step: jnp.asarray(peak * schedule(step), dtype=jnp.float32)

    def learning_rate_at(self, step: jax.typing.ArrayLike) -> jax.Array:
        """The learning rate used by the update at ``step`` (float32 scalar)."""
        return self._learning_rate_fn()(step)

    def make(self) -> optax.GradientTransformation:
        """The optax transformation: global-norm clipping (if on), then the optimizer."""
        tx = self._transform(self._learning_rate_fn())
        if self.clip_gradient_norm_to_value > 0:
            tx = optax.chain(optax.clip_by_global_norm(self.clip_gradient_norm_to_value), tx)
        return tx


def _check_decay_rate(owner: BaseOptimizer, name: str) -> None:
    value = getattr(owner, name)
    if not 0 <= value < 1:
        raise ValueError(f"{type(owner).__name__}: {name} must be in [0, 1), got {value}.")


@dataclasses.dataclass(frozen=True)
class Sgd(BaseOptimizer):
    """SGD with optional (Nesterov) momentum (``optax.sgd``).

    ``weight_decay`` is L2 regularization: ``weight_decay * param`` is added to the
    gradient before momentum (``optax.add_decayed_weights``).

    Attributes:
      momentum: decay of the momentum accumulator, in [0, 1); 0: plain SGD.
      nesterov: use Nesterov momentum.
    """

    momentum: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_decay_rate(self, "momentum")

    def _transform(self, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        sgd = optax.sgd(learning_rate, momentum=self.momentum or None, nesterov=self.nesterov)
        if self.weight_decay > 0:
            return optax.chain(optax.add_decayed_weights(self.weight_decay), sgd)
        return sgd


@dataclasses.dataclass(frozen=True)
class Adam(BaseOptimizer):
    """Adam as praxis computes it: optax's moments, then update capping, then decoupled decay.

    The raw update of each parameter tensor is ``m_hat / (sqrt(v_hat + epsilon_root)
    + epsilon)`` (``optax.scale_by_adam``); when ``clip_threshold > 0`` it is divided
    by ``max(1, rms(update) / clip_threshold)`` (``optax.clip_by_block_rms``, praxis's
    update capping); then ``weight_decay * param`` is added (AdamW's decoupled decay)
    and the sum is scaled by ``-lr(step)``.

    Attributes:
      beta1: decay of the first-moment estimate, in [0, 1).
      beta2: decay of the second-moment estimate, in [0, 1).
      epsilon: added to the root of the second moment (units of the gradient).
      epsilon_root: added to the second moment inside the root (units of gradient squared).
      clip_threshold: the largest RMS of one tensor's raw update (praxis's default 1.0);
        0 or less: no capping (Pax's experiments write -1).
    """

    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    epsilon_root: float = 0.0
    clip_threshold: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_decay_rate(self, "beta1")
        _check_decay_rate(self, "beta2")
        for name in ("epsilon", "epsilon_root"):
            if getattr(self, name) < 0:
                raise ValueError(f"Adam: {name} must be >= 0, got {getattr(self, name)}.")

    def _transform(self, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        steps = [
            optax.scale_by_adam(
                b1=self.beta1, b2=self.beta2, eps=self.epsilon, eps_root=self.epsilon_root
            )
        ]
        if self.clip_threshold > 0:
            steps.append(optax.clip_by_block_rms(self.clip_threshold))
        if self.weight_decay > 0:
            steps.append(optax.add_decayed_weights(self.weight_decay))
        steps.append(optax.scale_by_learning_rate(learning_rate))
        return optax.chain(*steps)


@dataclasses.dataclass(frozen=True)
class Adafactor(BaseOptimizer):
    """Adafactor: factored second moments, low memory; optax's or T5X's factoring.

    Per parameter: ``U = G / sqrt(V)`` with ``V`` the (factored) second moment of
    ``G^2 + epsilon``, decayed by ``1 - (s + 1)**-decay_rate`` at update ``s``
    (0-based); ``U`` divided by ``max(1, RMS(U) / clipping_threshold)``; times
    ``lr(s)``, and with ``multiply_by_parameter_scale`` times
    ``max(min_param_scale, RMS(param))``; then the optional momentum. ``weight_decay``
    is decoupled and scaled like AdamW's: each step subtracts
    ``lr(s) * weight_decay * param``.

    ``factor_rules`` None is optax's Adafactor (``optax.adafactor``): a parameter is
    factored over its two largest dims when both are at least
    ``min_dim_size_to_factor``, and the RMS of clipping and parameter scale is taken over
    the whole parameter. ``factor_rules`` set (e.g. ``T5X_FACTOR_RULES``, T5X's standard
    rules on our axis names) factors by the logical axis names of the boxed parameters
    given to ``init``, as T5X's ``logical_factor_rules`` do: an attention kernel
    ``[D, N, H]`` keeps ``v_row [D]`` and ``v_col [N, H]``, like T5X's ``[E, H*D]``, and
    a scanned stack's 'layers' dim is a batch dim, each layer clipped and scaled by its
    own RMS (see :mod:`praxis_lite.optim.factored_adafactor`; parameters without names fall
    back to optax's rule).

    Attributes:
      decay_rate: exponent of the second-moment decay schedule ``1 - (s + 1)**-decay_rate``.
      clipping_threshold: clip each update to this RMS (>= 1); None: off.
      multiply_by_parameter_scale: scale the learning rate by each parameter's RMS.
      momentum: decay of an (optional) first-moment accumulator; None: no momentum.
      min_dim_size_to_factor: the smallest dim (for ``factor_rules``: the smallest
        product of the ROW dims and of the COLUMN dims of a parameter with no batch dims)
        that a factored second moment needs.
      epsilon: added to the squared gradient (units of gradient squared; T5X's epsilon1).
      min_param_scale: the smallest parameter RMS the learning rate is multiplied by
        (T5X's epsilon2).
      factor_rules: ``(logical axis name, FactorDim)`` pairs that pick the factored dims
        by name; None: optax's size rule.
    """

    decay_rate: float = 0.8
    clipping_threshold: float | None = 1.0
    multiply_by_parameter_scale: bool = True
    momentum: float | None = None
    min_dim_size_to_factor: int = 128
    epsilon: float = 1e-30
    min_param_scale: float = 1e-3
    factor_rules: factored_adafactor.FactorRules | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clipping_threshold is not None and self.clipping_threshold < 1:
            raise ValueError(
                "Adafactor: clipping_threshold must be >= 1 or None (off), "
                f"got {self.clipping_threshold}."
            )
        if self.momentum is not None:
            _check_decay_rate(self, "momentum")
        if self.min_param_scale < 0:
            raise ValueError(
                f"Adafactor: min_param_scale must be >= 0, got {self.min_param_scale}."
            )
        for name, kind in self.factor_rules or ():
            if not isinstance(kind, factored_adafactor.FactorDim):
                raise TypeError(
                    f"Adafactor: factor_rules must map names to FactorDim, got {name!r}: {kind!r}."
                )

    def _blocks(self) -> list[optax.GradientTransformation | None]:
        """Second moments, update clipping and parameter scale (None: off): optax's, or
        the ones that read logical names."""
        threshold, min_scale = self.clipping_threshold, self.min_param_scale
        if self.factor_rules is None:
            moments = optax.scale_by_factored_rms(
                decay_rate=self.decay_rate,
                min_dim_size_to_factor=self.min_dim_size_to_factor,
                epsilon=self.epsilon,
            )
            clip = optax.clip_by_block_rms(threshold) if threshold is not None else None
            param_scale = optax.scale_by_param_block_rms(min_scale)
        else:
            layouts = functools.partial(
                factored_adafactor.factor_layouts,
                rules=self.factor_rules,
                min_dim_size_to_factor=self.min_dim_size_to_factor,
            )
            moments = factored_adafactor.scale_by_factored_rms(
                layouts, self.decay_rate, self.epsilon
            )
            clip = None
            if threshold is not None:
                clip = factored_adafactor.clip_by_block_rms(threshold, layouts)
            param_scale = factored_adafactor.scale_by_param_block_rms(min_scale, layouts)
        return [moments, clip, param_scale if self.multiply_by_parameter_scale else None]

    def _transform(self, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        # optax.adafactor's chain, with the blocks that factoring decides swapped in.
        moments, clip, param_scale = self._blocks()
        steps = [
            moments,
            clip,
            optax.scale_by_learning_rate(learning_rate, flip_sign=False),
            param_scale,
        ]
        if self.momentum is not None:
            steps.append(optax.ema(self.momentum, debias=False, accumulator_dtype=jnp.float32))
        if self.weight_decay > 0:
            steps.append(
                optax.add_decayed_weights(lambda step: self.weight_decay * learning_rate(step))
            )
        steps.append(optax.scale(-1))
        return optax.chain(*(step for step in steps if step is not None))


#: An optax call as T5X's gin files write it: ``{"name": "adamw", "learning_rate": ..., ...}``
#: (arguments by name; a value that is itself such a dict is built first).
OptaxCall = Mapping[str, Any]


def build_optax_call(call: OptaxCall) -> Any:
    """``optax.<name>(**arguments)``, nested calls (a schedule) built first.

    Raises:
      ValueError: optax has no such function, or it refuses the arguments.
    """
    name = call.get("name")
    function = getattr(optax, str(name), None)
    if not callable(function):
        raise ValueError(f"OptaxChain: optax has no function {name!r}.")
    arguments = {
        key: build_optax_call(value) if isinstance(value, Mapping) and "name" in value else value
        for key, value in call.items()
        if key != "name"
    }
    try:
        return function(**arguments)
    except TypeError as e:
        raise ValueError(f"OptaxChain: optax.{name}: {e}") from None


@dataclasses.dataclass(frozen=True)
class OptaxChain(BaseOptimizer):
    """Any optax transformations, chained in order (T5X's ``optimizers.chain`` of
    ``optax.clip``, ``optax.adamw`` with an optax schedule as its learning rate, ...).

    The transformations carry their own learning rate; ``learning_rate`` multiplies nothing
    (keep 1.0). The rate reported with the losses is that of the first transformation given
    a ``learning_rate`` (a number or an optax schedule).

    Attributes:
      transformations: ``OptaxCall`` dicts, e.g. ``({"name": "clip", "max_delta": 1.0},
        {"name": "adamw", "learning_rate": {"name": "warmup_cosine_decay_schedule",
        "init_value": 0.0, "peak_value": 1e-4, "warmup_steps": 1000, "decay_steps":
        50000}})``.
    """

    learning_rate: float = 1.0
    transformations: tuple[OptaxCall, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.transformations:
            raise ValueError("OptaxChain: give at least one transformation.")
        for call in self.transformations:
            build_optax_call(call)  # Refuses unknown names and arguments now.

    def _transform(self, learning_rate: optax.Schedule) -> optax.GradientTransformation:
        del learning_rate  # Each transformation has its own.
        return optax.chain(*(build_optax_call(call) for call in self.transformations))

    def _learning_rate_fn(self) -> optax.Schedule:
        for call in self.transformations:
            rate = call.get("learning_rate")
            if rate is None:
                continue
            if isinstance(rate, Mapping):
                schedule = build_optax_call(rate)
                return lambda step: jnp.asarray(schedule(step), dtype=jnp.float32)
            return lambda step: jnp.asarray(rate, dtype=jnp.float32)
        return lambda step: jnp.asarray(self.learning_rate, dtype=jnp.float32)
