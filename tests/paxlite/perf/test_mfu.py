"""Peaks (table, override, CPU calibration) and the rates of the progress line."""

import time

import jax
import jax.numpy as jnp
import pytest

from paxlite.perf import flops, mfu
from paxlite.train import summaries
from praxis_lite.flops import FlopsDefinition


@pytest.mark.parametrize(
    "kind, dtype, expected",
    [
        ("TPU v4", jnp.bfloat16, 275.0),
        ("TPU v5 lite", jnp.bfloat16, 197.0),
        ("TPU v5p", jnp.float32, 459.0),
        ("TPU v6 lite", jnp.bfloat16, 918.0),
        ("NVIDIA A100-SXM4-80GB", jnp.bfloat16, 312.0),
        ("NVIDIA A100-SXM4-40GB", jnp.float32, 156.0),
        ("NVIDIA H100 80GB HBM3", jnp.bfloat16, 989.0),
        ("NVIDIA H100 PCIe", jnp.bfloat16, 756.0),
        ("NVIDIA H200", jnp.float32, 494.5),
    ],
)
def test_peak_table_by_device_kind(kind, dtype, expected):
    assert mfu.table_peak(kind, dtype)[1] == expected


def test_unknown_device_has_no_table_entry():
    assert mfu.table_peak("cpu", jnp.float32) is None


def test_calibration_measures_every_time_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    figures = iter([0.8, 1.6])
    calls = []

    def fake_measure(dtype, device=None):
        calls.append(dtype)
        return next(figures)

    monkeypatch.setattr(mfu, "measure_matmul_tflops", fake_measure)
    first = mfu.calibrate(jnp.float32)
    # 8 fake CPU devices share the machine: the peak per device is an eighth.
    assert first.tflops == pytest.approx(0.1) and first.source.startswith("calibrated")
    assert mfu.peak_for(jnp.float32).tflops == pytest.approx(0.2)  # measured again, not cached
    assert len(calls) == 2 and list(tmp_path.rglob("*")) == []
    assert mfu.peak_for(jnp.float32, override_tflops=2.5).tflops == 2.5
    assert mfu.peak_for(jnp.float32, override_tflops=2.5).source == "--peak_tflops"
    assert len(calls) == 2


def test_calibration_runs_outside_and_inside_a_set_mesh():
    """The measurement places its operand itself: a job's mesh being set does not matter."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        assert mfu.measure_matmul_tflops(jnp.float32, size=128, repeats=2) > 0


def test_matmul_measurement_is_plausible():
    tflops = mfu.measure_matmul_tflops(jnp.float32, size=256, repeats=3)
    assert 1e-4 < tflops < 100  # A CPU core does somewhere between 0.1 and 100000 GFLOP/s.


def test_rates_of_a_window():
    cost = flops.StepCost(
        definition=FlopsDefinition.CAUSAL,
        analytic_flops={"6N": 1e12, "palm": 3e12, "causal": 2e12},
        xla_flops=4e12,
        xla_flops_note="",
        peak=mfu.Peak(tflops=1.0, source="test", device_kind="x", dtype="float32"),
        num_devices=4,
        global_batch=8,
        seq_len=128,
    )
    rates = summaries.rates(steps=10, seconds=5.0, tokens_per_step=1024, cost=cost)
    assert rates["steps_per_sec"] == 2.0 and rates["step_time_ms"] == 500.0
    assert rates["tokens_per_sec"] == 2048 and rates["tokens_per_sec_per_device"] == 512
    # 2 steps/s x 2 TFLOP (causal) / 4 devices = 1 TFLOP/s per device = 100% of a 1 TFLOP/s peak.
    assert rates["tflops_per_sec_per_device"] == pytest.approx(1.0)
    assert rates["mfu"] == pytest.approx(1.0)
    progress = summaries.Progress(0, 100, cost)
    line = progress.line(10, 1.5, rates)
    assert "500.0 ms/step" in line and "MFU 100.00% (causal)" in line and "tokens/s" in line


def test_time_spent_paused_is_left_out_of_the_rates():
    progress = summaries.Progress(0, 100)
    progress.start_window(0)
    time.sleep(0.05)  # Two "steps" ...
    with progress.paused():
        time.sleep(0.5)  # ... and an eval that must not count.
    rates = progress.report(2, tokens_per_step=1.0)
    assert 25 <= rates["step_time_ms"] < 200
