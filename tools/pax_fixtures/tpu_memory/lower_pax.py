"""Lowers paxml 1.4's own train step for a TPU topology and saves the program (step 1 of 2).

Pax's trainer builds the step: its ``PjitPartitioner`` (as ``create_partitioner`` makes it for
training) around ``trainer_lib.train_step_single_learner``, on a device mesh of the compile-only
TPU devices libtpu describes (praxis's mesh order: ``mesh_utils.create_device_mesh``), with the
train batch Pax's input gives (its global batch, ``PERCORE_BATCH_SIZE`` x chips) and Pax's
hardware RNG key (``--globally_use_hardware_rng``). The lowered module is saved as a portable
StableHLO artifact (``module.vhlo``) with the ``CompileOptions`` jax would hand the compiler
(``compile_options.pb``): jaxlib 0.4.26 cannot pass its own bytecode to any libtpu on PyPI,
so ``compile_pax.py`` compiles it in paxlite's venv, with the TPU compiler paxlite uses.

Runs in the paxml venv (``make_venv.sh`` here), which loads libtpu only for the topology:

    ENABLE_PJRT_COMPATIBILITY=1 JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 \\
    TPU_ACCELERATOR_TYPE=v4-128 TPU_WORKER_HOSTNAMES=localhost TPU_WORKER_ID=0 \\
        /tmp/paxml-venv/bin/python tools/pax_fixtures/tpu_memory/lower_pax.py \\
        paxml.tasks.lm.params.lm_cloud.LmCloudSpmd32B v4:4x4x4 /tmp/pax-tpu/LmCloudSpmd32B
"""

import importlib
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import compiler
from jax._src.interpreters import mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir.dialects import hlo
from jax.experimental import mesh_utils, topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from paxml import partitioning, trainer_lib
from paxml.tasks.lm.params import lm_cloud
from praxis import pax_fiddle, py_utils


def train_batch(experiment, chips: int) -> py_utils.NestedMap:
    """Abstract global train batch: Pax's LM input fields, [B, L] (B = per-core batch x chips).

    Synthetic experiments go through ``LingvoInputAdaptor``, which adds ``eval_sample_weights``.
    """
    batch, length = int(round(experiment.PERCORE_BATCH_SIZE * chips)), int(experiment.MAX_SEQ_LEN)
    field = lambda dtype: jax.ShapeDtypeStruct((batch, length), dtype)  # noqa: E731
    fields = py_utils.NestedMap(
        ids=field(jnp.int32),
        labels=field(jnp.int32),
        paddings=field(jnp.float32),
        segment_ids=field(jnp.int32),
        segment_pos=field(jnp.int32),
        weights=field(jnp.float32),
    )
    if isinstance(experiment, lm_cloud.SyntheticDataset):
        fields.eval_sample_weights = jax.ShapeDtypeStruct((batch,), jnp.float32)
    return fields


def per_device_bytes(tree) -> int:
    """Bytes one device holds of an abstract, sharded pytree."""
    return sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * jnp.dtype(x.dtype).itemsize
        for x in jax.tree_util.tree_leaves(tree)
    )


def capture_compile_inputs(lowered) -> tuple:
    """``(module, CompileOptions)`` exactly as jax would pass them to the backend compiler."""
    captured = {}

    class Captured(Exception):
        pass

    def capture(backend, module, options, host_callbacks):
        captured.update(module=module, options=options)
        raise Captured

    compiler.backend_compile = capture
    try:
        lowered.compile()
    except Captured:
        pass
    return captured["module"], captured["options"]


def main(experiment_name: str, topology_name: str, out: pathlib.Path) -> None:
    py_utils.set_globally_use_rbg_prng_key()  # paxml main's --globally_use_hardware_rng.
    module_name, class_name = experiment_name.rsplit(".", 1)
    experiment = getattr(importlib.import_module(module_name), class_name)()
    task = pax_fiddle.instantiate(experiment.task())
    model = task.model
    devices = topologies.get_topology_desc(
        topology_name, platform="tpu", chip_config_name="megacore"
    ).devices
    assert len(devices) == int(np.prod(model.ici_mesh_shape)), "one slice, one chip a device"
    device_mesh = mesh_utils.create_device_mesh(
        model.ici_mesh_shape, devices=devices, contiguous_submeshes=bool(model.contiguous_submeshes)
    )
    batch = train_batch(experiment, len(devices))
    partitioner = partitioning.PjitPartitioner(
        init_is_eval=False, reshard_inputs=True, task=task, device_mesh=device_mesh
    )
    partitioner.setup(task, jax.random.PRNGKey(0), batch)
    metadata = partitioner.get_train_state_metadata()
    step, is_eval = partitioning.get_step_fn(trainer_lib.RunningMode.TRAIN)
    sharded_step, batch_specs = partitioner.partition(step, batch, is_eval)
    mesh = partitioner.global_mesh
    on_mesh = lambda x, spec: jax.ShapeDtypeStruct(  # noqa: E731
        x.shape, x.dtype, sharding=NamedSharding(mesh, spec)
    )
    state = jax.tree_util.tree_map(on_mesh, metadata.padded_global_shapes, metadata.partition_specs)
    key = on_mesh(jax.eval_shape(lambda: jax.random.PRNGKey(0)), P())
    inputs = jax.tree_util.tree_map(on_mesh, batch, batch_specs)
    static = trainer_lib.BaseStepFnStaticArgs(unpadded_global_batch_size=batch.ids.shape[0])
    module, options = capture_compile_inputs(sharded_step.lower(state, key, inputs, static))

    out.mkdir(parents=True, exist_ok=True)
    bytecode = mlir.module_to_bytecode(module)
    artifact = xla_client._xla.mlir.serialize_portable_artifact(  # noqa: SLF001
        bytecode, hlo.get_minimum_version()
    )
    (out / "module.vhlo").write_bytes(artifact)
    (out / "compile_options.pb").write_bytes(options.SerializeAsString())
    facts = {
        "experiment": experiment_name,
        "topology": topology_name,
        "global_batch": int(batch.ids.shape[0]),
        "num_params": sum(
            int(np.prod(x.shape))
            for x in jax.tree_util.tree_leaves(metadata.unpadded_global_shapes.mdl_vars)
        ),
        "params_bytes_per_device": per_device_bytes(state.mdl_vars),
        "opt_state_bytes_per_device": per_device_bytes(state.opt_states),
        "device_ids": [int(d.id) for d in device_mesh.flat],
        "paxml_jax": jax.__version__,
    }
    (out / "lowered.json").write_text(json.dumps(facts, indent=1))
    print(json.dumps({k: v for k, v in facts.items() if k != "device_ids"}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]))
