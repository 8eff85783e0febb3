"""``--mode=compile --compile_topology=NAME``: the train step compiled by the TPU compiler for a
TPU slice on this CPU host; the report's per-chip figures are the compiled program's own."""

import json
import re

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from paxlite.perf import aot
from paxlite.runtime import tpu_topology
from paxlite.runtime.tpu_topology import GIB
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import REPO, main_in_process, run_main, run_main_in_process

pytestmark = pytest.mark.usefixtures("libtpu_env")
TWO_V5E_SLICES = [
    "--mode=compile",
    "--compile_topology=v5e-4",
    "--set=ICI_MESH_SHAPE=1,4,1",
    "--set=DCN_MESH_SHAPE=2,1,1",
]


def report_gib(report: str, label: str) -> float:
    """The GiB figure of one report row, e.g. ``XLA temp per chip``."""
    return float(re.search(rf"{label}:\s+([\d.]+) GiB", report).group(1))


@pytest.mark.slow
@pytest.mark.parametrize(
    "topology, ici, chips",
    [("v4-8", "1,4,1", 4), ("v4-16", "1,8,1", 8)],  # One host of 4 chips; two hosts.
)
def test_a_v4_slice_gets_the_batch_of_its_chips_and_a_fits_line(topology, ici, chips):
    result = run_main(  # Without the libtpu settings: the compile makes its own.
        "--mode=compile",
        f"--compile_topology={topology}",
        f"--set=ICI_MESH_SHAPE={ici}",
        devices=1,
        unset_env=("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"),
    )
    assert result.returncode == 0, result.stderr
    report = result.stdout
    # Each phase says when it starts and how long it took (a large model's compile: minutes).
    for phase in ("Abstract train state", "Lowering the train step", f"Compiling for {topology}"):
        (started,) = [x for x in report.splitlines() if x.startswith(phase) and x.endswith(" ...")]
        ended = report.index(started) + len(started)
        assert re.search(rf"\n{re.escape(started[:-4])}: \d+\.\d s\n", report[ended:])
    assert f"for {topology} ({chips} TPU v4 chips), mesh {{'replica': 1, 'data': {chips}," in report
    # The batch follows the target's chips (all its hosts), not the 1 CPU device this process
    # started with.
    assert f"global batch:           {LmSyntheticTiny.PERCORE_BATCH_SIZE * chips}\n" in report
    num_params = int(re.search(r"parameters:\s+([\d,]+)", report).group(1).replace(",", ""))
    # Data parallel: every chip holds all float32 parameters and Adam's two moments (+ count).
    assert report_gib(report, "params per chip") == pytest.approx(num_params * 4 / GIB, abs=1e-3)
    assert report_gib(report, "optimizer per chip") == pytest.approx(
        2 * num_params * 4 / GIB, abs=1e-3
    )
    used, capacity = map(float, re.search(r"\nfits: ([\d.]+) of ([\d.]+) GiB$", report).groups())
    # The verdict is the compiler's own buffer assignment: at least the state it holds, at
    # most memory_analysis's estimate of the whole program.
    assigned = report_gib(report, "HBM assigned per chip")
    assert used == pytest.approx(assigned, abs=0.01)
    state = report_gib(report, "params per chip") + report_gib(report, "optimizer per chip")
    assert state - 0.001 <= assigned <= report_gib(report, "program per chip") + 0.001
    assert capacity == pytest.approx(30.75, abs=0.5)  # A v4 chip's 32 GiB, less reservations.
    assert "TPU_WORKER_HOSTNAMES" not in result.stderr  # libtpu kept quiet.


@pytest.fixture
def compile_report():
    """The report of ``paxlite --mode=compile ARGS`` on LmSyntheticTiny, run in this process:
    for a target of 8 chips, as many as this process has CPU devices, so the batch follows
    the target as in a process of its own. The compile turns JAX's persistent compilation
    cache off (it cannot read compile-only executables back); it is turned back on after."""
    cache_was_on = jax.config.jax_enable_compilation_cache

    def report(*args: str) -> str:
        code, stdout, stderr = run_main_in_process(*args)
        assert code == 0, stderr
        return stdout

    yield report
    jax.config.update("jax_enable_compilation_cache", cache_was_on)
    compilation_cache.reset_cache()  # Checked afresh (it may have been checked while off).


