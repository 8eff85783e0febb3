"""Joining a multi-process job (jax.distributed) and faking devices for dry runs."""

from __future__ import annotations

import os

import jax

# Environment variables that mean "this process is one of several" for a cluster
# JAX knows how to read (SLURM, Open MPI, TPU pods/multislice, explicit JAX env).
_CLUSTER_MARKERS = (
    ("SLURM_NTASKS", lambda v: int(v) > 1),
    ("OMPI_COMM_WORLD_SIZE", lambda v: int(v) > 1),
    ("MEGASCALE_COORDINATOR_ADDRESS", bool),
    ("TPU_WORKER_HOSTNAMES", lambda v: "," in v),
    ("JAX_COORDINATOR_ADDRESS", bool),
)


class DistributedSetupError(ValueError):
    """The multi-process flags are incomplete or contradict each other."""


def cluster_detected() -> bool:
    """Whether the environment describes a multi-process job JAX can auto-configure."""
    for name, is_multi in _CLUSTER_MARKERS:
        value = os.environ.get(name)
        if value:
            try:
                if is_multi(value):
                    return True
            except ValueError:
                continue
    return False


def initialize(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    timeout_s: int = 300,
) -> bool:
    """Initializes ``jax.distributed`` from flags, or from the cluster environment.

    With none of the flags and no cluster environment, does nothing (one process).
    On CPU, cross-process collectives use gloo so local processes form one job.

    Returns:
      Whether this is a multi-process job.
    """
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise DistributedSetupError(
            "--coordinator_address, --num_processes and --process_id go together; give all "
            "three (e.g. --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0) "
            "or none (to use the cluster's environment)."
        )
    if not all(given) and not cluster_detected():
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if all(given):
        if not 0 <= process_id < num_processes:
            raise DistributedSetupError(
                f"--process_id={process_id} must be in [0, --num_processes={num_processes})."
            )
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=timeout_s,
        )
    else:
        jax.distributed.initialize(initialization_timeout=timeout_s)
    return jax.process_count() > 1


def use_fake_cpu_devices(count: int) -> None:
    """Makes this process see ``count`` CPU devices (must run before JAX starts a backend)."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        if jax.device_count() == count and jax.devices()[0].platform == "cpu":
            return
        raise RuntimeError(
            "JAX already started with other devices; the compile dry run must configure fake "
            "devices first (run it in a fresh process)."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    jax.config.update("jax_platforms", "cpu")
