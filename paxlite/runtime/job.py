"""A job: the experiment built for this process (mesh, task, inputs), checked before any compile."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
from etils import epath
from jax.sharding import Mesh, NamedSharding

from paxlite.evaluation import decode_lib
from paxlite.experiments.base_experiment import BaseExperiment
from paxlite.experiments.tasks_lib import SingleTask
from paxlite.runtime import attention_choice, partitioning, platform_kernels
from paxlite.runtime.mesh import create_mesh
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.layers.attentions import AttentionImpl
from praxis_lite.sharding import filter_rules_for_mesh


@dataclasses.dataclass
class Job:
    """Everything built from an experiment before a run.

    Attributes:
      experiment: the experiment instance (knobs applied).
      task: the built task (model, learner, intervals).
      mesh: the device mesh; rules: logical-axis rules filtered to it.
      train_input / eval_inputs / decoder_inputs: this process's inputs.
      job_log_dir: where checkpoints, summaries and outputs go.
      attention_impl: what the attention layers use (``paxlite.runtime.attention_choice``).
    """

    experiment: BaseExperiment
    task: SingleTask
    mesh: Mesh
    rules: Any
    train_input: BaseInput
    eval_inputs: list[BaseInput]
    job_log_dir: epath.Path
    decoder_inputs: list[BaseInput] = dataclasses.field(default_factory=list)
    attention_impl: AttentionImpl = AttentionImpl.EINSUM

    @property
    def batch_sharding(self) -> NamedSharding:
        """How this job's batches are laid out (see :mod:`paxlite.runtime.partitioning`)."""
        return partitioning.batch_sharding(self.mesh, self.rules)

    def to_global(self, batch: Any) -> Any:
        """A host-local batch as global arrays laid out like this job's batches."""
        return partitioning.to_global(batch, self.batch_sharding)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The job's mesh and logical-axis rules, set for the code run inside."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            yield


def build_job(
    experiment: BaseExperiment,
    task_cfg: Any,
    dataset_cfgs: list[Any],
    job_log_dir: epath.Path,
    devices: Sequence[jax.Device] | None = None,
    decoder_dataset_cfgs: Sequence[Any] = (),
) -> Job:
    """Builds the mesh, the task and the inputs (validating shapes before any compile).

    ``devices`` defaults to all devices of the job. ``decoder_dataset_cfgs`` (the
    experiment's ``decoder_datasets()``, overrides applied) become
    ``Job.decoder_inputs``; pass them for ``--mode=decode`` or a train_and_eval
    that decodes. They are checked here: each yields decode batches and the
    model can decode (``decode_lib.DecodeConfigError`` otherwise). Their batches may
    have any size (the decode program pads them).

    Raises:
      batch_sizes.BatchSizeError: a training or eval input's global batch does not split
        over the mesh.
      ValueError: not exactly one training input.
    """
    mesh = create_mesh(
        experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE, experiment.MESH_AXIS_NAMES, devices
    )
    attention_impl = attention_choice.apply(task_cfg, experiment, list(mesh.devices.flat))
    platform_kernels.apply(task_cfg, list(mesh.devices.flat))
    task = config_lib.instantiate(task_cfg)
    if decoder_dataset_cfgs:  # Before any decoder input reads data.
        decode_lib.check_can_decode(task.model)
    rules = filter_rules_for_mesh(experiment.logical_axis_rules(), mesh)
    layout = partitioning.batch_sharding(mesh, rules)
    inputs = [partitioning.instantiate_input(cfg, layout) for cfg in dataset_cfgs]
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
        decoder_inputs=[
            partitioning.instantiate_input(cfg, layout) for cfg in decoder_dataset_cfgs
        ],
        attention_impl=attention_impl,
    )
    for inp in [job.train_input, *job.eval_inputs]:
        partitioning.check_batch_divides(inp, layout)
    for inp in job.decoder_inputs:
        decode_lib.check_decode_input(inp, task.model)
        decode_lib.stop_table(inp, task.decoder_params())
    return job