def recorded(function, results: list):
    """``function``, appending what each call returns to ``results``."""

    def call(*args):
        results.append(function(*args))
        return results[-1]

    return call


@pytest.mark.slow
def test_two_v5e_slices_report_the_compiled_programs_own_memory(compile_report, monkeypatch):
    jobs, compiles = [], []  # The job the command built and the program it compiled.
    monkeypatch.setattr(aot, "build_compile_job", recorded(aot.build_compile_job, jobs))
    monkeypatch.setattr(
        tpu_topology,
        "compile_with_hbm_report",
        recorded(tpu_topology.compile_with_hbm_report, compiles),
    )
    report = compile_report(*TWO_V5E_SLICES)
    assert "for 2 x v5e-4 (8 TPU v5e chips), mesh {'replica': 2, 'data': 4, 'mdl': 1}" in report
    [job], [(compiled, assigned)] = jobs, compiles
    assert {d.slice_index for d in job.mesh.devices[0].flat} == {0}  # replica 0 = slice 0
    assert {d.slice_index for d in job.mesh.devices[1].flat} == {1}
    # The program the report is of, read with XLA's own memory_analysis.
    memory = compiled.memory_analysis()
    # The compiler's buffer assignment holds at least the arguments (the donated state and
    # the batch), and the report shows it.
    assert memory.argument_size_in_bytes <= assigned
    assert report_gib(report, "HBM assigned per chip") == pytest.approx(assigned / GIB, abs=1e-3)
    program = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
        + memory.generated_code_size_in_bytes
    )
    assert memory.alias_size_in_bytes > 0  # The donated state is counted once.
    assert report_gib(report, "XLA temp per chip") == pytest.approx(
        memory.temp_size_in_bytes / GIB, abs=1e-3
    )
    assert report_gib(report, "program per chip") == pytest.approx(program / GIB, abs=1e-3)
    assert re.search(r"\nfits: [\d.]+ of 15\.\d+ GiB$", report)


@pytest.mark.slow
def test_a_model_too_big_for_the_chips_does_not_fit_by_a_figure(compile_report):
    huge_vocabulary = ["--set=VOCAB_SIZE=16777216", "--set=MODEL_DIMS=1024"]  # 17B parameters.
    report = compile_report(*TWO_V5E_SLICES, *huge_vocabulary)
    assert "the TPU compiler refused the program" in report
    assert report_gib(report, "params per chip") == pytest.approx(17_189_327_360 * 4 / GIB, 1e-3)
    short, needed, capacity = map(
        float,
        re.search(
            r"\ndoes not fit by ([\d.]+) GiB \(needs ([\d.]+) of ([\d.]+) GiB per chip\)$", report
        ).groups(),
    )
    assert short == pytest.approx(needed - capacity, abs=0.01) and short > 100


#: Pax's own train steps compiled by the TPU compiler (tools/pax_fixtures/tpu_memory).
PAX_TPU_MEMORY = REPO / "tests" / "fixtures" / "pax" / "tpu_memory.json"


