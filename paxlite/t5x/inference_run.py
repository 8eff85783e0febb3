"""What T5X's eval and infer commands share: the job their gin files describe (built
as paxlite's main builds one, nothing written), the checkpoints they restore, and the
files T5X writes first into the output directory (``config.gin``, ``model-info.txt``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from etils import epath

import paxlite.main as paxlite_main
from paxlite.checkpoints import checkpoint_sources
from paxlite.cli.exits import fail
from paxlite.cli.flags import FLAGS, Mode, UsageError
from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.formats.t5x import gin_run, translation
from paxlite.runtime import job_config, storage
from paxlite.runtime.job import Job
from paxlite.t5x import command
from paxlite.train import train_setup

#: T5X's config file, written by ``gin_utils.summarize_gin_config``.
CONFIG_GIN = "config.gin"
MODEL_INFO = "model-info.txt"
#: Lengths for the job's own input when T5X's are None (the longest example's, which
#: seqio's evaluator measures): that input is read for one batch's structure only.
_ANY_LENGTHS = {"inputs": 2, "targets": 2}


def read_inference(
    script: gin_run.Script, output_macro: str
) -> tuple[gin_run.GinRun, translation.Inference]:
    """The eval or infer command's gin files read into ``script``'s call and translated,
    after refusing paxlite's own flags (``output_macro``: where the outputs go, named in
    the refusal of ``--job_log_dir``)."""
    outputs = f'the outputs go to {output_macro}: --gin.{output_macro}=\\"...\\"'
    command.reject_flags(
        command.INFERENCE_DECIDED | {"job_log_dir": outputs}, script.alias.split("_")[0]
    )
    run = command.read(script)
    try:
        return run, translation.inference_knobs(run.call, run.sources, run.config_text)
    except translation.UnsupportedBinding as e:
        fail(e)


def prepared_job(knobs: dict[str, Any], output_dir: str, name: str) -> Job:
    """The ``T5xGin`` job of ``knobs`` (processes joined, platform set up), its job
    directory ``output_dir`` (checked writable, nothing written; ``name``: the macro that
    set it, for the message)."""
    try:
        job_config.check_job_dir_writable(storage.job_path(output_dir), name)
    except UsageError as e:
        fail(e)
    command.join_flags()
    if not knobs["TASK_FEATURE_LENGTHS"]:
        knobs = knobs | {"TASK_FEATURE_LENGTHS": _ANY_LENGTHS}
    FLAGS.exp = translation.EXPERIMENT
    FLAGS.job_log_dir = output_dir
    FLAGS.mode = Mode.EVAL
    FLAGS.set = [f"{name}={translation.knob_text(value)}" for name, value in knobs.items()]
    _, job, _ = paxlite_main.prepare()
    return job


def checkpoint_paths(restore: translation.Restore) -> list[str]:
    """The checkpoints to read, in order, as T5X's ``utils.RestoreCheckpointConfig`` modes
    say: each path ('specific'), the newest step of the first path that has steps
    ('latest'), or every step of each path ('all'); T5X model directories and paxlite's job
    directories have steps. One line if a path holds nothing paxlite can restore."""
    if restore.mode == "latest":
        return _latest(restore)
    paths = []
    for path in restore.paths:
        try:
            kind = checkpoint_sources.identify(path)
        except checkpoint_sources.CheckpointSourceError as e:
            fail(f"CHECKPOINT_PATH: {e}")
        if restore.mode == "specific":
            paths.append(path)
            continue
        steps = _steps(epath.Path(path), kind.name)
        if not steps:
            fail(
                f"CHECKPOINT_PATH {path} is one checkpoint ({kind.name}), not a directory of "
                f"steps, which RestoreCheckpointConfig.mode={restore.mode!r} reads; give its "
                "model directory, or set the mode to 'specific'."
            )
        paths += [str(step_dir) for step_dir in steps]
    return paths


def _latest(restore: translation.Restore) -> list[str]:
    """T5X's 'latest': the newest step of the first path that holds steps."""
    for path in restore.paths:
        try:
            kind = checkpoint_sources.identify(path)
        except checkpoint_sources.CheckpointSourceError:
            continue
        steps = _steps(epath.Path(path), kind.name)
        if steps:
            return [str(steps[-1])]
    fail(
        f"CHECKPOINT_PATH {', '.join(restore.paths)}: no directory of checkpoint steps, which "
        "RestoreCheckpointConfig.mode='latest' reads; give a model directory, or set the "
        "mode to 'specific'."
    )


def _steps(path: epath.Path, kind: str) -> list[epath.Path]:
    """The step directories of a T5X model dir or a paxlite job (or checkpoints) dir."""
    if (path / "checkpoints").is_dir() and kind == "paxlite job":
        path = path / "checkpoints"
    if kind.startswith("t5x") and path.is_dir() and not path.name.startswith("checkpoint_"):
        return [path / f"checkpoint_{step}" for step in t5x_checkpoint.steps(path)]
    if kind in ("paxlite job", "paxlite checkpoints dir"):
        return [path / str(step) for step in ocp.utils.checkpoint_steps(path)]
    return []


def restored_params(job: Job, path: str, dtype: str | None) -> train_setup.RunState:
    """The parameters and step of checkpoint ``path`` on the job's shardings, cast to
    ``dtype`` (T5X's ``RestoreCheckpointConfig.dtype``; None: the model's float32)."""
    try:
        with job.scope():
            run = train_setup.restore_params(job, "T5X's restore", path)
    except (FileNotFoundError, ValueError) as e:
        fail(f"CHECKPOINT_PATH {path}: {e}")
    if dtype == "bfloat16":
        params = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), run.state.params)
        run = dataclasses.replace(run, state=run.state.replace(params=params))
    return run


def write_first_files(job: Job, output_dir: epath.Path, config_text: str, params: Any) -> None:
    """T5X's ``config.gin`` and ``model-info.txt`` (``params``' and the step; process 0)."""
    if jax.process_index() != 0:
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / CONFIG_GIN).write_text(config_text)
    (output_dir / MODEL_INFO).write_text(job.task.checkpoint_format.params_info(params))
