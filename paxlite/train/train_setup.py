"""One way to get a run's train state (abstract, fresh or restored) and its jitted steps.

Training, evaluation, decoding, the benchmark and compile-only runs all start
here; call these inside ``job.scope()`` (the mesh and logical rules set).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import time
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec

from paxlite.checkpoints import checkpoint_sources, init_from, input_positions, train_checkpoints
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.perf.flops import StepCost, step_cost
from paxlite.perf.mfu import Peak
from paxlite.runtime import job_record, partitioning
from paxlite.runtime.job import Job
from paxlite.train import pure_steps, summaries, trainable
from paxlite.train.train_state import TrainState
from praxis_lite.flops import FlopsDefinition
from praxis_lite.inputs.base_input import BaseInput, InputConfigError
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import init_with_shardings, logical_shardings, strip_boxes


class StateSource(enum.Enum):
    """Where a run's train state comes from."""

    ABSTRACT = "abstract"  # Shapes and shardings only (compile-only runs).
    FRESH = "fresh"  # Initialized from the seed; no checkpoint read (benchmark).
    # Resume from the latest checkpoint, else fresh (with the parameters INIT_FROM or
    # task.train.init_from_checkpoint_rules load).
    LATEST_OR_FRESH = "latest_or_fresh"


@dataclasses.dataclass
class RunState:
    """A run's starting point.

    Attributes:
      state: the TrainState (global arrays; ShapeDtypeStructs for ABSTRACT).
      shardings: its NamedShardings.
      sample: a global batch shaped like training's (abstract for ABSTRACT).
      train_key: the replicated dropout key of the train steps.
      restored_step: the checkpoint step restored, or None.
      input_replay: host batches the restored run had read ahead (with their input
        states), to feed before the train input's next batch.
    """

    state: Any
    shardings: Any
    sample: NestedMap
    train_key: Any
    restored_step: int | None = None
    input_replay: list[Any] = dataclasses.field(default_factory=list)


def check_batch_spec(job: Job, sample: NestedMap, inp: BaseInput | None = None) -> None:
    """Raises InputConfigError unless ``sample``, a batch of ``inp`` (default: the train
    input), has what the model reads."""
    inp = job.train_input if inp is None else inp
    missing = [
        f"{key} (rank {rank})"
        for key, rank in job.task.model.batch_spec().items()
        if key not in sample or sample[key].ndim != rank
    ]
    if missing:
        raise InputConfigError(
            f"Input '{inp.name}' yields batches with {', '.join(sorted(sample))}, "
            f"but {type(job.task.model).__name__} reads {', '.join(missing)}; fix the "
            "experiment's datasets() so its batches carry them."
        )


def check_eval_batches(job: Job) -> None:
    """:func:`check_batch_spec` of every eval input's first batch (the inputs rewound), before
    a run trains or evaluates: a wrong kind of eval input stops it at once, not at its first
    eval."""
    for inp in job.eval_inputs:
        check_batch_spec(job, partitioning.read_sample(inp), inp)


def abstract_train_state(job: Job, sample: NestedMap) -> tuple[Any, Any]:
    """``(abstract TrainState with shardings, its NamedShardings)``, allocating nothing."""
    return abstract_state_for(job.task, job.mesh, job.rules, sample)


def abstract_state_for(task: Any, mesh: Any, rules: Any, sample: NestedMap) -> tuple[Any, Any]:
    """:func:`abstract_train_state` of a task on a mesh, without a Job (e.g. for inference)."""
    init_fn = pure_steps.make_init_fn(task)
    # The key is made inside: nothing runs eagerly (the mesh's devices may be a TPU target's).
    abstract_boxed = jax.eval_shape(lambda batch: init_fn(jax.random.key(0), batch), sample)
    shardings = strip_boxes(logical_shardings(abstract_boxed, mesh, rules))
    return train_checkpoints.abstract_like(strip_boxes(abstract_boxed), shardings), shardings


