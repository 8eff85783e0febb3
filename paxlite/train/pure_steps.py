"""Pure builders of the init, train and eval step functions (no I/O, no loop).

Shapes: batches are NestedMaps of ``[global_batch, ...]`` arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlite.experiments.tasks_lib import SingleTask
from paxlite.train import trainable
from paxlite.train.train_state import TrainState
from praxis_lite.base_layer import (
    AUX_LOSS,
    SUMMARIES,
    summaries_and_aux_losses,
    summary_scalars,
)
from praxis_lite.py_utils import NestedMap, to_microbatches
from praxis_lite.sharding import BATCH

Metrics = dict[str, jax.Array]


def make_init_fn(task: SingleTask) -> Callable[[jax.Array, NestedMap], TrainState]:
    """``init(key, sample_batch) -> TrainState`` with boxed (logically named) leaves.

    The optimizer state is initialized from the boxed params, so its per-param
    moments carry the same logical axis names and shard like the params; it covers
    the trained parameters only (``paxlite.train.trainable``). The batch only provides
    shapes (it may be abstract under ``jax.eval_shape``).

    Raises:
      trainable.FreezeError: the learner's inclusion/exclusion regexes do not fit.
    """
    state_around = make_state_fn(task)

    def init(key: jax.Array, sample_batch: NestedMap) -> TrainState:
        variables = task.model.init({"params": key, "dropout": key}, sample_batch)
        return state_around(variables["params"])

    return init


def make_state_fn(task: SingleTask) -> Callable[[Any], TrainState]:
    """``state(params) -> TrainState`` of step 0 around ``params`` (boxed or not): the
    optimizer's fresh state for the trained parameters, no non-finite steps.

    Raises:
      trainable.FreezeError: the learner's inclusion/exclusion regexes do not fit.
    """
    tx = task.learner.optimizer.make()

    def state(params: Any) -> TrainState:
        trained, _ = trainable.split(params, trainable.trainable_keys(params, task.learner))
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(trained),
            nonfinite_steps=jnp.zeros((), jnp.int32),
            first_nonfinite_step=jnp.full((), -1, jnp.int32),
        )

    return state


def make_train_step(
    task: SingleTask,
) -> Callable[[TrainState, NestedMap, jax.Array], tuple[TrainState, Metrics]]:
    """``train_step(state, batch, key) -> (new_state, metrics)``.

    The dropout RNG is ``fold_in(key, step)``, so a run is a pure function of the
    seed and the data: a resumed run takes the same steps as an uninterrupted one.
    A step whose loss or gradient norm is not finite leaves params and optimizer
    state unchanged and is counted in ``nonfinite_steps`` (checked on the host only
    at summary/save points, so there is no extra sync per step).
    Only the parameters the learner trains are differentiated and updated; the frozen
    ones (``paxlite.train.trainable``) pass through unchanged.
    Metrics: ``loss`` (the model's metric named by ``task.learner.loss_name``), the
    model's other metrics by name, ``num_tokens`` (the loss's weight), ``aux_loss``
    (the sum of the layers' ``add_aux_loss`` terms, added to the loss that is
    differentiated), grad_norm, learning_rate, nonfinite_steps, and
    ``summaries/<layer path>/<name>`` for each ``add_summary`` of the model.
    """
    model = task.model
    optimizer = task.learner.optimizer
    tx = optimizer.make()
    loss_name = task.learner.loss_name
    accum_steps = task.learner.grad_accum_steps

    def loss_fn(params, batch, key):
        out, mutables = model.apply(
            {"params": params},
            batch,
            train=True,
            rngs={"dropout": key},
            mutable=[SUMMARIES, AUX_LOSS],
        )
        summaries, aux_loss = summaries_and_aux_losses(mutables)
        loss = out.metrics[loss_name][0]
        return loss + aux_loss, (out.metrics, aux_loss, summary_scalars(summaries))

    def train_step(state: TrainState, batch: NestedMap, key: jax.Array):
        step_key = jax.random.fold_in(key, state.step)
        trained, frozen = trainable.split(
            state.params, trainable.trainable_keys(state.params, task.learner)
        )

        def trained_loss_fn(part, batch, key):
            return loss_fn(trainable.merge(part, frozen), batch, key)

        if accum_steps == 1:
            grads, (model_metrics, aux_loss, summaries) = jax.grad(trained_loss_fn, has_aux=True)(
                trained, batch, step_key
            )
        else:
            grads, (model_metrics, aux_loss, summaries) = accumulated_gradients(
                trained_loss_fn, loss_name, trained, batch, step_key, accum_steps
            )
        loss, num_tokens = model_metrics[loss_name]
        grads = _normalized_gradients(grads, num_tokens, task.learner.loss_normalizing_factor)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = _apply_if_finite(tx, state, trained, frozen, grads, finite)
        metrics = {
            "loss": loss,
            **{k: mean for k, (mean, _) in model_metrics.items() if k != loss_name},
            "num_tokens": num_tokens,
            "aux_loss": aux_loss,
            "grad_norm": grad_norm,
            "nonfinite_steps": new_state.nonfinite_steps,
            "learning_rate": optimizer.learning_rate_at(state.step),
            **{f"summaries/{name}": value for name, value in summaries.items()},
        }
        return new_state, metrics

    return train_step


def _normalized_gradients(grads: Any, num_tokens: jax.Array, factor: float | None) -> Any:
    """Gradients of the per-token mean loss as the learner's ``loss_normalizing_factor``
    asks: unchanged for None, else those of the loss summed over ``num_tokens`` tokens and
    divided by ``factor`` (T5X's), i.e. scaled by ``num_tokens / factor``."""
    if factor is None:
        return grads
    scale = jax.lax.stop_gradient(num_tokens).astype(jnp.float32) / factor
    return jax.tree_util.tree_map(lambda g: (g * scale).astype(g.dtype), grads)


def accumulated_gradients(
    loss_fn: Callable[..., Any],
    loss_name: str,
    params: Any,
    batch: NestedMap,
    key: jax.Array,
    num_microbatches: int,
) -> tuple[Any, tuple[dict[str, Any], jax.Array, dict[str, jax.Array]]]:
    """``jax.grad(loss_fn)`` of the whole batch, taken over ``num_microbatches`` parts.

    ``loss_fn(params, batch, key) -> (loss + aux_loss, (metrics, aux_loss, summaries))``
    where ``metrics[name] = (mean, weight)``. The parts run one after the other (a
    ``lax.scan``: one part's activations alive at a time). Gradients, the loss, every
    metric and the aux loss are weighted by each part's loss weight (its tokens) and
    divided by the whole batch's, so they equal one pass over the batch (not a mean of
    per-part means); summaries are the parts' mean. Part ``i`` takes rows ``i, i + K,
    ...`` of each device's rows, so every part stays split over the batch shards.
    Dropout uses ``fold_in(key, i)`` in part ``i``.

    Returns:
      ``(grads, (metrics, aux_loss, summaries))`` shaped as ``jax.grad(loss_fn, has_aux=True)``'s.
    """
    parts = jax.tree_util.tree_map(lambda x: _microbatches(x, num_microbatches), batch)

    def weighted(p, part, part_key):
        total, (metrics, aux_loss, summaries) = loss_fn(p, part, part_key)
        weight = jax.lax.stop_gradient(metrics[loss_name][1])
        sums = {name: (mean * w, w) for name, (mean, w) in metrics.items()}
        return total * weight, (sums, aux_loss * weight, summaries)

    grad_fn = jax.grad(weighted, has_aux=True)

    def add_part(totals, part_and_index):
        part, index = part_and_index
        found = grad_fn(params, part, jax.random.fold_in(key, index))
        return jax.tree_util.tree_map(lambda t, f: t + f.astype(t.dtype), totals, found), None

    first = jax.tree_util.tree_map(lambda x: x[0], parts)
    found_shapes = jax.eval_shape(grad_fn, params, first, key)
    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, _sum_dtype(a.dtype)), found_shapes)
    indices = jnp.arange(num_microbatches)
    (grads, (sums, aux_sum, summaries)), _ = jax.lax.scan(add_part, zeros, (parts, indices))
    total_weight = sums[loss_name][1]
    safe = lambda w: jnp.where(w > 0, w, 1.0)  # noqa: E731  (an all-padding batch: zeros)
    grads = jax.tree_util.tree_map(
        lambda g, shape: (g / safe(total_weight)).astype(shape.dtype), grads, found_shapes[0]
    )
    metrics = {name: (s / safe(w), w) for name, (s, w) in sums.items()}
    summaries = {name: value / num_microbatches for name, value in summaries.items()}
    return grads, (metrics, aux_sum / safe(total_weight), summaries)


