"""The training loop: sharded init or restore, jitted steps, checkpoints, summaries, eval."""

from __future__ import annotations

import dataclasses
import enum
import math
import pathlib
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlite import checkpoints, decode_lib, eval_lib, mfu, prefetch, summaries, trainer_lib
from paxlite.base_experiment import BaseExperiment
from paxlite.mesh import batch_sharding, create_mesh, infeed_split
from paxlite.tasks_lib import SingleTask
from praxis_lite import config as config_lib
from praxis_lite.base_input import BaseInput
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import filter_rules_for_mesh, logical_shardings, strip_boxes


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"
    TRAIN_AND_EVAL = "train_and_eval"
    DECODE = "decode"


class BatchSizeError(ValueError):
    """The global batch does not split evenly over the data-parallel devices."""


class DivergenceError(RuntimeError):
    """The loss or gradient became non-finite and the task does not skip such updates."""


PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: "stopped by the scheduler, resumable".


class _PreemptionWatch:
    """Notices SIGTERM (and JAX's multi-host preemption sync point) during training."""

    def __init__(self) -> None:
        self.signalled = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self.signalled = True

    def should_stop(self, step: int) -> bool:
        """True at the step where every process should save and exit."""
        if jax.process_count() > 1:
            try:
                from jax.experimental import multihost_utils

                return multihost_utils.reached_preemption_sync_point(step)
            except Exception:  # No preemption service: fall back to this process's signal.
                pass
        return self.signalled

    def close(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


@dataclasses.dataclass
class Job:
    """Everything built from an experiment before the loop runs."""

    experiment: BaseExperiment
    task: SingleTask
    mesh: Mesh
    rules: Any
    train_input: BaseInput
    eval_inputs: list[BaseInput]
    job_log_dir: pathlib.Path
    decoder_inputs: list[BaseInput] = dataclasses.field(default_factory=list)


def build_job(
    experiment: BaseExperiment,
    task_cfg: Any,
    dataset_cfgs: list[Any],
    job_log_dir: pathlib.Path,
    devices: Sequence[jax.Device] | None = None,
    decoder_dataset_cfgs: Sequence[Any] = (),
) -> Job:
    """Builds the mesh, the task and the inputs (validating shapes before any compile).

    ``devices`` defaults to all devices of the job. ``decoder_dataset_cfgs`` (the
    experiment's ``decoder_datasets()``, overrides applied) become
    ``Job.decoder_inputs``; pass them for ``--mode=decode`` or a train_and_eval
    that decodes. They are checked here: each yields decode batches and the
    model can decode (``decode_lib.DecodeConfigError`` otherwise).
    """
    mesh = create_mesh(
        experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE, experiment.MESH_AXIS_NAMES, devices
    )
    task = config_lib.instantiate(task_cfg)
    if decoder_dataset_cfgs:  # Before any decoder input reads data.
        decode_lib.check_can_decode(task.model)
    rules = filter_rules_for_mesh(experiment.logical_axis_rules(), mesh)
    layout = batch_sharding(mesh, rules)
    inputs = [instantiate_input(cfg, layout) for cfg in dataset_cfgs]
    train_inputs = [i for i in inputs if i.is_training]
    if len(train_inputs) != 1:
        raise ValueError(
            "datasets() must return exactly one input with is_training=True, "
            f"got {len(train_inputs)}."
        )
    job = Job(
        experiment=experiment,
        task=task,
        mesh=mesh,
        rules=rules,
        train_input=train_inputs[0],
        eval_inputs=[i for i in inputs if not i.is_training],
        job_log_dir=job_log_dir,
        decoder_inputs=[instantiate_input(cfg, layout) for cfg in decoder_dataset_cfgs],
    )
    for inp in [job.train_input, *job.eval_inputs, *job.decoder_inputs]:
        _check_batch(job, layout, inp)
    for inp in job.decoder_inputs:
        decode_lib.check_decode_input(inp)
    return job


def instantiate_input(cfg: Any, layout: NamedSharding | None = None) -> BaseInput:
    """Builds an input for this process.

    Its host count/index come from the batch ``layout`` (:func:`mesh.infeed_split`:
    processes holding the same rows read the same data), or without one from JAX
    (one part per process).
    """
    if layout is None:
        hosts, index = jax.process_count(), jax.process_index()
    else:
        hosts, index = infeed_split(layout)
    return config_lib.instantiate(cfg, num_infeed_hosts=hosts, infeed_host_index=index)


def batch_sharding_of(job: Job) -> NamedSharding:
    return batch_sharding(job.mesh, job.rules)


def _check_batch(job: Job, sharding: NamedSharding, inp: BaseInput) -> None:
    axes = sharding.spec[0]
    axes = (axes,) if isinstance(axes, str) else (axes or ())
    ways = math.prod(job.mesh.shape[a] for a in axes)
    global_batch = inp.batch_size * infeed_split(sharding)[0]
    if global_batch % ways:
        raise BatchSizeError(
            f"Input '{inp.name}': global batch {global_batch} is not divisible by the "
            f"{ways} data-parallel shards of mesh axes {axes} ({dict(job.mesh.shape)}). "
            "Change PERCORE_BATCH_SIZE or the mesh shapes so the batch splits evenly."
        )


def _to_global(batch: NestedMap, sharding: NamedSharding) -> NestedMap:
    """Host-local numpy batch -> global jax.Arrays sharded over the batch axis.

    Each process passes its part of the input (see :func:`instantiate_input`).
    """
    hosts = infeed_split(sharding)[0]

    def put(x: np.ndarray) -> jax.Array:
        spec = PartitionSpec(sharding.spec[0], *([None] * (x.ndim - 1)))
        return jax.make_array_from_process_local_data(
            NamedSharding(sharding.mesh, spec), x, (x.shape[0] * hosts, *x.shape[1:])
        )

    return jax.tree_util.tree_map(put, batch)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree``'s arrays as global arrays held whole by every device of ``mesh``.

    Unlike ``jax.device_put``, this also works when ``mesh`` spans processes.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda x: x, in_shardings=replicated, out_shardings=replicated)(tree)


