"""The train step compiles once, before the loop: no compilation happens while steps run."""

import jax
import pytest

from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job
from paxlite.train import prefetch, train_loop
from tasks.lm.synthetic import LmSyntheticTiny


@pytest.mark.slow
def test_nothing_compiles_during_the_steps(tmp_path, monkeypatch):
    knobs = {
        "ICI_MESH_SHAPE": (1, 2, 1),
        "NUM_TRAIN_STEPS": 30,
        "SUMMARY_INTERVAL_STEPS": 5,
        "CHECKPOINT_EVERY_N_STEPS": 10,
        "PERCORE_BATCH_SIZE": 0.5,
    }
    exp = base_experiment.with_overrides(LmSyntheticTiny, knobs)()
    job = build_job(exp, exp.task(), exp.datasets()[:1], tmp_path / "job", jax.devices()[:2])

    batches_taken = [0]
    take = prefetch.Prefetcher.next

    def counting_next(self):
        batches_taken[0] += 1
        return take(self)

    monkeypatch.setattr(prefetch.Prefetcher, "next", counting_next)
    # Every compilation must really happen here (not come from the persistent cache).
    jax.config.update("jax_enable_compilation_cache", False)
    compiles = []  # The number of batches the loop had taken at each compilation.

    def on_duration(name: str, secs: float, **_: object) -> None:
        if "backend_compile" in name:
            compiles.append(batches_taken[0])

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        result = train_loop.run(job)
    finally:  # Only this listener: others (tests/compile_stats.py) stay.
        jax.monitoring.unregister_event_duration_listener(on_duration)
        jax.config.update("jax_enable_compilation_cache", True)
    assert batches_taken[0] == 30 and result.history[-1][0] == 30
    assert compiles and compiles[0] == 0  # init and the train step compile before the loop
    # Checkpoint saves and summaries may compile small helpers once (at their first use);
    # the steps themselves never do, so nothing compiles after the first save's step.
    assert [c for c in compiles if c > 10] == [], compiles