@pytest.mark.slow
@pytest.mark.runs_first  # The suite's longest compile (~1 min, multi-threaded): not last.
@pytest.mark.parametrize("name", ["LmCloudSpmd32B", "LmCloudSpmd512B"])
def test_what_the_compiler_refuses_of_pax_needs_no_more_here(name):
    """Pax's own program for these does not fit its v4 slice (paxml 1.4.0's step, compiled by
    the same libtpu); ours needs at most what Pax's needs: refused too but close to Pax's
    figure (512B), or fitting (32B, whose loss keeps no float32 logits)."""
    pax = json.loads(PAX_TPU_MEMORY.read_text())[f"paxml.tasks.lm.params.lm_cloud.{name}"]
    assert not pax["compiled"]
    report = run_main(
        "--mode=compile",
        "--compile_topology=target",
        "--set=ATTENTION_IMPL=einsum",  # Pax's program attends with einsums too.
        exp=f"tasks.lm.lm_cloud.{name}",
    ).stdout
    assert f"parameters:             {pax['num_params']:,}\n" in report
    assert f"global batch:           {pax['global_batch']}\n" in report
    refused = "the TPU compiler refused the program" in report
    pattern = (
        r"needs ([\d.]+) of ([\d.]+) GiB per chip" if refused else r"fits: ([\d.]+) of ([\d.]+) GiB"
    )
    needed, capacity = map(float, re.search(pattern, report).groups())
    assert capacity == pytest.approx(pax["hbm_bytes_per_chip"] / GIB, abs=0.01)
    pax_needs = pax["hbm_assigned_bytes_per_chip"] / GIB
    assert needed <= pax_needs
    assert refused == (name == "LmCloudSpmd512B")
    if refused:
        assert 0.95 * pax_needs <= needed


@pytest.mark.slow
def test_target_compiles_for_the_experiments_tpu_target(compile_report):
    report = compile_report(
        "--mode=compile",
        "--compile_topology=target",
        "--set=TPU_TARGET=v5e-8",
        "--set=ICI_MESH_SHAPE=1,8,1",
    )
    assert "for v5e-8 (8 TPU v5e chips)" in report and "\nfits: " in report


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--mode=compile", "--compile_topology=v4-16", "--set=ICI_MESH_SHAPE=1,4,1"],
            "ICI_MESH_SHAPE (1, 4, 1) needs 4 devices, but v4-16 (8 TPU v4 chips) has 8",
        ),
        (["--mode=compile", "--compile_topology=v4-6"], "Cloud TPU has no such v4 slice"),
        (["--mode=compile", "--compile_topology=v9-8"], "unknown TPU generation"),
        (["--mode=compile", "--compile_topology=h100-8"], "is not a TPU name"),
        (["--compile_topology=v4-8"], "--compile_topology sizes a job for a TPU slice: add"),
        (
            ["--mode=compile", "--compile_topology_num_slices=2"],
            "--compile_topology_num_slices needs --compile_topology=NAME",
        ),
    ],
)
def test_a_wrong_topology_is_one_line(args, message):
    code, stderr = main_in_process(*args)
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("paxlite: error: ")
    assert message in stderr


def test_every_registered_experiment_has_a_target_matching_its_mesh():
    from paxlite.experiments import registry

    registry._import_package_modules("tasks")
    for name, cls in registry.get_all().items():
        target = aot.compile_target(cls, aot.EXPERIMENT_TARGET, None)
        assert target.num_devices >= 1, name
    pax_named = {
        "tasks.lm.c4.C4Spmd1BAdam4Replicas": "v4-8 (4 TPU v4 chips)",
        "tasks.lm.c4.C4Spmd16BAdam32Replicas": "v4-64 (32 TPU v4 chips)",
        "tasks.lm.c4.C4SpmdPipelineGpt3SmallAdam64Replicas": "v4-128 (64 TPU v4 chips)",
        "tasks.lm.c4_multislice.C4Spmd22BAdam2xv4_128": "2 x v4-128 (128 TPU v4 chips)",
        "tasks.lm.c4_multislice.C4Spmd22BAdam1xv4_384": "v4-384 (192 TPU v4 chips)",
        "tasks.lm.c4_multislice.C4Spmd32BAdam2xv5_256": "2 x v5p-256 (256 TPU v5p chips)",
        "tasks.lm.c4_multislice.C4SpmdGpt3AdamDataParallel2x16x16": (
            "2 x v5e-256 (512 TPU v5e chips)"
        ),
        "tasks.lm.lm_cloud.LmCloudSpmd64B": "v4-256 (128 TPU v4 chips)",  # The v4 default.
    }
    for name, described in pax_named.items():
        cls = registry.get(name)
        assert aot.compile_target(cls, aot.EXPERIMENT_TARGET, None).describe() == described