def _per_device_mib(tree: Any) -> float:
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shards = leaf.addressable_shards
        total += shards[0].data.nbytes if shards else 0
    return total / 2**20


def abstract_train_state(job: Job, init_fn: Any, sample_batch: Any) -> tuple[Any, Any]:
    """``(abstract TrainState with shardings, its NamedShardings)``, allocating nothing."""
    key = jax.random.key(0)
    abstract_boxed = jax.eval_shape(init_fn, key, sample_batch)
    shardings = strip_boxes(logical_shardings(abstract_boxed, job.mesh, job.rules))
    return checkpoints.abstract_like(strip_boxes(abstract_boxed), shardings), shardings


def jit_train_step(job: Job, state_shardings: Any, batch_sharding: NamedSharding):
    """The jitted train step: sharded in and out, the state's buffers donated."""
    replicated = NamedSharding(job.mesh, PartitionSpec())
    return jax.jit(
        trainer_lib.make_train_step(job.task),
        in_shardings=(state_shardings, batch_sharding, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )


def compile_train_step(
    train_step: Any, state: Any, batch: Any, key: jax.Array
) -> tuple[Any, float]:
    """``(compiled step, seconds)``: the jitted step compiled ahead of the loop.

    The loop calls the compiled executable, so it cannot silently recompile:
    arguments of another shape or sharding are an error.
    """
    start = time.perf_counter()
    compiled = train_step.lower(state, batch, key).compile()
    return compiled, time.perf_counter() - start


def run(
    job: Job,
    mode: Mode,
    stop_at_step: int | None = None,
    *,
    peak_tflops: float | None = None,
    flops_definition: Any = None,
) -> dict[str, Any]:
    """Trains and/or evaluates.

    Returns:
      ``train``: the last summary's scalars; ``history``: ``(step, scalars)`` of
      every summary; ``eval``: the last eval metrics by input name; ``state``:
      the final TrainState; ``preempted``: stopped by SIGTERM after saving.

    Raises:
      DivergenceError: a non-finite loss/gradient (unless the task skips them);
        the checkpoints written before it stay, nothing after it is saved.

    ``stop_at_step`` ends training early at that step (checkpointed), as if the
    job had been preempted there; running again resumes to ``num_train_steps``.
    ``peak_tflops`` (per device) overrides the peak MFU is measured against;
    ``flops_definition`` (a ``flops.FlopsDefinition``) picks the model-FLOPs count.
    """
    run_start = time.perf_counter()
    task, mesh = job.task, job.mesh
    peak = None
    if mode in (Mode.TRAIN, Mode.TRAIN_AND_EVAL):  # Before any mesh is set (see mfu.calibrate).
        peak = mfu.peak_for(mfu.model_dtype(task.model), override_tflops=peak_tflops)
    batch_sharding = batch_sharding_of(job)
    sample = job.train_input.get_next()
    job.train_input.reset()
    key = jax.random.key(job.experiment.SEED)
    init_key, train_key = jax.random.split(key)

    with jax.set_mesh(mesh), nn.logical_axis_rules(job.rules):
        global_sample = _to_global(sample, batch_sharding)
        init_fn = trainer_lib.make_init_fn(task)
        abstract_state, state_shardings = abstract_train_state(job, init_fn, global_sample)

        ckpt = checkpoints.Checkpointer(job.job_log_dir, max_to_keep=task.max_to_keep)
        latest = ckpt.latest_step()
        for skipped in ckpt.interrupted_steps:
            summaries.log(
                f"Skipped the checkpoint at step {skipped} in {ckpt.directory}: its save was "
                "interrupted before it completed; its partial files were removed."
            )
        if latest is not None:
            state, input_state = ckpt.restore(latest, abstract_state)
            job.train_input.set_state(input_state)
            summaries.log(f"Restored checkpoint at step {latest} from {ckpt.directory}")
        elif mode in (Mode.EVAL, Mode.DECODE):
            raise FileNotFoundError(
                f"--mode={mode.value} needs a checkpoint, but {ckpt.directory} has none; "
                "train first."
            )
        else:
            init = jax.jit(lambda k, b: nn.unbox(init_fn(k, b)), out_shardings=state_shardings)
            state = init(init_key, global_sample)

        num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
        summaries.log(
            f"Mesh {dict(mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
            f"devices ({jax.process_count()} processes); {num_params:,} parameters; per device: "
            f"params {_per_device_mib(state.params):.2f} MiB, optimizer state "
            f"{_per_device_mib(state.opt_state):.2f} MiB"
        )

        replicated = NamedSharding(mesh, PartitionSpec())
        train_step = jit_train_step(job, state_shardings, batch_sharding)
        eval_step = jax.jit(
            trainer_lib.make_eval_step(
                task, per_example=any(i.score_metric_fns for i in job.eval_inputs)
            ),
            in_shardings=(state_shardings.params, batch_sharding),
            out_shardings=replicated,
        )
        to_global = lambda b: _to_global(b, batch_sharding)  # noqa: E731
        train_writer = summaries.create_writer(job.job_log_dir, "train")
        eval_writers = {
            i.name: summaries.create_writer(job.job_log_dir, f"eval_{i.name}")
            for i in job.eval_inputs
        }

        def evaluate(step: int) -> dict[str, dict[str, float]]:
            results = {}
            for inp in job.eval_inputs:
                metrics = eval_lib.run_eval_pass(eval_step, state.params, inp, to_global)
                summaries.write_scalars(eval_writers[inp.name], step, f"eval_{inp.name}", metrics)
                summaries.log(
                    f"eval '{inp.name}' at step {step}: loss {metrics['loss']:.4f}, "
                    f"accuracy {metrics['accuracy']:.4f} over {int(metrics['num_batches'])} batches"
                )
                results[inp.name] = metrics
            return results

        step = int(state.step)
        result: dict[str, Any] = {"train": {}, "eval": {}, "history": []}
        if mode is Mode.EVAL:
            result["eval"] = evaluate(step)
            ckpt.close()
            return result
        decoder = None
        if mode is Mode.DECODE or (mode is Mode.TRAIN_AND_EVAL and task.decode_interval_steps):
            if not job.decoder_inputs:
                raise ValueError(
                    f"Mode {mode.value} decodes, but the job has no decoder inputs; pass "
                    "decoder_dataset_cfgs (the experiment's decoder_datasets()) to build_job."
                )
            decoder = decode_lib.DecodeProgram(
                task,
                job.decoder_inputs,
                job.job_log_dir,
                state_shardings.params,
                batch_sharding,
                to_global,
            )
        if mode is Mode.DECODE:
            result["decode"] = decoder.run(state.params, step)
            ckpt.close()
            return result

        preemption = _PreemptionWatch()
        result["preempted"] = False

        def check_finite(state: Any) -> None:
            if task.skip_nonfinite_updates or int(state.nonfinite_steps) == 0:
                return
            raise DivergenceError(
                f"Non-finite loss or gradient at step {int(state.first_nonfinite_step) + 1}; "
                f"training stopped. The last good checkpoint (step {ckpt.latest_step()}) is kept "
                f"in {ckpt.directory}. Lower the learning rate or raise clipping, or set "
                "task.skip_nonfinite_updates=True to skip such steps."
            )

        if step >= task.num_train_steps:
            summaries.log(f"Already at step {step} >= num_train_steps; nothing to train.")
        last_step = min(task.num_train_steps, stop_at_step or task.num_train_steps)
        train_key = replicate(train_key, mesh)
        if step < last_step:
            train_step, compile_s = compile_train_step(train_step, state, global_sample, train_key)
            cost = mfu.step_cost(
                task.model,
                global_sample,
                train_step,
                num_devices=mesh.size,
                definition=flops_definition,
                peak=peak,
            )
            summaries.log(f"Compiled the train step in {compile_s:.1f} s. {cost.describe()}")
            result["cost"] = cost
        progress = summaries.Progress(step, task.num_train_steps, result.get("cost"))
        batches = prefetch.Prefetcher(job.train_input, to_global)
        first_step = step
        while step < last_step:
            batch = batches.next()
            state, metrics = train_step(state, batch, train_key)
            step += 1
            if step == first_step + 1:  # Warm-up: excluded from the rates.
                jax.block_until_ready(state)
                progress.start_window(step)
                since_start = time.perf_counter() - run_start
                first = {"compile_time_s": compile_s, "time_to_first_step_s": since_start}
                summaries.write_scalars(train_writer, step, "train", first)
                summaries.log(
                    f"First step done {first['time_to_first_step_s']:.1f} s after start "
                    f"(compile {compile_s:.1f} s); rates below exclude it."
                )
                result["first_step"] = first
            if step % task.summary_interval_steps == 0 or step == task.num_train_steps:
                check_finite(state)
                scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
                scalars.update(progress.report(step, tokens_per_step=scalars["num_tokens"]))
                summaries.write_scalars(train_writer, step, "train", scalars)
                summaries.log(progress.line(step, scalars["loss"], scalars))
                result["train"] = scalars
                result["history"].append((step, scalars))
            if preemption.should_stop(step):
                check_finite(state)
                ckpt.save(step, state, batches.input_state())
                ckpt.wait()
                summaries.log(
                    f"Preempted (SIGTERM) at step {step}: checkpoint saved in {ckpt.directory}. "
                    "Run the same command again to resume."
                )
                result["preempted"] = True
                break
            if step % task.save_interval_steps == 0 or step == last_step:
                check_finite(state)
                ckpt.save(step, state, batches.input_state())
            if (
                mode is Mode.TRAIN_AND_EVAL
                and job.eval_inputs
                and (
                    (task.eval_interval_steps and step % task.eval_interval_steps == 0)
                    or step == task.num_train_steps
                )
            ):
                with progress.paused(state):
                    result["eval"] = evaluate(step)
            if decoder is not None and (
                step % task.decode_interval_steps == 0 or step == task.num_train_steps
            ):
                with progress.paused(state):
                    result["decode"] = decoder.run(state.params, step)
        preemption.close()
        batches.close()
        ckpt.wait()
        ckpt.close()
        result["state"] = state
        return result