def init_or_restore(
    job: Job,
    source: StateSource,
    checkpointer: train_checkpoints.Checkpointer | None = None,
) -> RunState:
    """The run's train state from ``source`` (``checkpointer`` for LATEST_OR_FRESH).

    Raises:
      InputConfigError: the train input's batches lack what the model reads.
      init_from.InitFromError: the loading rules do not fit their checkpoints.
    """
    local = partitioning.read_sample(job.train_input)
    check_batch_spec(job, local)
    if source is StateSource.ABSTRACT:  # No device work at all (the devices may be a target's).
        sample = partitioning.abstract_global(local, job.batch_sharding)
        state, shardings = abstract_train_state(job, sample)
        return RunState(state, shardings, sample, jax.eval_shape(lambda: jax.random.key(0)))
    check_eval_batches(job)
    init_key, train_key = jax.random.split(jax.random.key(job.experiment.SEED))
    sample = partitioning.to_global(local, job.batch_sharding)
    abstract, shardings = abstract_train_state(job, sample)
    key = partitioning.replicate(train_key, job.mesh)
    latest = _latest_step(checkpointer, source)
    rules = {} if source is StateSource.FRESH else init_from.rules_of(job.task, _init_from(job))
    if latest is not None:
        return _resumed(job, checkpointer, (abstract, shardings), rules, (init_key, key, sample))
    state = _starting_state(job, (abstract, shardings), init_key, sample, rules)
    if source is StateSource.LATEST_OR_FRESH and trainable.freezes(state.params, job.task.learner):
        if jax.process_index() == 0:  # Where its frozen parameters come from, for good.
            job_record.write_frozen_start(job.job_log_dir, job.task.learner, rules)
    return RunState(state, shardings, sample, key)


def _starting_state(
    job: Job,
    abstract_and_shardings: tuple[Any, Any],
    init_key: Any,
    sample: NestedMap,
    rules: dict[str, Any],
) -> Any:
    """The state of step 0: what the loading rules load, the rest initialised from the
    seed. When the rules load every parameter, nothing is drawn from the seed: a
    fine-tune neither computes a random model nor holds it beside the loaded one."""
    abstract, shardings = abstract_and_shardings
    init_fn = pure_steps.make_init_fn(job.task)
    if not rules:
        summaries.log(
            f"Every parameter initialised from the seed (SEED={job.experiment.SEED}): no "
            "checkpoint loads them."
        )
        return init_with_shardings(init_fn, shardings, init_key, sample)

    run_params = traverse_util.flatten_dict(abstract.params, sep="/")

    def fresh_state(loaded: dict[str, Any]) -> Any:
        if loaded.keys() == run_params.keys():  # The loaded arrays become the state's.
            boxes = jax.eval_shape(init_fn, init_key, sample).params  # Traced, not run.
            params = traverse_util.unflatten_dict(loaded, sep="/")
            return _state_around(job, boxes, shardings, params)
        fresh = init_with_shardings(init_fn, shardings, init_key, sample)
        return init_from.overlaid(fresh, loaded)

    return init_from.initialise_around(fresh_state, abstract, rules, _layouts(job, rules))


def _state_around(job: Job, boxes: Any, shardings: Any, params: Any) -> Any:
    """The state of step 0 around ``params`` (donated: they become the state's), on
    ``shardings``.

    ``boxes``: the parameters' logical boxes (abstract), whose names the optimizer's init
    reads (they decide, e.g., which dims of a moment Adafactor factors).
    """
    state_of = pure_steps.make_state_fn(job.task)

    def around(values: Any) -> Any:
        boxed = jax.tree_util.tree_map(
            lambda box, value: box.replace_boxed(value) if _is_box(box) else value,
            boxes,
            values,
            is_leaf=_is_box,
        )
        return nn.unbox(state_of(boxed))

    return jax.jit(around, out_shardings=shardings, donate_argnums=0)(params)


