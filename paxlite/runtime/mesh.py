"""The device mesh from an experiment's ICI/DCN mesh shapes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh


class MeshShapeError(ValueError):
    """The mesh shape does not fit the devices of this job."""


#: An ICI_MESH_SHAPE entry that takes the devices the other entries leave (Pax's pmap runs).
ALL_REMAINING = -1


def resolved_ici(
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int] | None,
    num_devices: int | None = None,
) -> tuple[int, ...]:
    """``ici_mesh_shape`` with an ``ALL_REMAINING`` (-1) entry replaced by the devices left
    over (of ``num_devices``, default ``jax.device_count()``) after the other entries and DCN."""
    ici = tuple(ici_mesh_shape)
    if ALL_REMAINING not in ici:
        return ici
    total = jax.device_count() if num_devices is None else num_devices
    others = math.prod(size for size in ici if size != ALL_REMAINING)
    others *= math.prod(dcn_mesh_shape or (1,))
    return tuple(max(total // others, 1) if size == ALL_REMAINING else size for size in ici)


def create_mesh(
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int] | None,
    axis_names: Sequence[str],
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """A ``Mesh`` whose axis ``i`` has ``ici[i] * dcn[i]`` devices.

    Args:
      ici_mesh_shape: devices per axis within one slice (over ICI).
      dcn_mesh_shape: slices per axis (over DCN); ``None`` for one slice.
      axis_names: one name per axis, e.g. ``('replica', 'data', 'mdl')``.
      devices: defaults to ``jax.devices()``.

    Raises:
      MeshShapeError: lengths differ, or the product is not the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    ici = resolved_ici(ici_mesh_shape, dcn_mesh_shape, len(devices))
    dcn = tuple(dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici)
    if not (len(ici) == len(dcn) == len(axis_names)):
        raise MeshShapeError(
            f"ICI_MESH_SHAPE {ici}, DCN_MESH_SHAPE {dcn} and MESH_AXIS_NAMES "
            f"{tuple(axis_names)} must have the same length."
        )
    wanted = math.prod(ici) * math.prod(dcn)
    if wanted != len(devices):
        raise MeshShapeError(
            f"ICI_MESH_SHAPE {ici} x DCN_MESH_SHAPE {dcn} needs {wanted} devices, but this job "
            f"has {len(devices)} ({devices[0].platform}). Set the mesh shapes so their product is "
            f"{len(devices)}, e.g. --set ICI_MESH_SHAPE={_suggest(ici, len(devices))}."
        )
    num_slices = math.prod(dcn)
    if num_slices == 1:
        array = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    else:
        array = _hybrid_device_array(ici, dcn, devices)
    return Mesh(array, tuple(axis_names))


def axis_sizes(
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int] | None,
    axis_names: Sequence[str],
) -> dict[str, int]:
    """Mesh axis name -> devices on it (ICI x DCN), without building a mesh."""
    ici_mesh_shape = resolved_ici(ici_mesh_shape, dcn_mesh_shape)
    dcn = tuple(dcn_mesh_shape) if dcn_mesh_shape else (1,) * len(ici_mesh_shape)
    return {
        name: ici * slices
        for name, ici, slices in zip(axis_names, ici_mesh_shape, dcn, strict=True)
    }


def mesh_size(
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int] | None,
    num_devices: int | None = None,
) -> int:
    """Devices in the mesh: the product of the ICI and DCN shapes (a -1 entry resolved
    against ``num_devices``, default ``jax.device_count()``)."""
    return math.prod(resolved_ici(ici_mesh_shape, dcn_mesh_shape, num_devices)) * math.prod(
        dcn_mesh_shape or (1,)
    )


def _hybrid_device_array(ici: tuple[int, ...], dcn: tuple[int, ...], devices) -> np.ndarray:
    """Slices become contiguous blocks: axis i = dcn[i] blocks of ici[i] devices.

    TPU slices are JAX's granules (``slice_index``); on CPU and GPU each process
    is one; one process with fake devices splits them in order.
    """
    num_slices = math.prod(dcn)
    if len({getattr(d, "slice_index", 0) for d in devices}) == num_slices > 1:
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=True
        )
    if jax.process_count() == num_slices:
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, process_is_granule=True, allow_split_physical_axes=True
        )
    per_slice = len(devices) // num_slices
    granules = [devices[i * per_slice : (i + 1) * per_slice] for i in range(num_slices)]
    blocks = np.empty(dcn, dtype=object)
    for idx, granule in zip(np.ndindex(*dcn), granules, strict=True):
        blocks[idx] = mesh_utils.create_device_mesh(ici, granule, allow_split_physical_axes=True)
    return np.block(blocks.tolist())


def _suggest(ici: tuple[int, ...], count: int) -> str:
    """``(1, count, 1)``-style suggestion in the same rank as ``ici``."""
    shape = [1] * len(ici)
    shape[min(1, len(ici) - 1)] = count
    return ",".join(str(s) for s in shape)
