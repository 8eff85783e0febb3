"""Layerwise-shardable pipeline parallelism (GPipe and circular), as ordinary SPMD code.

The ``L`` layers of a stack are split over ``S`` stages; the stage dimension of
the weights carries the logical axis 'stages', which the experiment maps to a
'stage' mesh axis. The batch is cut into ``M`` microbatches. Every iteration,
each stage runs its layers on the microbatch it holds (one ``jax.vmap`` over the
stage dimension, so each device computes only its own stage), then the
per-stage activations shift one stage along (``jnp.roll`` on the stage-sharded
dimension: a collective-permute between neighbouring devices). The whole loop
is one ``lax.scan`` inside the one jitted train step, so it composes with data,
FSDP and tensor sharding on the other mesh axes and with the remat policy of
the stage body.

GPipe (``circular_repeat=1``), S=3 stages, M=4 microbatches; ``i`` = microbatch
``i`` in the stage at that iteration, ``.`` = bubble (idle)::

    iteration  0  1  2  3  4  5
    stage 0    0  1  2  3  .  .
    stage 1    .  0  1  2  3  .
    stage 2    .  .  0  1  2  3     -> outputs of microbatch i at iteration i + S - 1

``M + S - 1`` iterations for ``M`` iterations of work: the bubble fraction is
``(S - 1) / (M + S - 1)``.

Circular (interleaved, ``circular_repeat=R``): each device holds ``R`` virtual
stages of ``L / (S R)`` layers; virtual stage ``v = r S + s`` lives on device
``s``. A microbatch that leaves the last device goes back to device 0 for its
next round (``i'`` = microbatch ``i`` in round 1), S=2, M=2, R=2::

    iteration  0   1   2   3   4
    device 0   0   1   0'  1'  .
    device 1   .   0   1   0'  1'

``R M + S - 1`` iterations, each ``1/R`` of a GPipe stage: the bubble fraction
shrinks to ``(S - 1) / (R M + S - 1)``. Needs ``M >= S`` (a microbatch is
back at device 0 before it is due there again).

Weights are stored as the plain scanned stack stores them
(``params['repeat']['block'][...]`` with ``L`` stacked layers, in layer order),
initialized to exactly the weights of
:class:`~praxis_lite.layers.repeats.StackedTransformerRepeated` at the same
place in the model; only the leading axis is named 'stages' (``[L, ...]``) or,
circular, reshaped to ``[R, L / R, ...]`` with 'stages' on the second axis, so
every device stores the layers it runs.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from praxis_lite import config as config_lib
from praxis_lite.base_layer import AUX_LOSS, PARAMS, SUMMARIES, BaseLayer
from praxis_lite.config import LayerTpl, template_field
from praxis_lite.flops import StackLayout
from praxis_lite.layers.repeats import StackedTransformerRepeated, _ScanBody
from praxis_lite.py_utils import from_microbatches, to_microbatches
from praxis_lite.sharding import ACTIVATION_EMBED, BATCH, LENGTH, STAGES

_REPEAT_WEIGHTS = "pipeline_repeat_weights"


class PipelineShapeError(ValueError):
    """The batch, the layers or the schedule do not fit the pipeline's settings."""


