"""Test setup (set before jax is imported): 8 fake CPU devices in every test process, XLA's
cheaper CPU code generation where the jaxlib has it (``tests.CPU_CODEGEN_FLAGS``: the runs
the tests start get it from ``tests.cpu_xla_flags``), and
JAX's persistent compilation cache shared by the test processes and the main.py runs they
start (the same tiny programs compile once per test run instead of once per main.py run).

The cache lives in a temporary directory this test run makes (the pytest-xdist workers and
the subprocesses inherit its path) and removes at the end: nothing outside the run's own
temporary directories is read or written, so a fresh machine sees what CI sees.
"""

import atexit
import os
import shutil
import tempfile

import pytest

from tests import CPU_CODEGEN_FLAGS

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags = f"{_flags} --xla_force_host_platform_device_count=8".strip()
if CPU_CODEGEN_FLAGS and "xla_cpu_use_fusion_emitters" not in _flags:
    _flags = f"{_flags} {CPU_CODEGEN_FLAGS}"
os.environ["XLA_FLAGS"] = _flags
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # The first process of the run makes it.
    _cache_dir = tempfile.mkdtemp(prefix="paxlite-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
    # Hypothesis's own caches (not its example database, which is off) go there too, not
    # into .hypothesis/ of the working directory.
    os.environ["HYPOTHESIS_STORAGE_DIRECTORY"] = os.path.join(_cache_dir, "hypothesis")
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
# XLA's backend (LLVM) optimizations off, in the test processes and the runs they start: the
# same HLO programs (XLA's own passes, fusion and SPMD partitioning all run), whose machine
# code compiles in about two thirds of the time (with a cheaper SeqIO emptiness check, the
# suite went from 1996 to 1589 CPU-seconds). Tests marked ``optimized`` compile as users'
# runs do (see ``_compiled_as_users_compile``).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
if os.environ.get("PAXLITE_TEST_COMPILE_STATS"):  # Opt-in: tests/compile_stats.py.
    from tests.compile_stats import record_into

    _write_compile_stats = record_into(os.environ["PAXLITE_TEST_COMPILE_STATS"])

    def pytest_sessionfinish(session):
        """Each pytest process's compile counts, as its session ends."""
        _write_compile_stats()


# End-to-end tests (whole training jobs, subprocesses, compiles for TPU slices: more than ~2 s
# each on the 2-core machine) carry ``@pytest.mark.slow``: ``-m "not slow"`` is the inner loop's
# tier. The heaviest modules (multi-process runs, storage faults, pipelines: minutes each) carry
# ``pytestmark = pytest.mark.runs_first`` (a test alone carries it where a module has one long one).
def pytest_collection_modifyitems(items):
    """The ``runs_first`` modules first, the rest as collected: the two workers end the run on
    short tests and neither waits alone on a long one. (Moving every module with a slow test
    ahead left one worker alone at the end, and tests moved apart from their module rebuilt its
    module-scoped fixtures: 18 to 21 minutes instead of 17.)"""
    items.sort(key=lambda item: item.get_closest_marker("runs_first") is None)


@pytest.fixture(autouse=True)
def _compiled_as_users_compile(request, monkeypatch):
    """For a test marked ``optimized``: XLA's backend optimizations on, in this process (its
    in-memory compiled programs dropped before and after) and in the runs it starts.

    The mark is for tests that assert bit-equality of two differently fused programs (which
    holds for optimized machine code, not for unoptimized) and for runs of many steps (where
    unoptimized steps cost more than the compile saves)."""
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    import jax

    before = jax.config.values["jax_disable_most_optimizations"]
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    jax.clear_caches()
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        jax.clear_caches()


@pytest.fixture(autouse=True)
def _temp_files_in_the_test_run(tmp_path_factory, monkeypatch):
    """The temporary files of the code under test (error reports, local copies of bucket
    summaries), in this process and in the runs it starts, go into a directory of this test
    run instead of the machine's temporary directory."""
    scratch = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))


@pytest.fixture
def libtpu_env(monkeypatch):
    """The variables a compile for a TPU topology sets for libtpu in its process
    (``paxlite.runtime.tpu_topology``), set here and restored after the test."""
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """fake-gcs-server on loopback with an empty bucket; this process's storage (and the
    environment the runs it starts inherit) pointed at it, then put back."""
    from paxlite.runtime import storage
    from tests.gcs import start_emulator

    url, server = start_emulator(tmp_path_factory.mktemp("emulator") / "log.txt")
    saved = dict(os.environ)
    os.environ["STORAGE_EMULATOR_HOST"] = url.removeprefix("http://")  # As users write it.
    storage.configure()
    yield url
    server.terminate()
    server.wait(timeout=10)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def faulty_gcs(emulator, monkeypatch):
    """A :class:`tests.gcs.FaultyGcs` in front of the emulator, where runs started by the test
    (and tensorstore, which reads its own variable) send their requests."""
    from tests.gcs import FaultyGcs

    with FaultyGcs(emulator) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.address)
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://{proxy.address}")
        yield proxy
