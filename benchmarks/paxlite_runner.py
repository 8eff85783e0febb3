"""paxlite's training-loop step for an experiment, held on one device and stepped on demand,
and the alternating rounds that time it against the plain-JAX step.

What ``benchmarks.compare_plain`` and ``benchmarks.gpu_mfu`` time against the plain-JAX step
(``benchmarks.plain_jax_lm.PlainRunner``, the same interface: ``run(steps)``,
``tokens_per_step``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from paxlite.experiments.base_experiment import BaseExperiment
from paxlite.runtime import partitioning
from paxlite.runtime.job import build_job
from paxlite.train import prefetch, train_setup


class PaxliteRunner:
    """paxlite's loop path for an experiment on one device, without checkpoints or
    summaries (they come at intervals)."""

    def __init__(self, exp: BaseExperiment):
        self.input_cfg = exp.datasets()[0]
        self.job = build_job(exp, exp.task(), [self.input_cfg], "/nonexistent", jax.devices()[:1])
        with self._scope():
            run = train_setup.init_or_restore(self.job, train_setup.StateSource.FRESH)
            self.state, self.key = run.state, run.train_key
            self.step_fn, self.compile_s = train_setup.compile_train_step(self.job, run)
        self.batches = self.prefetcher()
        self.tokens_per_step = self.input_cfg.batch_size * exp.MAX_SEQ_LEN
        self.step = 0

    def prefetcher(self) -> prefetch.Prefetcher:
        """A new reader of the job's training input, prefetched as the training loop does."""
        inp = partitioning.instantiate_input(self.input_cfg, self.job.batch_sharding)
        return prefetch.Prefetcher(inp, self.job.to_global)

    @contextlib.contextmanager
    def _scope(self) -> Iterator[None]:
        """The mesh and logical rules, as the training loop has them (only around our calls,
        so the plain step never runs under them)."""
        with self.job.scope():
            yield

    def run(self, steps: int) -> float:
        task = self.job.task
        with self._scope():
            for _ in range(steps):
                self.state, metrics = self.step_fn(self.state, self.batches.next(), self.key)
                self.step += 1
                if self.step % task.summary_interval_steps == 0:  # The loop's checks.
                    jax.device_get(metrics)
            return float(metrics["loss"])

    def close(self) -> None:
        self.batches.close()


def alternating_rounds(
    runners: Mapping[str, Any], rounds: int, steps: int, warmup: int
) -> dict[str, list[float]]:
    """``{label: [tokens/s of each round]}``: every runner takes ``warmup`` untimed steps
    (compilation), then ``rounds`` times each in turn takes ``steps`` timed steps, so the
    machine's drift hits all alike (``run`` waits for its last loss)."""
    for runner in runners.values():
        runner.run(warmup)
    rates: dict[str, list[float]] = {label: [] for label in runners}
    for _ in range(rounds):
        for label, runner in runners.items():
            start = time.perf_counter()
            runner.run(steps)
            rates[label].append(steps * runner.tokens_per_step / (time.perf_counter() - start))
    return rates
