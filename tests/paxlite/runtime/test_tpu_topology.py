"""Cloud TPU names -> libtpu topologies (compile-only devices), and what the TPU compiler says
about a chip's HBM. Needs libtpu (the [tpu] extra, installed by the README's test command)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlite.runtime import tpu_topology
from paxlite.runtime.tpu_topology import GIB, TopologyError

pytestmark = pytest.mark.usefixtures("libtpu_env")


@pytest.mark.parametrize(
    "name, generation, layout",
    [
        ("v4-8", "v4", (2, 2, 1)),  # v4 names count TensorCores: 8 cores = 4 chips.
        ("v4-128", "v4", (4, 4, 4)),
        ("v4-384", "v4", (4, 4, 12)),
        ("v5p-128", "v5p", (4, 4, 4)),
        ("v5e-256", "v5e", (16, 16)),  # v5e names count chips.
        ("v5litepod-16", "v5e", (4, 4)),  # Cloud's accelerator type for v5e.
        ("v6e-64", "v6e", (8, 8)),
        ("v4:2x2x1", "v4", (2, 2, 1)),  # libtpu's own form.
        ("V5E-4", "v5e", (2, 2)),
    ],
)
def test_cloud_names_map_to_chip_layouts(name, generation, layout):
    target = tpu_topology.parse(name)
    assert target.generation.name == generation and target.layout == layout
    assert target.num_devices == target.chips_per_slice


@pytest.mark.parametrize(
    "name, message",
    [
        ("v4-6", "no such v4 slice"),
        ("v5e-3", "no such v5e slice"),
        ("v9-8", "unknown TPU generation"),
        ("tpu", "is not a TPU name"),
    ],
)
def test_a_name_that_is_no_slice_says_what_exists(name, message):
    with pytest.raises(TopologyError, match=message):
        tpu_topology.parse(name)


def test_default_target_is_tpu_v4_with_one_chip_per_device():
    assert tpu_topology.default_target_name(4) == "v4-8"
    assert tpu_topology.default_target_name(64) == "v4-128"
    assert tpu_topology.default_target_name(1) == "v4:1x1x1"
    with pytest.raises(TopologyError, match="no TPU v4 slice has 24 chips"):
        tpu_topology.default_target_name(24)


@pytest.mark.parametrize("name, slices", [("v4-8", 1), ("v5e-4", 2), ("v4:1x1x1", 1)])
def test_devices_are_the_slices_chips(name, slices):
    target = tpu_topology.parse(name, num_slices=slices)
    devices = target.devices()
    assert len(devices) == target.num_devices == target.chips_per_slice * slices
    assert {d.platform for d in devices} == {"tpu"}
    assert sorted({getattr(d, "slice_index", 0) for d in devices}) == list(range(slices))
    assert target.generation.name in devices[0].device_kind.lower().replace(" lite", "e")


@pytest.mark.parametrize("name", ["v4-8", "v5p-8", "v5e-4", "v6e-4"])
def test_hbm_per_chip_is_the_compilers_and_close_to_the_documented_figure(name):
    target = tpu_topology.parse(name)
    hbm = tpu_topology.hbm_bytes_per_chip(target)
    documented = target.generation.documented_hbm_gib * GIB
    assert 0.9 * documented <= hbm <= documented  # The runtime reserves a little.
    # A program of just under that size compiles; one of just over is refused.
    mesh = Mesh(target.devices()[:1], ("x",))
    one_chip = NamedSharding(mesh, PartitionSpec())

    def compiles(num_bytes: int) -> bool:
        buffer = jax.ShapeDtypeStruct((num_bytes,), jnp.int8, sharding=one_chip)
        try:
            jax.jit(lambda x: x, donate_argnums=0).lower(buffer).compile()
        except jax.errors.JaxRuntimeError as e:
            assert tpu_topology.hbm_shortfall(e) is not None
            return False
        return True

    assert compiles(int(hbm * 0.9)) and not compiles(int(hbm * 1.1))


@pytest.mark.parametrize("donate, gib", [(False, 2), (True, 1)])
def test_the_hbm_the_compiler_assigns_is_the_programs_buffers(donate, gib):
    """x * 2 + 1 on a 1 GiB float32 array: its input and its output (one buffer when the
    input is donated), as the TPU compiler's buffer assignment places them on the chip."""
    target = tpu_topology.parse("v4-8")
    one_chip = NamedSharding(Mesh(target.devices()[:1], ("x",)), PartitionSpec())
    x = jax.ShapeDtypeStruct((GIB // 4,), jnp.float32, sharding=one_chip)
    step = jax.jit(lambda x: x * 2 + 1, donate_argnums=(0,) if donate else ())
    compiled, assigned = tpu_topology.compile_with_hbm_report(step.lower(x))
    assert assigned == gib * GIB
    assert compiled.memory_analysis().argument_size_in_bytes == GIB  # The same program.


def test_the_compilers_out_of_memory_messages_are_read():
    modern = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (45.00G) exceeds available HBM (15.75G)."
    )
    older = RuntimeError(
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
        "space hbm. Used 40.50G of 15.48G hbm. Exceeded hbm capacity by 25.02G."
    )
    assert tpu_topology.hbm_shortfall(modern) == (45 * GIB, int(15.75 * GIB))
    assert tpu_topology.hbm_shortfall(older) == (int(40.5 * GIB), int(15.48 * GIB))
    assert tpu_topology.hbm_shortfall(RuntimeError("INVALID_ARGUMENT: bad shape")) is None
