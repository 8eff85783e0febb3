"""Benchmark reports: figures that agree with each other, the files, main.py's mode, the sweep."""

import json
from importlib import metadata

import jax
import pytest

import paxlite
from paxlite.experiments import base_experiment
from paxlite.perf import bench, bench_report, bench_sweep
from paxlite.runtime.job import build_job
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import NO_INPUT_LIBRARIES, run_main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    knobs = {"ICI_MESH_SHAPE": (1, 2, 1), "PERCORE_BATCH_SIZE": 0.5}
    exp = base_experiment.with_overrides(LmSyntheticTiny, knobs)()
    job = build_job(
        exp, exp.task(), exp.datasets(), tmp_path_factory.mktemp("j"), jax.devices()[:2]
    )
    settings = bench.BenchSettings(steps=6, warmup=1, windows=3, peak_tflops=0.5)
    return bench.run_benchmark(job, settings)


@pytest.mark.slow
def test_figures_agree_with_each_other(figures):
    assert figures["timed_steps"] == 6 and len(figures["windows"]) == 3
    assert figures["tokens_per_step"] == 4 * 32 and figures["devices"]["num_devices"] == 2
    steps_per_sec = 6 / figures["timed_seconds"]
    assert figures["steps_per_sec"] == pytest.approx(steps_per_sec)
    assert figures["tokens_per_sec"] == pytest.approx(steps_per_sec * 128)
    assert figures["tokens_per_sec_per_device"] == pytest.approx(steps_per_sec * 64)
    causal = figures["by_definition"]["causal"]
    assert causal["flops_per_step"] == pytest.approx(638_976 * 128)  # see test_flops
    assert figures["tflops_per_sec_per_device"] == pytest.approx(
        steps_per_sec * causal["flops_per_step"] / 2 / 1e12
    )
    assert figures["mfu"] == pytest.approx(figures["tflops_per_sec_per_device"] / 0.5)
    assert figures["peak"]["source"] == "--peak_tflops"
    assert set(figures["by_definition"]) == {"6N", "palm", "causal", "xla"}
    assert figures["by_definition"]["xla"]["flops_per_step"] > causal["flops_per_step"]
    assert figures["versions"]["jax"] == jax.__version__
    # paxlite's own version, the one the installed package metadata carries too.
    assert figures["versions"]["paxlite"] == metadata.version("paxlite") == paxlite.__version__
    assert figures["compile_time_s"] > 0 and figures["time_to_first_step_s"] > 0


@pytest.mark.slow
def test_report_files(figures, tmp_path):
    paths = bench_report.write_report(figures, tmp_path)
    assert [p.name for p in paths] == ["benchmark.json", "benchmark.md", "benchmark.png"]
    assert json.loads(paths[0].read_text())["mfu"] == pytest.approx(figures["mfu"])
    md = paths[1].read_text()
    assert "| **MFU (causal)** |" in md and "| palm | `(6 * (N_blocks + D*V)" in md
    assert paths[2].read_bytes().startswith(PNG)


@pytest.mark.slow
def test_sweep_report_from_points(figures, tmp_path):
    wider = json.loads(json.dumps(figures))
    wider["devices"]["num_devices"], wider["mfu"] = 4, figures["mfu"] / 2
    sweep = bench_sweep.combine([figures, wider])
    assert [r["devices"] for r in sweep["rows"]] == [2, 4]
    paths = bench_sweep.write_report(sweep, tmp_path)
    assert [p.name for p in paths] == ["sweep.json", "sweep.md", "sweep.png"]
    assert paths[1].read_text().count("\n| ") == 3  # the separator row and two points
    assert paths[2].read_bytes().startswith(PNG)
    assert [bench_sweep.model_dims_for(n) for n in (1, 2, 4, 8)] == [64, 96, 128, 192]


@pytest.mark.slow
def test_main_benchmark_mode(tmp_path):
    job = tmp_path / "job"
    proc = run_main(
        f"--job_log_dir={job}",
        "--mode=benchmark",
        "--bench_steps=4",
        "--bench_warmup=1",
        "--mfu_definition=palm",
        report_imports=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Benchmark:" in proc.stdout and "MFU" in proc.stdout
    assert NO_INPUT_LIBRARIES in proc.stdout
    report = json.loads((job / "benchmark.json").read_text())
    assert report["mfu_definition"] == "palm" and report["timed_steps"] == 4
    assert report["peak"]["source"].startswith("calibrated")  # CPU: measured in this run
    assert (job / "benchmark.png").is_file() and not (job / "checkpoints").exists()