def _sum_dtype(dtype: Any) -> Any:
    """Sums of floating values accumulate in float32 (bfloat16 gradients included)."""
    return jnp.promote_types(dtype, jnp.float32) if jnp.issubdtype(dtype, jnp.floating) else dtype


def _microbatches(x: jax.Array, num_microbatches: int) -> jax.Array:
    """``[B, ...] -> [K, B / K, ...]`` as the pipeline's microbatches (rows ``i, i + K,
    ...``: each device's rows split into K parts in place), kept split over the batch."""
    parts = to_microbatches(x, num_microbatches)
    return nn.with_logical_constraint(parts, (None, BATCH) + (None,) * (x.ndim - 1))


def _apply_if_finite(
    tx: optax.GradientTransformation,
    state: TrainState,
    trained: Any,
    frozen: Any,
    grads: Any,
    finite: jax.Array,
) -> TrainState:
    """The next state: the update of the ``trained`` parameters applied if ``finite``, else
    they and their moments kept; the ``frozen`` ones returned as they are."""
    updates, opt_state = tx.update(grads, state.opt_state, trained)
    new_trained = optax.apply_updates(trained, updates)
    only_if_finite = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    first_bad = jnp.where(
        (state.first_nonfinite_step < 0) & ~finite, state.step, state.first_nonfinite_step
    )
    new_trained = jax.tree_util.tree_map(only_if_finite, new_trained, trained)
    return TrainState(
        step=state.step + 1,
        params=trainable.merge(new_trained, frozen),
        opt_state=jax.tree_util.tree_map(only_if_finite, opt_state, state.opt_state),
        nonfinite_steps=state.nonfinite_steps + (~finite).astype(jnp.int32),
        first_nonfinite_step=first_bad,
    )


def make_eval_step(
    task: SingleTask, per_example: bool = False
) -> Callable[[Any, NestedMap], dict[str, Any]]:
    """``eval_step(params, batch) -> {'sums': {...}, 'weights': {...}}`` to average over batches.

    ``sums[name]`` is the model's metric times its weight, ``weights[name]`` the
    weight; the learner's loss metric is named ``loss``. With ``per_example``,
    also the model's ``per_example`` outputs (``score [B]``, ``weight [B]``,
    ``target_ids [B, T]``), for SeqIO score metrics.
    """
    model = task.model
    loss_name = task.learner.loss_name

    def eval_step(params: Any, batch: NestedMap) -> dict[str, Any]:
        out = model.apply({"params": params}, batch, train=False)
        named = {("loss" if k == loss_name else k): v for k, v in out.metrics.items()}
        result = {
            "sums": {k: mean * weight for k, (mean, weight) in named.items()},
            "weights": {k: weight for k, (_, weight) in named.items()},
        }
        if per_example:
            result["per_example"] = dict(out.per_example)
        return result

    return eval_step