def _is_box(leaf: Any) -> bool:
    return isinstance(leaf, nn.meta.AxisMetadata)


def _resumed(
    job: Job,
    checkpointer: train_checkpoints.Checkpointer,
    abstract_and_shardings: tuple[Any, Any],
    rules: dict[str, Any],
    keys_and_sample: tuple[Any, Any, NestedMap],
) -> RunState:
    """The run resumed from its newest checkpoint (with the checkpointer's restore
    fallback, the newest that reads: ``Checkpointer.restore_latest``); frozen parameters
    (never saved) are the starting state's again (the seed's and the loading rules')."""
    (abstract, shardings), (init_key, key, sample) = abstract_and_shardings, keys_and_sample
    learner = job.task.learner
    restored = checkpointer.restore_latest(trainable.saved(abstract, learner))
    _report_moved_aside(restored, checkpointer.directory)
    state, latest = restored.state, restored.step
    replay = None
    if job.task.resume_input and restored.input_state is not None:
        replay = input_positions.restore(checkpointer.directory, latest, job.train_input)
        if replay is None:  # No saved reader position: the input re-reads up to its state.
            job.train_input.set_state(restored.input_state)
        how = "its saved batch count" if replay is None else "its saved reader position"
    else:
        how = "from its first batch"
        why = (
            "task.resume_input = False; T5X's SaveCheckpointConfig.save_dataset = False"
            if not job.task.resume_input
            else "the checkpoint holds no input state: another framework (T5X) wrote it"
        )
        _warn(
            f"the training input starts again from its first batch at step {latest} ({why}): "
            "the batches already trained on are read again."
        )
    summaries.log(
        f"Restored checkpoint at step {latest} from {checkpointer.directory} (input: {how})"
    )
    if trainable.freezes(abstract.params, learner):
        summaries.log("Frozen parameters (not in checkpoints) re-read as the run started them:")
        start = _starting_state(
            job, (abstract, shardings), init_key, sample, _frozen_rules(job, rules)
        )
        _, frozen = trainable.split(start.params, trainable.trainable_keys(start.params, learner))
        state = state.replace(params=trainable.merge(state.params, frozen))
    elif rules:
        summaries.log(
            f"Not reading {', '.join(rules)}: this job resumes from its own checkpoint "
            "(an initial checkpoint only starts a job that has none)."
        )
    return RunState(state, shardings, sample, key, latest, replay or [])


def _warn(message: str) -> None:
    """A ``paxlite: warning:`` line on stderr (process 0)."""
    if jax.process_index() == 0:
        print(f"paxlite: warning: {message}", file=sys.stderr, flush=True)


def _report_moved_aside(restored: train_checkpoints.Restored, directory: Any) -> None:
    """A ``paxlite: warning:`` line (process 0) for each damaged checkpoint passed over."""
    for moved in restored.moved_aside:
        _warn(
            f"the checkpoint at step {moved.step} in {directory} cannot be "
            f"read ({moved.cause}); moved it to {moved.to} and resuming from step "
            f"{restored.step}, the newest that reads (--restore_fallback)."
        )


def _init_from(job: Job) -> str | None:
    source = job.experiment.init_source()
    return None if source is None else source.path


