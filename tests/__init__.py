"""paxlite's tests: they mirror the source tree (tests/paxlite/formats/hf/test_models.py tests
paxlite/formats/hf/models.py); end-to-end runs, named by behaviour, are in tests/e2e/."""

import importlib.metadata
import pathlib

#: The repository root, and the fixtures every test reads from (whatever its depth).
REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def _cpu_codegen_flags() -> str:
    """XLA's CPU code generation in the suite's processes and every run they start.

    On jaxlib 0.10 (the Python 3.11 leg: the oldest jax supported) the classic fusion emitters
    and runtime, whose machine code compiles in about half the CPU time of the MLIR emitters
    and thunk runtime (the same HLO programs: XLA's passes, fusion and SPMD partitioning are
    unchanged; the suite went from 1957 to 1360 CPU-seconds). Later jaxlibs have only the
    newer ones (0.12 aborts on both flags): none.
    """
    major, minor = (int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2])
    if (major, minor) >= (0, 11):
        return ""
    return "--xla_cpu_use_fusion_emitters=false --xla_cpu_use_thunk_runtime=false"


#: Set by tests/conftest.py beside the device count; runs the tests start get it from
#: :func:`cpu_xla_flags`.
CPU_CODEGEN_FLAGS = _cpu_codegen_flags()


def cpu_xla_flags(devices: int) -> str:
    """XLA_FLAGS for a run the suite starts on ``devices`` fake CPU devices."""
    return f"--xla_force_host_platform_device_count={devices} {CPU_CODEGEN_FLAGS}".strip()
