"""Where batches and state live on the mesh: batch layout, input split, host-to-global arrays.

A batch is laid out over its dim 0 on the mesh axes the experiment's rules give
the logical axis 'batch'; every other dim is whole on each device. Each process
reads its part of the batch (:func:`infeed_split`) and :func:`to_global` joins
the parts into global ``jax.Array``s. Training and eval batches must split evenly
(:func:`check_batch_divides`); the programs that take any batch size pad it
(:func:`pad_rows`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlite.runtime import batch_sizes
from paxlite.runtime import mesh as mesh_lib
from paxlite.runtime.mesh import MeshShapeError
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import BATCH, filter_rules_for_mesh


def batch_sharding(mesh: Mesh, rules: Any) -> NamedSharding:
    """How batches are laid out: dim 0 over the mesh axes the rules give 'batch'."""
    return NamedSharding(mesh, PartitionSpec(*nn.logical_to_mesh_axes((BATCH,), rules)))


def batch_axes(sharding: NamedSharding) -> tuple[str, ...]:
    """The mesh axes a batch's dim 0 is split over."""
    spec = sharding.spec[0] if sharding.spec else None
    return (spec,) if isinstance(spec, str) else tuple(spec or ())


def batch_ways(sharding: NamedSharding) -> int:
    """Into how many parts a batch's dim 0 is split: the product of its mesh axes' sizes."""
    return math.prod(sharding.mesh.shape[a] for a in batch_axes(sharding))


@functools.lru_cache(maxsize=64)
def infeed_split(sharding: NamedSharding) -> tuple[int, int]:
    """``(num_infeed_hosts, infeed_host_index)``: how the processes share the input.

    Processes whose devices hold the same rows of a batch laid out by
    ``sharding`` (over dim 0) must read the same examples: e.g. with the 'stage'
    axis across processes, every stage runs the same microbatches. So the
    input is split into one part per distinct block of rows (in row order), not
    one per process; with plain data parallelism that is one part per process.

    One process reads the whole batch, whatever the devices' hosts: this includes a
    compile-only run for a TPU slice, whose devices name the slice's hosts, all stood in
    for by this process.

    Raises:
      MeshShapeError: processes hold overlapping or uneven parts of the batch.
    """
    if jax.process_count() == 1:
        return 1, 0
    axes = batch_axes(sharding)
    shards = batch_ways(sharding)
    rows: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map((shards,)).items():
        start, stop, _ = index[0].indices(shards)
        rows.setdefault(device.process_index, set()).update(range(start, stop))
    blocks = sorted({frozenset(r) for r in rows.values()}, key=min)
    contiguous = all(max(b) - min(b) + 1 == len(b) for b in blocks)
    if not contiguous or len({len(b) for b in blocks}) != 1 or sum(map(len, blocks)) != shards:
        raise MeshShapeError(
            f"The processes hold overlapping or uneven parts of the batch (mesh "
            f"{dict(sharding.mesh.shape)}, batch over {axes}); order the mesh axes so each "
            "process holds one contiguous, equal block of the data-parallel axes."
        )
    return len(blocks), blocks.index(frozenset(rows[jax.process_index()]))


def instantiate_input(cfg: Any, layout: NamedSharding | None = None) -> BaseInput:
    """Builds an input for this process.

    Its host count/index come from the batch ``layout`` (:func:`infeed_split`:
    processes holding the same rows read the same data), or without one from JAX
    (one part per process).
    """
    if layout is None:
        hosts, index = jax.process_count(), jax.process_index()
    else:
        hosts, index = infeed_split(layout)
    return config_lib.instantiate(cfg, num_infeed_hosts=hosts, infeed_host_index=index)


