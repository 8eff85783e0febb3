"""Compile-only dry run: lower and compile an experiment's train step on abstract arrays.

Nothing is allocated: parameters, optimizer state and the batch are
ShapeDtypeStructs with their shardings, so any size compiles on a CPU host with
enough fake devices. Reports what a pod booking needs to know.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from paxlite import train, trainer_lib
from praxis_lite.py_utils import NestedMap


def stand_in_inputs(experiment: Any, dataset_cfgs: list[Any]) -> list[Any]:
    """The training input replaced by random tokens of the same batch and sequence length.

    A dry run must not need the data: for LM experiments (with MAX_SEQ_LEN and
    VOCAB_SIZE knobs) the train input becomes a ``SyntheticLmInput`` of the same
    per-host batch size. Other experiments keep their inputs.
    """
    from praxis_lite import config as config_lib
    from praxis_lite.synthetic_input import SyntheticLmInput

    if not (hasattr(experiment, "MAX_SEQ_LEN") and hasattr(experiment, "VOCAB_SIZE")):
        return dataset_cfgs
    train_cfgs = [c for c in dataset_cfgs if getattr(c, "is_training", True)]
    return [
        config_lib.Config(
            SyntheticLmInput,
            batch_size=cfg.batch_size,
            seq_len=experiment.MAX_SEQ_LEN,
            vocab_size=experiment.VOCAB_SIZE,
            random_tokens=True,
        )
        for cfg in train_cfgs
    ]


def _per_device_bytes(abstract_tree: Any) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(abstract_tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total


def abstract_global_batch(job: train.Job) -> NestedMap:
    """The global batch as sharded ShapeDtypeStructs (from one host-local batch's shapes)."""
    local = job.train_input.get_next()
    job.train_input.reset()
    sharding = train.batch_sharding_of(job)

    def spec(x: np.ndarray) -> jax.ShapeDtypeStruct:
        shape = (x.shape[0] * jax.process_count(), *x.shape[1:])
        pspec = PartitionSpec(sharding.spec[0], *([None] * (x.ndim - 1)))
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=NamedSharding(job.mesh, pspec))

    return jax.tree_util.tree_map(spec, local)


def compile_train_step(job: train.Job) -> dict[str, Any]:
    """Lowers and compiles the train step; returns the figures of the compiled program.

    Returns:
      num_params, per-device bytes of params / optimizer state, XLA's temp bytes
      per device, XLA's FLOPs per step (XLA counts a scanned layer once, see
      ``flops_note``), compile seconds, the mesh.
    """
    batch = abstract_global_batch(job)
    with jax.set_mesh(job.mesh):
        import flax.linen as nn

        with nn.logical_axis_rules(job.rules):
            init_fn = trainer_lib.make_init_fn(job.task)
            abstract_state, shardings = train.abstract_train_state(job, init_fn, batch)
            step = train.jit_train_step(job, shardings, train.batch_sharding_of(job))
            key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
            start = time.perf_counter()
            compiled = step.lower(abstract_state, batch, key).compile()
            seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    from paxlite import flops, mfu

    try:  # Model FLOPs (not XLA's) under each definition; see paxlite/flops.py.
        model_flops = flops.lm_shape(job.task.model).all_definitions(*mfu.batch_dims(batch))
    except flops.ModelShapeError:
        model_flops = {}
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {
        "mesh": dict(job.mesh.shape),
        "num_devices": job.mesh.size,
        "num_params": int(sum(x.size for x in jax.tree_util.tree_leaves(abstract_state.params))),
        "params_bytes_per_device": _per_device_bytes(abstract_state.params),
        "opt_state_bytes_per_device": _per_device_bytes(abstract_state.opt_state),
        "temp_bytes_per_device": int(getattr(memory, "temp_size_in_bytes", 0) or 0),
        "xla_flops_per_step": float((cost or {}).get("flops", 0.0)),
        "flops_note": "XLA's count; a scanned (repeated) stack's body is counted once.",
        "model_flops_per_step": model_flops,
        "global_batch": int(jax.tree_util.tree_leaves(batch)[0].shape[0]),
        "compile_seconds": seconds,
    }


def format_report(name: str, figures: dict[str, Any]) -> str:
    gib = 2**30
    return "\n".join(
        [
            f"Compiled {name} for mesh {figures['mesh']} ({figures['num_devices']} devices)",
            f"  parameters:             {figures['num_params']:,}",
            f"  global batch:           {figures['global_batch']}",
            f"  params per device:      {figures['params_bytes_per_device'] / gib:.3f} GiB",
            f"  optimizer per device:   {figures['opt_state_bytes_per_device'] / gib:.3f} GiB",
            f"  XLA temp per device:    {figures['temp_bytes_per_device'] / gib:.3f} GiB",
            f"  XLA FLOPs per step:     {figures['xla_flops_per_step']:.4g} "
            f"({figures['flops_note']})",
            "  model FLOPs per step:   "
            + (
                ", ".join(
                    f"{k} {v:.4g}" for k, v in figures.get("model_flops_per_step", {}).items()
                )
                or "not counted (not a Transformer LM)"
            )
            + " (paxlite/flops.py)",
            f"  compile time:           {figures['compile_seconds']:.1f} s",
        ]
    )
