"""Compile-only dry run: lower and compile an experiment's train step on abstract arrays.

Nothing is allocated: parameters, optimizer state and the batch are
ShapeDtypeStructs with their shardings. The mesh is built from fake CPU devices, or
(``--compile_topology``) from a TPU slice's devices, which the TPU compiler compiles for on
any host: then the memory figures are the TPU's, per chip, against its HBM. The process
always sees as many (CPU) devices as the mesh has, so batch sizes follow the target mesh.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
from etils import epath

from paxlite.experiments.base_experiment import BaseExperiment
from paxlite.perf import flops, phases
from paxlite.runtime import partitioning, tpu_topology
from paxlite.runtime.job import Job, build_job
from paxlite.runtime.mesh import ALL_REMAINING, mesh_size
from paxlite.runtime.tpu_topology import TpuTarget
from paxlite.train import train_setup, trainable

#: ``--compile_topology`` value that means the experiment's own TPU_TARGET.
EXPERIMENT_TARGET = "target"
GIB = 2**30


def compile_target(
    experiment: type[BaseExperiment], topology: str | None, num_slices: int | None
) -> TpuTarget | None:
    """The TPU slice(s) ``--compile_topology`` names (None: fake CPU devices), from the
    experiment's class (its knobs), before JAX has devices.

    ``num_slices`` defaults to the experiment's slices (the product of DCN_MESH_SHAPE).

    Raises:
      tpu_topology.TopologyError: an unknown name, or a mesh of another size.
    """
    if not topology:
        return None
    dcn = experiment.DCN_MESH_SHAPE
    slices = num_slices if num_slices is not None else math.prod(dcn or (1,))
    name = experiment_target_name(experiment) if topology == EXPERIMENT_TARGET else topology
    target = tpu_topology.parse(name, slices)
    devices = mesh_size(experiment.ICI_MESH_SHAPE, dcn, num_devices=target.num_devices)
    mesh_text = f"ICI_MESH_SHAPE {tuple(experiment.ICI_MESH_SHAPE)}" + (
        f" x DCN_MESH_SHAPE {tuple(dcn)}" if dcn else ""
    )
    tpu_topology.check_mesh(target, devices, mesh_text)
    return target


def experiment_target_name(experiment: type[BaseExperiment]) -> str:
    """The experiment's TPU_TARGET, or TPU v4 with one chip per mesh device of a slice
    (a v4-8 for a mesh that takes all devices, like Pax's data-parallel runs)."""
    if experiment.TPU_TARGET:
        return experiment.TPU_TARGET
    if ALL_REMAINING in tuple(experiment.ICI_MESH_SHAPE):
        return "v4-8"
    return tpu_topology.default_target_name(math.prod(experiment.ICI_MESH_SHAPE))


def devices_needed(experiment: type[BaseExperiment], target: TpuTarget | None) -> int:
    """How many devices this process must see: the target's, or the mesh's own
    (a -1 entry compiles for one device per other entry)."""
    if target is not None:
        return target.num_devices
    return mesh_size(experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE, num_devices=1)


def run(
    experiment: BaseExperiment,
    task_cfg: Any,
    dataset_cfgs: list[Any],
    name: str,
    target: TpuTarget | None,
) -> str:
    """Compiles the experiment's train step (for ``target``, if given); returns the report.

    Call it once, in a fresh process: for a TPU target it turns JAX's persistent
    compilation cache off, which cannot read compile-only executables back.
    """
    if target is not None:
        jax.config.update("jax_enable_compilation_cache", False)
    job = build_compile_job(experiment, task_cfg, dataset_cfgs, target)
    return format_report(name, compile_train_step(job, target))


def build_compile_job(
    experiment: BaseExperiment, task_cfg: Any, dataset_cfgs: list[Any], target: TpuTarget | None
) -> Job:
    """The job on the target's devices (or this process's), with stand-in inputs."""
    devices = target.devices() if target is not None else None
    inputs = experiment.stand_in_datasets(dataset_cfgs)
    return build_job(experiment, task_cfg, inputs, epath.Path("/nonexistent"), devices=devices)


def compile_train_step(job: Job, target: TpuTarget | None = None) -> dict[str, Any]:
    """Lowers and compiles the train step; returns the figures of the compiled program.

    Returns:
      num_params, trained_params (those not frozen); per-device bytes of params /
      optimizer state; the compiled program's per-device memory (``memory_analysis``:
      arguments, outputs, aliased, temp, code, and ``program_bytes_per_device``, their
      total with aliased buffers counted once); XLA's FLOPs per step (XLA counts a
      scanned layer once, see ``flops_note``); the model's FLOPs per step by definition
      and what they counted (``model_description``); compile seconds; the mesh. With a
      ``target`` also ``target``, ``hbm_bytes_per_chip``, ``hbm_assigned_bytes_per_chip``
      (what the TPU compiler's buffer assignment places in a chip's HBM: the figure it
      checks, below
      ``memory_analysis``'s estimate), and ``hbm_needed_bytes`` when the compiler refused
      the program for lack of HBM (then no program figures).
    """
    figures: dict[str, Any] = {
        "mesh": dict(job.mesh.shape),
        "num_devices": job.mesh.size,
        "attention_impl": job.attention_impl.value,
    }
    if target is not None:
        figures["target"] = target.describe()
        figures["hbm_bytes_per_chip"] = tpu_topology.hbm_bytes_per_chip(target)
    with job.scope():
        with phases.phase("Abstract train state (shapes and shardings, no arrays)"):
            run_state = train_setup.init_or_restore(job, train_setup.StateSource.ABSTRACT)
        params, opt_state = run_state.state.params, run_state.state.opt_state
        global_batch = int(jax.tree_util.tree_leaves(run_state.sample)[0].shape[0])
        figures.update(
            num_params=int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
            trained_params=_trained_params(job, params),
            params_bytes_per_device=partitioning.per_device_bytes(params),
            opt_state_bytes_per_device=partitioning.per_device_bytes(opt_state),
            global_batch=global_batch,
        )
        try:
            compiled, seconds, assigned = _compile(job, run_state, target)
        except jax.errors.JaxRuntimeError as e:
            shortfall = tpu_topology.hbm_shortfall(e) if target is not None else None
            if shortfall is None:
                raise
            figures["hbm_needed_bytes"], figures["hbm_bytes_per_chip"] = shortfall
            return figures
    figures.update(program_memory(compiled))
    if assigned is not None:
        figures["hbm_assigned_bytes_per_chip"] = assigned
    counted = job.task.model.train_flops(run_state.sample)  # The model's own count.
    figures.update(
        xla_flops_per_step=flops.xla_flops(compiled, job.mesh.size),
        flops_note="XLA's count; a scanned (repeated) stack's body is counted once.",
        model_flops_per_step=counted.per_step(global_batch) if counted else {},
        model_description=counted.description if counted else None,
        compile_seconds=seconds,
    )
    return figures


def _compile(
    job: Job, run_state: train_setup.RunState, target: TpuTarget | None
) -> tuple[Any, float, int | None]:
    """``(compiled step, seconds, HBM bytes per chip the TPU compiler assigned)``; the last
    is None on fake CPU devices."""
    if target is None:
        with phases.phase(f"Compiling the train step for {job.mesh.size} fake CPU devices"):
            return (*train_setup.compile_train_step(job, run_state), None)
    start = time.perf_counter()
    with phases.phase("Lowering the train step"):
        lowered = train_setup.lower_train_step(job, run_state)
    with phases.phase(f"Compiling for {target.describe()} (XLA's TPU compiler; memory analysis)"):
        compiled, assigned = tpu_topology.compile_with_hbm_report(lowered)
    return compiled, time.perf_counter() - start, assigned


def program_memory(compiled: Any) -> dict[str, int]:
    """Per-device bytes of the compiled program (``memory_analysis``), and their total:
    arguments + outputs - aliased (donated buffers reused as outputs) + temp + code."""
    memory = compiled.memory_analysis()
    fields = ("argument", "output", "alias", "temp", "generated_code")
    sizes = {f: int(getattr(memory, f"{f}_size_in_bytes", 0) or 0) for f in fields}
    total = sizes["argument"] + sizes["output"] - sizes["alias"]
    total += sizes["temp"] + sizes["generated_code"]
    return {
        **{f"{f}_bytes_per_device": size for f, size in sizes.items()},
        "program_bytes_per_device": total,
    }


def _assigned_row(figures: dict[str, Any]) -> list[str]:
    """The HBM the TPU compiler assigned per chip, when it said (TPU targets)."""
    if "hbm_assigned_bytes_per_chip" not in figures:
        return []
    return [
        _row(
            "HBM assigned per chip",
            f"{_gib(figures['hbm_assigned_bytes_per_chip'])} (the TPU compiler's buffer "
            "assignment: what it checks against the chip's HBM)",
        )
    ]


def fit_line(figures: dict[str, Any]) -> str | None:
    """``fits: X of Y GiB`` or ``does not fit by Z GiB`` (per chip), for a TPU target."""
    capacity = figures.get("hbm_bytes_per_chip")
    if capacity is None:
        return None
    needed = figures.get("hbm_needed_bytes") or figures.get("hbm_assigned_bytes_per_chip")
    needed = needed or figures.get("program_bytes_per_device")
    if needed <= capacity:
        return f"fits: {needed / GIB:.2f} of {capacity / GIB:.2f} GiB"
    return (
        f"does not fit by {(needed - capacity) / GIB:.2f} GiB "
        f"(needs {needed / GIB:.2f} of {capacity / GIB:.2f} GiB per chip)"
    )


def format_report(name: str, figures: dict[str, Any]) -> str:
    """The compile report: sizes per device (per chip on a TPU target), FLOPs, fit."""
    per = "chip" if "target" in figures else "device"
    where = figures.get("target", f"{figures['num_devices']} fake CPU devices")
    lines = [
        f"Compiled {name} for {where}, mesh {figures['mesh']}",
        _row("attention", figures.get("attention_impl", "einsum")),
        _row("parameters", f"{figures['num_params']:,}"),
        _row("global batch", figures["global_batch"]),
        *_trained_row(figures),
        _row(f"params per {per}", _gib(figures["params_bytes_per_device"])),
        _row(f"optimizer per {per}", _gib(figures["opt_state_bytes_per_device"])),
    ]
    if "program_bytes_per_device" in figures:
        lines += [
            _row(f"XLA temp per {per}", _gib(figures["temp_bytes_per_device"])),
            _row(
                f"program per {per}",
                f"{_gib(figures['program_bytes_per_device'])} (arguments + outputs - aliased "
                "+ temp + code, from XLA's memory_analysis: an estimate)",
            ),
            *_assigned_row(figures),
            _row(
                "XLA FLOPs per step",
                f"{figures['xla_flops_per_step']:.4g} ({figures['flops_note']})",
            ),
            _row("model FLOPs per step", f"{_model_flops(figures)} (praxis_lite/flops.py)"),
            *_described_row(figures),
            _row("compile time", f"{figures['compile_seconds']:.1f} s"),
        ]
    else:
        lines.append("  the TPU compiler refused the program: it needs more HBM than a chip has")
    verdict = fit_line(figures)
    return "\n".join(lines + ([verdict] if verdict else []))


def _row(label: str, value: Any) -> str:
    return f"  {label + ':':<24}{value}"


def _model_flops(figures: dict[str, Any]) -> str:
    counted = figures.get("model_flops_per_step", {})
    return ", ".join(f"{k} {v:.4g}" for k, v in counted.items()) or (
        "not counted (the model has no train_flops)"
    )


def _described_row(figures: dict[str, Any]) -> list[str]:
    """What the model FLOPs counted (its shape; a mixture of experts' active weights)."""
    described = figures.get("model_description")
    return [_row("counted model", described)] if described else []


def _trained_params(job: Job, params: Any) -> int:
    """How many of ``params`` the learner trains (the others are frozen)."""
    trained, _ = trainable.split(params, trainable.trainable_keys(params, job.task.learner))
    return int(sum(x.size for x in jax.tree_util.tree_leaves(trained)))


def _trained_row(figures: dict[str, Any]) -> list[str]:
    """The trained parameters' row, when some are frozen (no optimizer state for those)."""
    trained, total = figures["trained_params"], figures["num_params"]
    if trained == total:
        return []
    return [
        _row("trained parameters", f"{trained:,} ({100 * trained / total:.2f}%; the rest frozen)")
    ]


def _gib(size: int) -> str:
    return f"{size / GIB:.3f} GiB"
