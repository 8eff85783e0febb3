"""Pure builders of the init, train and eval step functions (no I/O, no loop).

Shapes: batches are NestedMaps of ``[global_batch, ...]`` arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from paxlite.tasks_lib import SingleTask
from paxlite.train_state import TrainState
from praxis_lite.base_layer import (
    AUX_LOSS,
    SUMMARIES,
    summaries_and_aux_losses,
    summary_scalars,
)
from praxis_lite.py_utils import NestedMap

Metrics = dict[str, jax.Array]


def make_init_fn(task: SingleTask) -> Callable[[jax.Array, NestedMap], TrainState]:
    """``init(key, sample_batch) -> TrainState`` with boxed (logically named) leaves.

    The optimizer state is initialized from the boxed params, so its per-param
    moments carry the same logical axis names and shard like the params. The
    batch only provides shapes (it may be abstract under ``jax.eval_shape``).
    """
    tx = task.learner.optimizer.make()

    def init(key: jax.Array, sample_batch: NestedMap) -> TrainState:
        variables = task.model.init({"params": key, "dropout": key}, sample_batch)
        params = variables["params"]
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            nonfinite_steps=jnp.zeros((), jnp.int32),
            first_nonfinite_step=jnp.full((), -1, jnp.int32),
        )

    return init


def make_train_step(
    task: SingleTask,
) -> Callable[[TrainState, NestedMap, jax.Array], tuple[TrainState, Metrics]]:
    """``train_step(state, batch, key) -> (new_state, metrics)``.

    The dropout RNG is ``fold_in(key, step)``, so a run is a pure function of the
    seed and the data: a resumed run takes the same steps as an uninterrupted one.
    A step whose loss or gradient norm is not finite leaves params and optimizer
    state unchanged and is counted in ``nonfinite_steps`` (checked on the host only
    at summary/save points, so there is no extra sync per step).
    Metrics: loss, accuracy, log_pplx, grad_norm, learning_rate, num_tokens,
    aux_loss (the sum of the layers' ``add_aux_loss`` terms, added to the loss that is
    differentiated), nonfinite_steps, and ``summaries/<layer path>/<name>`` for each
    ``add_summary`` of the model (see ``praxis_lite.base_layer.summary_scalars``).
    """
    model = task.model
    optimizer = task.learner.optimizer
    tx = optimizer.make()
    loss_name = task.learner.loss_name

    def loss_fn(params, batch, key):
        out, mutables = model.apply(
            {"params": params},
            batch,
            train=True,
            rngs={"dropout": key},
            mutable=[SUMMARIES, AUX_LOSS],
        )
        summaries, aux_loss = summaries_and_aux_losses(mutables)
        return out[loss_name] + aux_loss, (out, aux_loss, summary_scalars(summaries))

    def train_step(state: TrainState, batch: NestedMap, key: jax.Array):
        step_key = jax.random.fold_in(key, state.step)
        grads, (out, aux_loss, summaries) = jax.grad(loss_fn, has_aux=True)(
            state.params, batch, step_key
        )
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(out[loss_name]) & jnp.isfinite(grad_norm)
        only_if_finite = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        params = jax.tree_util.tree_map(only_if_finite, params, state.params)
        opt_state = jax.tree_util.tree_map(only_if_finite, opt_state, state.opt_state)
        nonfinite_steps = state.nonfinite_steps + (~finite).astype(jnp.int32)
        first_bad = jnp.where(
            (state.first_nonfinite_step < 0) & ~finite, state.step, state.first_nonfinite_step
        )
        metrics = {
            "loss": out[loss_name],
            "accuracy": out.get("accuracy", jnp.zeros(())),
            "log_pplx": out.get("log_pplx", jnp.zeros(())),
            "num_tokens": out.get("num_tokens", jnp.zeros(())),
            "aux_loss": aux_loss,
            "grad_norm": grad_norm,
            "nonfinite_steps": nonfinite_steps,
            "learning_rate": optimizer.learning_rate_at(state.step),
            **{f"summaries/{name}": value for name, value in summaries.items()},
        }
        new_state = TrainState(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            nonfinite_steps=nonfinite_steps,
            first_nonfinite_step=first_bad,
        )
        return new_state, metrics

    return train_step


def make_eval_step(
    task: SingleTask, per_example: bool = False
) -> Callable[[Any, NestedMap], Metrics]:
    """``eval_step(params, batch) -> sums``: weighted sums to average over batches.

    Returns ``loss_sum``, ``correct_sum`` (accuracy x weight), ``weight_sum``; with
    ``per_example``, also ``example_score [B]`` (summed target log-likelihood),
    ``example_weight [B]`` (summed label weights; 0 for padded examples) and the
    batch's ``labels [B, T]``, for SeqIO score metrics.
    """
    model = task.model
    loss_name = task.learner.loss_name

    def eval_step(params: Any, batch: NestedMap) -> Metrics:
        out = model.apply({"params": params}, batch, train=False)
        weight = out.get("num_tokens", jnp.ones(()))
        sums = {
            "loss_sum": out[loss_name] * weight,
            "correct_sum": out.get("accuracy", jnp.zeros(())) * weight,
            "weight_sum": weight,
        }
        if per_example:
            token_weights = batch["weights"].astype(jnp.float32)
            sums["example_score"] = -jnp.sum(out.per_token_xent * token_weights, axis=-1)
            sums["example_weight"] = jnp.sum(token_weights, axis=-1)
            sums["labels"] = batch["labels"]
        return sums

    return eval_step
