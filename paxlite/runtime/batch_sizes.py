"""Batch arithmetic, one pure function: the global batch of a per-device batch size, each
infeed host's part of it, and its split over the data-parallel devices.

Experiments size their inputs with it (``BaseExperiment.infeed_batch_size``) and the
trainer checks built inputs against the mesh with it (``partitioning.check_batch_divides``):
one rule, one set of messages.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction


class BatchSizeError(ValueError):
    """A batch that does not come out whole, or does not split over hosts or devices."""


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """Examples per training (or eval) step.

    Attributes:
      global_batch: examples per step over all processes.
      per_infeed_host: examples each infeed host's input produces per step (processes that
        hold the same rows, e.g. pipeline stages, count as one infeed host).
    """

    global_batch: int
    per_infeed_host: int


def batch_sizes(
    percore: float | Fraction,
    num_devices: int,
    num_infeed_hosts: int = 1,
    data_ways: int = 1,
    *,
    owner: str = "",
    data_axes: str = "",
) -> BatchSizes:
    """Pax's rule: ``percore`` examples per device (may be fractional: devices that hold no
    rows, e.g. tensor parallelism) x ``num_devices`` is the global batch, which must be a
    positive whole number, split evenly over ``num_infeed_hosts`` and over the ``data_ways``
    data-parallel shards of the mesh.

    Args:
      percore: examples per device (PERCORE_BATCH_SIZE), a float or an exact Fraction.
      num_devices: devices of the mesh.
      num_infeed_hosts: processes reading distinct parts of the input.
      data_ways: into how many parts the batch's dim 0 is split (the batch mesh axes' sizes).
      owner: what the batch belongs to, prefixed to the errors (``"Input 'train': "``).
      data_axes: the data axes, described after the shard count (`` of mesh axes (...)``).

    Raises:
      BatchSizeError: with one line naming the numbers and the knob to change.
    """
    total = percore * num_devices
    if total != int(total) or total <= 0:
        raise BatchSizeError(
            f"{owner}PERCORE_BATCH_SIZE={_shown(percore)} x {num_devices} devices = "
            f"{_shown(total)} is not a positive whole batch; pick PERCORE_BATCH_SIZE so the "
            "product is."
        )
    global_batch = int(total)
    if global_batch % num_infeed_hosts:
        raise BatchSizeError(
            f"{owner}Global batch {global_batch} does not split over {num_infeed_hosts} hosts; "
            "change PERCORE_BATCH_SIZE."
        )
    if global_batch % data_ways:
        raise BatchSizeError(
            f"{owner}global batch {global_batch} is not divisible by the {data_ways} "
            f"data-parallel shards{data_axes}. Change PERCORE_BATCH_SIZE or the mesh shapes so "
            "the batch splits evenly."
        )
    return BatchSizes(global_batch, global_batch // num_infeed_hosts)


def _shown(value: float | Fraction) -> str:
    """A number as the user wrote it (``0.5``, ``4.0``), a Fraction as a float."""
    return str(float(value)) if isinstance(value, Fraction) else str(value)
