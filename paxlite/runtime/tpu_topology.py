"""Cloud TPU slices by name (``v4-8``, ``v5e-256``, ...) as compile-only devices.

With libtpu installed (the ``[tpu]`` extra), ``jax.experimental.topologies`` describes a
TPU slice on any host, TPU or not: its devices carry the slice's physical layout, and a
program lowered on a mesh of them is compiled by the TPU compiler, which also says how much
HBM a chip has. Nothing here runs on a TPU.

Cloud TPU's accelerator names count TensorCores for v4 and v5p (two per chip; JAX sees one
device per chip, "megacore") and chips for v5e and v6e. A libtpu topology name
(``v4:2x2x1``, ``v5e:16x16``) is accepted as well, for shapes Cloud TPU has no name for.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
import tempfile
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

GIB = 2**30

#: Physical chip layouts of the slices Cloud TPU sells, by chips per slice.
_SHAPES_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    192: "4x4x12",
    256: "4x8x8",
    384: "4x8x12",
    512: "8x8x8",
    768: "8x8x12",
    1024: "8x8x16",
    1536: "8x12x16",
    2048: "8x16x16",
    3072: "12x16x16",
    4096: "16x16x16",
}
_SHAPES_2D = {
    1: "1x1",
    4: "2x2",
    8: "2x4",
    16: "4x4",
    32: "4x8",
    64: "8x8",
    128: "8x16",
    256: "16x16",
}


class TopologyError(ValueError):
    """A topology name, slice count or mesh that does not describe a TPU target."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU generation.

    Attributes:
      name: Cloud TPU's prefix ('v4', 'v5p', 'v5e', 'v6e').
      libtpu_name: libtpu's prefix of a topology name.
      cores_per_chip_in_name: 2 where accelerator names count TensorCores (v4, v5p).
      shapes: chips per slice -> physical layout, for Cloud TPU's names.
      documented_hbm_gib: HBM per chip per Cloud TPU's documentation, used only when the
        TPU compiler does not say (see :func:`hbm_bytes_per_chip`).
    """

    name: str
    libtpu_name: str
    cores_per_chip_in_name: int
    shapes: dict[int, str]
    documented_hbm_gib: float


GENERATIONS = {
    g.name: g
    for g in (
        Generation("v4", "v4", 2, _SHAPES_3D, 32.0),
        Generation("v5p", "v5p", 2, _SHAPES_3D, 96.0),  # Cloud TPU says "95 GB"...
        Generation("v5e", "v5e", 1, _SHAPES_2D, 16.0),
        Generation("v6e", "v6e", 1, _SHAPES_2D, 32.0),
    )
}
#: Other spellings of a generation in accelerator names (Cloud's v5e type is v5litepod-N).
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6lite": "v6e"}


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """``num_slices`` TPU slices of one shape, as a compile-only target.

    Attributes:
      name: what the user wrote (``v4-8``) or the libtpu form (``v4:1x1x1``).
      generation: the chip generation.
      layout: chips along each physical axis, e.g. (2, 2, 1).
      num_slices: slices joined over the data-center network (DCN).
    """

    name: str
    generation: Generation
    layout: tuple[int, ...]
    num_slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.layout)

    @property
    def num_devices(self) -> int:
        """JAX devices of the target: one per chip, over all slices."""
        return self.chips_per_slice * self.num_slices

    def describe(self) -> str:
        """E.g. ``2 x v5e-256 (512 TPU v5e chips)``."""
        slices = f"{self.num_slices} x " if self.num_slices > 1 else ""
        chips = "chip" if self.num_devices == 1 else "chips"
        return f"{slices}{self.name} ({self.num_devices} TPU {self.generation.name} {chips})"

    def devices(self) -> list[Any]:
        """The target's devices (compile-only: no program runs on them)."""
        return list(_topology(self).devices)