def num_infeed_hosts(
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int] | None,
    mesh_axis_names: Sequence[str],
    logical_axis_rules: Any,
) -> int:
    """How many processes read distinct parts of the input of a job on this mesh.

    One per process with plain data parallelism; fewer when processes hold the same batch
    rows (e.g. the 'stage' axis across processes: every stage needs the same microbatches).
    See :func:`infeed_split`.
    """
    if jax.process_count() == 1:
        return 1
    mesh = mesh_lib.create_mesh(ici_mesh_shape, dcn_mesh_shape, mesh_axis_names)
    rules = filter_rules_for_mesh(logical_axis_rules, mesh)
    return infeed_split(batch_sharding(mesh, rules))[0]


def check_batch_divides(inp: BaseInput, layout: NamedSharding) -> None:
    """Raises :class:`batch_sizes.BatchSizeError` unless ``inp``'s global batch splits over
    ``layout`` (the experiments' rule: :func:`paxlite.runtime.batch_sizes.batch_sizes`)."""
    hosts, devices = infeed_split(layout)[0], layout.mesh.size
    batch_sizes.batch_sizes(
        Fraction(inp.batch_size * hosts, devices),
        devices,
        hosts,
        batch_ways(layout),
        owner=f"Input '{inp.name}': ",
        data_axes=f" of mesh axes {batch_axes(layout)} ({dict(layout.mesh.shape)})",
    )


def pad_rows(batch: Any, layout: NamedSharding) -> Any:
    """This process's part of a batch, with zero rows appended so the global batch splits
    over ``layout``'s batch axes: each array ``[b, ...] -> [b', ...]``, ``b'`` the smallest
    multiple of ``batch_ways / num_infeed_hosts`` that is ``>= b`` (unchanged if it is ``b``).

    For the programs that take a batch of any size (``paxlite.pretrained.loading``'s ``logits`` and
    ``generate``, the decode program); the padded rows, all zeros (so of prompt length 0),
    are theirs to drop from the results. Training and eval batches must divide instead
    (:func:`check_batch_divides`): padding would change what they average.
    """
    multiple = batch_ways(layout) // infeed_split(layout)[0]

    def pad(x: Any) -> np.ndarray:
        x = np.asarray(x)
        extra = -x.shape[0] % multiple
        return np.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1)) if extra else x

    return jax.tree_util.tree_map(pad, batch)


def read_sample(inp: BaseInput) -> NestedMap:
    """The input's first host-local batch; the input is rewound, so training still reads it."""
    sample = inp.get_next()
    inp.reset()
    return sample


def _leaf_sharding(layout: NamedSharding, ndim: int) -> NamedSharding:
    return NamedSharding(layout.mesh, PartitionSpec(layout.spec[0], *([None] * (ndim - 1))))


def to_global(batch: NestedMap, layout: NamedSharding) -> NestedMap:
    """Host-local numpy batch -> global jax.Arrays split over the batch axes of ``layout``.

    Each process passes its part of the input (see :func:`instantiate_input`).
    """
    hosts = infeed_split(layout)[0]

    def put(x: np.ndarray) -> jax.Array:
        global_shape = (x.shape[0] * hosts, *x.shape[1:])
        return jax.make_array_from_process_local_data(
            _leaf_sharding(layout, x.ndim), x, global_shape
        )

    return jax.tree_util.tree_map(put, batch)


def abstract_global(batch: NestedMap, layout: NamedSharding) -> NestedMap:
    """The global batch of a host-local one as sharded ShapeDtypeStructs (nothing allocated)."""
    hosts = infeed_split(layout)[0]

    def spec(x: np.ndarray) -> jax.ShapeDtypeStruct:
        global_shape = (x.shape[0] * hosts, *x.shape[1:])
        return jax.ShapeDtypeStruct(global_shape, x.dtype, sharding=_leaf_sharding(layout, x.ndim))

    return jax.tree_util.tree_map(spec, batch)


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree``'s arrays as global arrays held whole by every device of ``mesh``.

    Unlike ``jax.device_put``, this also works when ``mesh`` spans processes.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(lambda x: x, in_shardings=replicated, out_shardings=replicated)(tree)


def per_device_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded arrays or sharded ShapeDtypeStructs."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
    return total