class LayerwiseShardablePipelined(BaseLayer):
    """A stack of ``L = S x R x stage layers`` blocks run as a pipeline; ``[B, T, D] -> [B, T, D]``.

    Drop-in for a stack in ``TransformerLm.stacked_transformer_tpl``: same call
    arguments, same result as the plain stack with the same weights. Summaries and
    aux losses that the blocks record (when the caller makes those collections
    mutable) come out as the plain stack records them, averaged over microbatches.

    Attributes:
      num_stages: ``S``, the pipeline stages (the 'stages' logical axis; one
        per device along the mesh axis it maps to).
      stage_tpl: one virtual stage: a ``StackedTransformerRepeated`` config
        whose ``num_layers`` is ``L / (S R)`` and whose remat policy applies
        inside each stage.
      num_microbatches: ``M``; the batch ``B`` must divide by it. Give this or
        ``microbatch_size``; with neither, ``M = S``.
      microbatch_size: ``B / M``, examples per microbatch (instead of ``M``).
      stream_io: split the buffer of microbatches (inputs in, outputs out) over
        the stage devices instead of holding all of it on each (Pax's
        ``stream_io``): its memory per device falls by ``S``; needs ``M % S == 0``.
      circular_repeat: ``R``, virtual stages per device (1 = GPipe).
    """

    num_stages: int
    stage_tpl: LayerTpl = template_field(StackedTransformerRepeated)
    num_microbatches: int | None = None
    microbatch_size: int | None = None
    stream_io: bool = False
    circular_repeat: int = 1

    def _stage_config(self) -> Any:
        stage = self.stage_tpl.value
        if getattr(stage, "__fn_or_cls__", None) is not StackedTransformerRepeated:
            raise PipelineShapeError(
                f"{type(self).__name__}.stage_tpl must be a StackedTransformerRepeated config "
                f"(one virtual stage of scanned layers), got {stage!r}."
            )
        return stage

    @property
    def num_layers(self) -> int:
        """``L``: all layers of the pipeline."""
        return self.num_stages * self.circular_repeat * self._stage_config().num_layers

    def layout(self) -> StackLayout:
        """All ``L`` blocks, run inside the pipeline's loop."""
        block = self._stage_config().block_tpl
        return StackLayout(self.num_layers, getattr(block, "value", block), pipelined=True)

    def microbatches(self, batch_size: int) -> int:
        """``M`` for a batch of ``batch_size``; raises if the batch does not split."""
        if self.num_microbatches is not None and self.microbatch_size is not None:
            raise PipelineShapeError(
                f"{type(self).__name__}: set num_microbatches or microbatch_size, not both."
            )
        if self.microbatch_size is not None:
            if batch_size % self.microbatch_size:
                raise PipelineShapeError(
                    f"batch {batch_size} does not split into microbatches of "
                    f"{self.microbatch_size}; make the batch a multiple of the microbatch size."
                )
            count = batch_size // self.microbatch_size
        else:
            count = self.num_microbatches or self.num_stages
            if batch_size % count:
                raise PipelineShapeError(
                    f"batch {batch_size} does not split into {count} microbatches; make the "
                    "batch a multiple of the number of microbatches."
                )
        if self.circular_repeat > 1 and count < self.num_stages:
            raise PipelineShapeError(
                f"a circular pipeline needs at least as many microbatches as stages, got "
                f"{count} microbatches for {self.num_stages} stages."
            )
        if self.stream_io and count % self.num_stages:
            raise PipelineShapeError(
                f"stream_io splits the {count} microbatches over the {self.num_stages} "
                "stages; make the number of microbatches a multiple of the stages."
            )
        return count

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        *,
        paddings: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """``x [B, T, D]``; ``paddings``/``segment_ids``/``positions`` ``[B, T]`` or None."""
        x = self.to_fprop(x)
        side = (paddings, segment_ids, positions)
        if self.is_initializing():
            context = dict(zip(("paddings", "segment_ids", "positions"), side, strict=True))
            return self._flat_stack(train)(x, context)[0]
        num_micro = self.microbatches(x.shape[0])
        stored = self.variables[PARAMS]["repeat"]["block"]
        stored = jax.tree_util.tree_map(
            lambda v: v.unbox(apply_constraint=False) if isinstance(v, nn.Partitioned) else v,
            stored,
            is_leaf=lambda v: isinstance(v, nn.Partitioned),
        )
        dropout_key = self.make_rng("dropout") if train and self.has_rng("dropout") else None
        collect = tuple(c for c in (SUMMARIES, AUX_LOSS) if self.is_mutable_collection(c))
        y, recorded = self._pipeline(stored, x, side, num_micro, train, dropout_key, collect)
        for collection, tree in recorded.items():
            for name, value in tree.items():
                self.put_variable(collection, name, value)
        return y

    # --- weights ------------------------------------------------------------
    def _flat_stack(self, train: bool) -> Any:
        """The plain scanned stack of all L layers (named like StackedTransformerRepeated's).

        Called at init only: the same scope path and RNG splits as the plain stack,
        so the weights are the same numbers; circular, they are reshaped to
        ``[R, L / R, ...]`` on the way out.
        """
        scanned = nn.scan(
            _ScanBody,
            variable_axes={PARAMS: 0, SUMMARIES: 0, AUX_LOSS: 0},
            split_rngs={PARAMS: True, "dropout": True},
            in_axes=(nn.broadcast,),
            length=self.num_layers,
            metadata_params={nn.PARTITION_NAME: STAGES},
        )
        if self.circular_repeat > 1:
            repeats = self.circular_repeat
            scanned = nn.map_variables(
                scanned,
                PARAMS,
                trans_in_fn=lambda v: _map_leaves(v, _from_circular),
                trans_out_fn=lambda v: _map_leaves(v, lambda a, n: _to_circular(a, n, repeats)),
                init=True,
                mutable=True,
            )
        return scanned(block_tpl=self._stage_config().block_tpl, train=train, name="repeat")

    def _stage_weights(self, stored: Any) -> Any:
        """Stored weights -> ``[S, R, L / (S R), ...]`` (device s: virtual stages r S + s)."""
        s, r = self.num_stages, self.circular_repeat

        def split(a: jax.Array) -> jax.Array:
            lead = 1 if r == 1 else 2  # [L, ...] or [R, L / R, ...]
            per_stage = a.reshape((r, s, -1) + a.shape[lead:])
            return jnp.swapaxes(per_stage, 0, 1)

        return jax.tree_util.tree_map(split, stored)

    # --- the schedule -----------------------------------------------------
    def _stages(self, train: bool, collect: tuple[str, ...]) -> Any:
        """``stages(weights, repeat, h, pad, seg, pos, keys)``: every device's stage at once.

        Vmapped over the 'stages' axis (``[S, ...]`` inputs, one virtual stage per
        device); returns ``(out [S, mb, T, D], recorded collections)``.
        """
        r = self.circular_repeat
        stage_body = config_lib.instantiate(self._stage_config(), parent=None)
        stage_axis = _mesh_axis_of(STAGES)

        def run_stage(w, repeat, h, pad, seg, pos, key):
            """One device's virtual stage ``repeat`` on one microbatch ``h [mb, T, D]``."""
            if r > 1:
                w = jax.tree_util.tree_map(lambda a: checkpoint_name(a[repeat], _REPEAT_WEIGHTS), w)
            else:
                w = jax.tree_util.tree_map(lambda a: a[0], w)
            rngs = {"dropout": key} if key is not None else {}
            out = stage_body.apply(
                {PARAMS: {"repeat": {"block": w}}},
                h,
                paddings=pad,
                segment_ids=seg,
                positions=pos,
                train=train,
                rngs=rngs,
                mutable=list(collect) or False,
            )
            return out if collect else (out, {})

        if r > 1:  # The selected weights depend on the iteration: recompute, never save them.
            run_stage = jax.checkpoint(
                run_stage,
                policy=jax.checkpoint_policies.save_anything_except_these_names(_REPEAT_WEIGHTS),
                prevent_cse=False,
            )
        return jax.vmap(run_stage, spmd_axis_name=stage_axis)

    def _pipeline(
        self,
        stored: Any,
        x: jax.Array,
        side: tuple[jax.Array | None, ...],
        num_micro: int,
        train: bool,
        dropout_key: jax.Array | None,
        collect: tuple[str, ...],
    ) -> tuple[jax.Array, dict[str, Any]]:
        """Runs the schedule: ``x [B, T, D]`` -> (``[B, T, D]``, recorded ``collect`` collections).

        What the stages record (``add_summary`` / ``add_aux_loss``) is averaged over the
        microbatches, per layer: ``[L, ...]`` in layer order, as the plain scanned stack
        records it (the same numbers for batch means and for terms that do not depend
        on the data).
        """
        s, r, m = self.num_stages, self.circular_repeat, num_micro
        weights = self._stage_weights(stored)
        # As praxis's SAVE_ITERATION_INPUT: an iteration keeps only the stages' inputs for the
        # backward pass and recomputes the stages from them (each layer inside remats as the
        # stack's policy says). Without it every layer's residuals of every iteration stay
        # alive: all layers x the whole batch per device, as if there were no pipeline.
        stages = jax.checkpoint(self._stages(train, collect), prevent_cse=False)

        micro_x = self._constrain_micro(to_microbatches(x, m))
        micro_side = tuple(None if a is None else to_microbatches(a, m) for a in side)
        state = self._constrain_state(jnp.zeros((s,) + micro_x.shape[1:], x.dtype))
        side_state = tuple(
            None if a is None else jnp.zeros((s,) + a.shape[1:], a.dtype) for a in micro_side
        )
        stage_ids = jnp.arange(s)
        is_first = lambda a: (stage_ids == 0).reshape((s,) + (1,) * (a.ndim - 1))  # noqa: E731

        def iteration(carry, t):
            buffer, state, side_state = carry
            # Constrained on the way in too: the transpose then keeps the backward loop's
            # cotangent carries split like the forward ones (else XLA may replicate them).
            buffer = self._constrain_micro(buffer)
            state = self._constrain_state(state)
            j_in = t % m  # Stage 0 takes microbatch t mod M (a new one, or one from round t // M).
            # The microbatches read from the buffer keep its split: unconstrained, XLA
            # gathered the whole buffer over 'data' to slice one (GPT-3 pipelines: 192 GiB).
            incoming = self.constrain(buffer[j_in], (BATCH, LENGTH, ACTIVATION_EMBED))
            state = jnp.where(is_first(state), incoming[None], state)
            side_state = tuple(
                None if a is None else jnp.where(is_first(a), b[j_in][None], a)
                for a, b in zip(side_state, micro_side, strict=True)
            )
            repeat = jnp.clip((t - stage_ids) // m, 0, r - 1)
            keys = (
                None
                if dropout_key is None
                else jax.random.split(jax.random.fold_in(dropout_key, t), s)
            )
            out, recorded = stages(weights, repeat, state, *side_state, keys)
            out = self._constrain_state(out)
            # The last stage finishes microbatch (t - S + 1) mod M; its slot in the buffer
            # is where that microbatch starts its next round (or where the output ends).
            j_out = (t - (s - 1)) % m
            previous = self.constrain(buffer[j_out], (BATCH, LENGTH, ACTIVATION_EMBED))
            done = jnp.where(t >= s - 1, out[s - 1], previous)
            buffer = self._constrain_micro(buffer.at[j_out].set(done))
            state = self._constrain_state(jnp.roll(out, 1, axis=0))
            side_state = tuple(None if a is None else jnp.roll(a, 1, axis=0) for a in side_state)
            return (buffer, state, side_state), recorded

        num_iterations = r * m + s - 1
        (buffer, _, _), recorded = jax.lax.scan(
            iteration, (micro_x, state, side_state), jnp.arange(num_iterations)
        )
        per_item = _microbatch_mean_weights(num_iterations, s, r, m)
        recorded = jax.tree_util.tree_map(lambda v: _per_layer_mean(v, per_item), recorded)
        return from_microbatches(buffer), recorded

    def _constrain_state(self, a: jax.Array) -> jax.Array:
        """Per-stage activations ``[S, mb, T, D]``: one stage per device along 'stages'."""
        return self.constrain(a, (STAGES, BATCH, LENGTH, ACTIVATION_EMBED))

    def _constrain_micro(self, a: jax.Array) -> jax.Array:
        """Microbatched ``[M, mb, T, D]``: every microbatch split over the batch axes and
        its model dim as the layers' activations (and, with ``stream_io``, the
        microbatches over the stages)."""
        stages = STAGES if self.stream_io else None
        return self.constrain(a, (stages, BATCH, LENGTH, ACTIVATION_EMBED))


def _microbatch_mean_weights(num_iterations: int, s: int, r: int, m: int) -> jax.Array:
    """``[iterations, S, R]``: 1/M where device s runs virtual stage ``r S + s`` on a microbatch.

    At iteration ``t`` device ``s`` holds item ``k = t - s`` of its stream (round
    ``k // M``, microbatch ``k mod M``); ``k < 0`` and ``k >= R M`` are bubbles.
    """
    k = jnp.arange(num_iterations)[:, None] - jnp.arange(s)[None, :]
    busy = (k >= 0) & (k < r * m)
    rounds = jnp.clip(k // m, 0, r - 1)
    one_hot = rounds[..., None] == jnp.arange(r)
    return (busy[..., None] & one_hot).astype(jnp.float32) / m


def _per_layer_mean(value: jax.Array, weights: jax.Array) -> jax.Array:
    """Recorded ``[iterations, S, L / (S R), ...]`` -> mean over microbatches ``[L, ...]``.

    Layer order: virtual stage ``v = r S + s`` holds layers ``v L / (S R) ...``.
    """
    mean = jnp.einsum("tsr,ts...->rs...", weights, value.astype(jnp.float32))
    return mean.reshape((-1,) + mean.shape[3:]).astype(value.dtype)


def _mesh_axis_of(logical: str) -> str | tuple[str, ...] | None:
    """The mesh axis the current rules map ``logical`` onto, if the current mesh has it."""
    (axes,) = nn.logical_to_mesh_axes((logical,))
    if axes is None:
        return None
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    mesh_names = jax.sharding.get_abstract_mesh().axis_names
    names = tuple(n for n in names if n in mesh_names)
    if not names:
        return None
    return names[0] if len(names) == 1 else names


def _map_leaves(tree: Any, fn: Any) -> Any:
    """Applies ``fn(array, names) -> (array, names)`` to boxed and plain leaves."""

    def one(v):
        if isinstance(v, nn.Partitioned):
            value, names = fn(v.value, v.names)
            return v.replace(value=value, names=names)
        return fn(v, None)[0]

    return jax.tree_util.tree_map(one, tree, is_leaf=lambda v: isinstance(v, nn.Partitioned))


def _to_circular(a: jax.Array, names: Any, repeats: int) -> tuple[jax.Array, Any]:
    """``[L, ...]`` ('stages', ...) -> ``[R, L / R, ...]`` (None, 'stages', ...)."""
    out = a.reshape((repeats, a.shape[0] // repeats) + a.shape[1:])
    return out, None if names is None else (None,) + tuple(names)


def _from_circular(a: jax.Array, names: Any) -> tuple[jax.Array, Any]:
    """Inverse of :func:`_to_circular`."""
    out = a.reshape((math.prod(a.shape[:2]),) + a.shape[2:])
    return out, None if names is None else tuple(names[1:])


__all__ = ["LayerwiseShardablePipelined", "PipelineShapeError"]