def parse(name: str, num_slices: int = 1) -> TpuTarget:
    """The target a Cloud TPU accelerator name (or libtpu topology name) describes.

    Raises:
      TopologyError: an unknown generation or size, or ``num_slices`` < 1.
    """
    if num_slices < 1:
        raise TopologyError(f"--compile_topology_num_slices={num_slices}: give 1 or more slices.")
    text = name.strip().lower()
    libtpu = re.fullmatch(r"(v\w+?):(\d+(?:x\d+)+)", text)
    if libtpu:
        generation = _generation(libtpu.group(1), name)
        layout = tuple(int(n) for n in libtpu.group(2).split("x"))
        return TpuTarget(text, generation, layout, num_slices)
    cloud = re.fullmatch(r"(v\w+?)-(\d+)", text)
    if not cloud:
        raise TopologyError(f"--compile_topology={name!r} is not a TPU name; {_examples()}.")
    generation = _generation(cloud.group(1), name)
    count = int(cloud.group(2))
    chips, odd = divmod(count, generation.cores_per_chip_in_name)
    if odd or chips not in generation.shapes:
        sizes = ", ".join(
            f"{generation.name}-{c * generation.cores_per_chip_in_name}" for c in generation.shapes
        )
        raise TopologyError(
            f"--compile_topology={name!r}: Cloud TPU has no such {generation.name} slice; "
            f"known sizes: {sizes} (or a libtpu layout such as {generation.libtpu_name}:2x2x1)."
        )
    layout = tuple(int(n) for n in generation.shapes[chips].split("x"))
    return TpuTarget(f"{generation.name}-{count}", generation, layout, num_slices)


def default_target_name(devices_per_slice: int) -> str:
    """TPU v4 with one chip per mesh device (the generation of Pax's published runs).

    Raises:
      TopologyError: no v4 slice has that many chips.
    """
    v4 = GENERATIONS["v4"]
    if devices_per_slice in v4.shapes:
        return f"v4-{2 * devices_per_slice}"
    if devices_per_slice in (1, 2):  # Smaller than any Cloud v4 slice: a libtpu layout.
        return f"v4:{devices_per_slice}x1x1"
    raise TopologyError(
        f"no TPU v4 slice has {devices_per_slice} chips; set the experiment's TPU_TARGET "
        "(e.g. --set TPU_TARGET=v5e-256) or pass a topology name."
    )


def check_mesh(target: TpuTarget, mesh_devices: int, mesh_text: str) -> None:
    """Raises TopologyError unless the experiment's mesh has one device per target chip."""
    if mesh_devices != target.num_devices:
        raise TopologyError(
            f"{mesh_text} needs {mesh_devices} devices, but {target.describe()} has "
            f"{target.num_devices} (one per chip); pick a topology of {mesh_devices} chips or "
            "set the mesh shapes to match (--set ICI_MESH_SHAPE=... / DCN_MESH_SHAPE=...)."
        )


