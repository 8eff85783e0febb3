"""Compile-only dry run: lower and compile an experiment's train step on abstract arrays.

Nothing is allocated: parameters, optimizer state and the batch are
ShapeDtypeStructs with their shardings, so any size compiles on a CPU host with
enough fake devices. Reports what a pod booking needs to know.
"""

from __future__ import annotations

from typing import Any

import jax

from paxlite import flops, partitioning, train_setup
from paxlite.job import Job


def compile_train_step(job: Job) -> dict[str, Any]:
    """Lowers and compiles the train step; returns the figures of the compiled program.

    Returns:
      num_params, per-device bytes of params / optimizer state, XLA's temp bytes
      per device, XLA's FLOPs per step (XLA counts a scanned layer once, see
      ``flops_note``), the model's FLOPs per step by definition, compile seconds,
      the mesh.
    """
    with job.scope():
        run = train_setup.init_or_restore(job, train_setup.StateSource.ABSTRACT)
        compiled, seconds = train_setup.compile_train_step(job, run)
    memory = compiled.memory_analysis()
    counted = job.task.model.train_flops(run.sample)  # The model's own count, by definition.
    global_batch = int(jax.tree_util.tree_leaves(run.sample)[0].shape[0])
    params, opt_state = run.state.params, run.state.opt_state
    return {
        "mesh": dict(job.mesh.shape),
        "num_devices": job.mesh.size,
        "num_params": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
        "params_bytes_per_device": partitioning.per_device_bytes(params),
        "opt_state_bytes_per_device": partitioning.per_device_bytes(opt_state),
        "temp_bytes_per_device": int(getattr(memory, "temp_size_in_bytes", 0) or 0),
        "xla_flops_per_step": flops.xla_flops(compiled, job.mesh.size),
        "flops_note": "XLA's count; a scanned (repeated) stack's body is counted once.",
        "model_flops_per_step": counted.per_step(global_batch) if counted else {},
        "global_batch": global_batch,
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
                or "not counted (the model has no train_flops)"
            )
            + " (paxlite/flops.py)",
            f"  compile time:           {figures['compile_seconds']:.1f} s",
        ]
    )
