"""Peaks (table, override, cached CPU calibration) and the rates of the progress line."""

import json
import time

import jax.numpy as jnp
import pytest

from paxlite import flops, mfu, summaries


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


def test_calibration_is_cached_and_bypassable(tmp_path, monkeypatch):
    monkeypatch.setenv(mfu.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(mfu.NO_CACHE_ENV, raising=False)
    calls = []
    monkeypatch.setattr(
        mfu, "measure_matmul_tflops", lambda dtype, device=None: calls.append(dtype) or 0.8
    )
    first = mfu.calibrate(jnp.float32)
    # 8 fake CPU devices share the machine: the peak per device is an eighth.
    assert first.tflops == pytest.approx(0.1) and "calibrated" in first.source
    (cached,) = tmp_path.glob("peak-*.json")
    assert json.loads(cached.read_text())["tflops"] == pytest.approx(0.1)
    again = mfu.calibrate(jnp.float32)
    assert again.tflops == pytest.approx(0.1) and "cached" in again.source and len(calls) == 1
    mfu.calibrate(jnp.float32, use_cache=False)
    monkeypatch.setenv(mfu.NO_CACHE_ENV, "1")
    mfu.calibrate(jnp.float32)
    assert len(calls) == 3
    assert mfu.peak_for(jnp.float32, override_tflops=2.5).tflops == 2.5
    assert mfu.peak_for(jnp.float32, override_tflops=2.5).source == "--peak_tflops"


def test_matmul_measurement_is_plausible():
    tflops = mfu.measure_matmul_tflops(jnp.float32, size=256, repeats=3)
    assert 1e-4 < tflops < 100  # A CPU core does somewhere between 0.1 and 100000 GFLOP/s.


def test_rates_of_a_window():
    cost = mfu.StepCost(
        definition=flops.FlopsDefinition.CAUSAL,
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