def _prepare_libtpu_environment(target: TpuTarget) -> None:
    """Settings for libtpu as a compiler only (user settings win): no lock on the TPU
    chips (this process never runs on them, and others, a training job among them, may
    hold them), and the accelerator this host pretends to be, so that a host without TPUs
    does not print warnings about unset TPU variables."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", target.name if "-" in target.name else "v4-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


_HBM_PATTERNS = (  # The TPU compiler's out-of-memory messages: (needed, available).
    re.compile(
        r"required for [^(]*\(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"
    ),
    re.compile(r"Used ([\d.]+)([KMGT]) of ([\d.]+)([KMGT]) hbm"),
)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def hbm_shortfall(error: Exception) -> tuple[int, int] | None:
    """``(bytes needed, bytes available)`` per chip from a TPU out-of-memory compile error,
    or None when ``error`` is not one."""
    for pattern in _HBM_PATTERNS:
        found = pattern.search(str(error))
        if found:
            need, need_unit, have, have_unit = found.groups()
            return int(float(need) * _UNITS[need_unit]), int(float(have) * _UNITS[have_unit])
    return None


_DEFAULT_SPACE_TOTAL = re.compile(r"Memory Space: default \(color=0\)\nTotal bytes: (\d+)")


def compile_with_hbm_report(lowered: Any) -> tuple[Any, int | None]:
    """``(compiled, bytes)``: ``lowered`` compiled, and the HBM one chip needs for it as the
    TPU compiler's own buffer assignment places it (arguments, outputs and temporaries in
    HBM's default memory space), None if the compiler wrote no report.

    This is the figure the compiler checks against the chip's HBM: a program over it is
    refused with this number ("total memory required for HLO temporaries (N) exceeds
    available HBM"). ``memory_analysis()`` on a TPU executable is an estimate that can be
    well above it (C4Spmd22BAdam2xv4_128 on two v4-128: 32.0 GiB estimated, 23.1 assigned). The
    report is XLA's ``*memory-usage-report.txt``, written into a temporary dump directory.
    """
    with tempfile.TemporaryDirectory(prefix="paxlite-hbm-report-") as dump:
        compiled = lowered.compile(compiler_options={"xla_dump_to": dump})
        return compiled, assigned_hbm_bytes(dump)


def assigned_hbm_bytes(dump_dir: str | os.PathLike) -> int | None:
    """HBM bytes per chip in the TPU compiler's buffer assignment (its default memory space),
    from the memory-usage report XLA wrote into ``dump_dir`` (``xla_dump_to``); None if none."""
    totals = [
        int(found.group(1))
        for report in pathlib.Path(dump_dir).glob("*memory-usage-report.txt")
        if (found := _DEFAULT_SPACE_TOTAL.search(report.read_text()))
    ]
    return max(totals, default=None)


def hbm_bytes_per_chip(target: TpuTarget) -> int:
    """The HBM one chip offers a program, as the TPU compiler counts it (what is left after
    the runtime's reservations), read from its answer to a program that cannot fit; Cloud
    TPU's documented HBM if the compiler's message cannot be read."""
    device = target.devices()[0]
    replicated = NamedSharding(Mesh([device], ("x",)), PartitionSpec())
    too_big = jax.ShapeDtypeStruct((2**40,), jnp.int8, sharding=replicated)
    try:
        jax.jit(lambda x: x + 1).lower(too_big).compile()
    except jax.errors.JaxRuntimeError as e:  # The compiler's refusal is the answer.
        shortfall = hbm_shortfall(e)
        if shortfall is not None:
            return shortfall[1]
    return int(target.generation.documented_hbm_gib * GIB)


def _topology(target: TpuTarget) -> Any:
    from jax.experimental import topologies

    _prepare_libtpu_environment(target)
    options: dict[str, Any] = {}
    if target.generation.cores_per_chip_in_name == 2:
        options["chip_config_name"] = "megacore"  # One JAX device per chip.
    if target.chips_per_slice < 4:  # Smaller than the default host (2x2x1 chips).
        options["chips_per_host_bounds"] = _padded(target.layout)
    topology_name = f"{target.generation.libtpu_name}:{'x'.join(map(str, target.layout))}"
    try:
        return topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology_name,
            num_slices=target.num_slices,
            **options,
        )
    except RuntimeError as e:  # JaxRuntimeError too.
        if "not installed" in str(e):
            raise TopologyError(
                "--compile_topology needs libtpu (it compiles for TPUs on any host): "
                "pip install 'paxlite[tpu]'."
            ) from e
        raise TopologyError(f"libtpu has no topology {topology_name}: {_first_line(e)}") from e


def _padded(layout: Sequence[int]) -> tuple[int, ...]:
    return tuple(layout) + (1,) * (3 - len(layout))


def _generation(prefix: str, name: str) -> Generation:
    generation = GENERATIONS.get(_ALIASES.get(prefix, prefix))
    if generation is None:
        raise TopologyError(f"--compile_topology={name!r}: unknown TPU generation; {_examples()}.")
    return generation


def _examples() -> str:
    return (
        "use a Cloud TPU name (v4-8, v5p-128, v5e-256, v6e-64: v4/v5p count TensorCores, "
        "v5e/v6e chips), a libtpu layout (v4:2x2x1) or 'target' (the experiment's TPU_TARGET)"
    )


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