def _layouts(job: Job, rules: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The pipeline ``(S, R)`` each paxml checkpoint was saved with: INIT_FROM's (its
    INIT_FROM_EXP's) when the job has one, else this run's (a rule's task_p, when given,
    says its own)."""
    source = job.experiment.init_source()
    layout = job.experiment.pipeline_layout() if source is None else source.layout()
    return dict.fromkeys(rules, tuple(layout))


def restore_params(
    job: Job, purpose: str, path: str | None = None, step: int | None = None
) -> RunState:
    """The parameters (and step) of a checkpoint, on the job's shardings; nothing else is
    read (eval and decode). ``path``: any kind ``checkpoint_sources`` reads (None:
    the job's own newest checkpoint, or ``step``).

    Raises:
      FileNotFoundError: no ``path`` and the job dir has no checkpoint (names ``purpose``).
      init_from.InitFromError: the checkpoint lacks a parameter or holds one of another shape.
    """
    local = partitioning.read_sample(job.train_input)
    check_batch_spec(job, local)
    check_eval_batches(job)
    sample = partitioning.to_global(local, job.batch_sharding)
    abstract, shardings = abstract_train_state(job, sample)
    if path is None:
        path = str(_own_checkpoints(job, purpose))
    run_params = traverse_util.flatten_dict(abstract.params, sep="/")
    frozen = trainable.frozen_rules([f"params/{p}" for p in run_params], job.task.learner)
    rules = {path: CheckpointLoadingRules(step=step, ignore_rules=frozen or None)}
    with init_from.opened(rules, _layouts(job, rules)) as entries:
        params = init_from.read_params(entries, run_params)
        if frozen:  # Not in the run's checkpoints: as the run started them.
            params.update(_frozen_params(job, (abstract, shardings), sample, path))
        missing = init_from.fresh_params(entries, run_params)
        missing = [name for name in missing if name[len("params/") :] not in params]
        source = entries[0].source
        if missing:
            raise init_from.InitFromError(
                f"{source.describe()} lacks {len(missing)} of this model's parameters: "
                f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}; pass the "
                "checkpoint this experiment wrote (or the knobs that wrote this one)."
            )
        summaries.log(f"Restored the parameters of step {source.step} from {source.describe()}")
        step_array = jax.device_put(np.int32(source.step), shardings.step)
    state = TrainState(
        step=step_array,
        params=traverse_util.unflatten_dict(params, sep="/"),
        opt_state=None,
        nonfinite_steps=None,
        first_nonfinite_step=None,
    )
    return RunState(state, shardings, sample, None, source.step)


def _frozen_rules(job: Job, rules: dict[str, Any], checkpoint: str | None = None) -> dict[str, Any]:
    """The loading rules the frozen parameters came from: as recorded by the job that
    wrote ``checkpoint`` (default: this job) when it started, else this run's ``rules``."""
    job_dir = checkpoint_sources.job_dir_of(checkpoint) if checkpoint else job.job_log_dir
    start = job_record.frozen_start(job_dir) if job_dir is not None else None
    if start is None:
        summaries.log(f"No {job_record.FROZEN_START_FILE} in {job_dir}: this run's rules.")
        return rules
    return start.rules


def _frozen_params(
    job: Job, abstract_and_shardings: tuple[Any, Any], sample: NestedMap, checkpoint: str
) -> dict[str, Any]:
    """The frozen parameters as the job that wrote ``checkpoint`` started them (``{path:
    array}``): checkpoints do not hold them."""
    summaries.log("Frozen parameters (not in checkpoints) read as the run started them:")
    init_key, _ = jax.random.split(jax.random.key(job.experiment.SEED))
    rules = _frozen_rules(job, init_from.rules_of(job.task, _init_from(job)), checkpoint)
    params = _starting_state(job, abstract_and_shardings, init_key, sample, rules).params
    _, frozen = trainable.split(params, trainable.trainable_keys(params, job.task.learner))
    return traverse_util.flatten_dict(frozen, sep="/")


def _own_checkpoints(job: Job, purpose: str) -> Any:
    """``<job_log_dir>/checkpoints`` once it holds a complete checkpoint."""
    checkpointer = train_checkpoints.Checkpointer(
        job.job_log_dir,
        max_to_keep=job.task.max_to_keep,
        checkpoint_format=job.task.checkpoint_format,
    )
    try:
        _latest_step(checkpointer, StateSource.LATEST_OR_FRESH)
        if checkpointer.latest_step() is None:
            raise FileNotFoundError(
                f"{purpose} needs a checkpoint, but {checkpointer.directory} has none; train "
                "first, or pass --restore_checkpoint_dir=PATH."
            )
        return checkpointer.directory
    finally:
        checkpointer.close()


def _latest_step(
    checkpointer: train_checkpoints.Checkpointer | None, source: StateSource
) -> int | None:
    if source is StateSource.FRESH or checkpointer is None:
        return None
    for skipped in checkpointer.interrupted_steps:
        summaries.log(
            f"Skipped the checkpoint at step {skipped} in {checkpointer.directory}: its save "
            "was interrupted before it completed; its partial files were removed."
        )
    return checkpointer.latest_step()


def log_state_sizes(job: Job, run: RunState) -> None:
    """One console line: mesh, devices, parameter count, per-device state sizes."""
    state, mib = run.state, 2**20
    num_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    trained, _ = trainable.split(
        state.params, trainable.trainable_keys(state.params, job.task.learner)
    )
    num_trained = sum(x.size for x in jax.tree_util.tree_leaves(trained))
    frozen = f" ({num_trained:,} trained, the rest frozen)" if num_trained < num_params else ""
    summaries.log(
        f"Mesh {dict(job.mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
        f"devices ({jax.process_count()} processes); {num_params:,} parameters{frozen}; "
        f"per device: params {partitioning.per_device_bytes(state.params) / mib:.2f} MiB, "
        f"optimizer state {partitioning.per_device_bytes(state.opt_state) / mib:.2f} MiB"
    )


def jit_train_step(job: Job, state_shardings: Any) -> Any:
    """The jitted train step: sharded in and out, the state's buffers donated."""
    replicated = NamedSharding(job.mesh, PartitionSpec())
    return jax.jit(
        pure_steps.make_train_step(job.task),
        in_shardings=(state_shardings, job.batch_sharding, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )


def compile_train_step(job: Job, run: RunState) -> tuple[Any, float]:
    """``(compiled step, seconds)``: the jitted step compiled ahead of the loop.

    The loop calls the compiled executable, so it cannot silently recompile:
    arguments of another shape or sharding are an error.
    """
    start = time.perf_counter()
    compiled = lower_train_step(job, run).compile()
    return compiled, time.perf_counter() - start


def lower_train_step(job: Job, run: RunState) -> jax.stages.Lowered:
    """The jitted train step lowered for the run's state, batch and key (not compiled)."""
    return jit_train_step(job, run.shardings).lower(run.state, run.sample, run.train_key)


def compile_with_cost(
    job: Job, run: RunState, peak: Peak | None, definition: FlopsDefinition | None
) -> tuple[Any, float, StepCost]:
    """``(compiled step, compile seconds, its cost)``; logs both (training and the benchmark)."""
    compiled, seconds = compile_train_step(job, run)
    cost = step_cost(
        job.task.model,
        run.sample,
        compiled,
        num_devices=job.mesh.size,
        definition=definition,
        peak=peak,
        grad_accum_steps=job.task.learner.grad_accum_steps,
    )
    summaries.log(f"Compiled the train step in {seconds:.1f} s. {cost.describe()}")
    return compiled, seconds, cost


@contextlib.contextmanager
def restored(
    job: Job, purpose: str, path: str | None = None, step: int | None = None
) -> Iterator[RunState]:
    """:func:`restore_params`, inside the job's scope (eval and decode runs)."""
    with job.scope():
        yield restore_params(job, purpose, path, step)


def jit_eval_step(job: Job, params_shardings: Any) -> Any:
    """The jitted eval step (per-example outputs when an eval input has score metrics)."""
    per_example = any(i.score_metric_fns for i in job.eval_inputs)
    return jax.jit(
        pure_steps.make_eval_step(job.task, per_example=per_example),
        in_shardings=(params_shardings, job.batch_sharding),
        out_shardings=NamedSharding(job.mesh, PartitionSpec()),
    )
