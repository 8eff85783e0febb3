"""paxlite's train step against the plain-JAX one (``plain_jax_lm``), same config, one process.

    python -m benchmarks.compare_plain [--configs tiny,ref,100m] [--rounds 5] [--json out.json]

For each config, both steps are compiled, warmed up, then timed in alternating
rounds (plain, paxlite, plain, ...) so that this machine's drift hits both
alike. The paxlite side runs the training loop's own path: the compiled step
(``train_setup.compile_train_step``), the prefetching input thread and the synthetic
random-token input; the plain side makes its random tokens on the host each
step and calls its jitted step. Prints tokens/s of both (medians over rounds)
and paxlite / plain.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections.abc import Iterator

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.plain_jax_lm import PlainRunner, Shape  # noqa: E402
from paxlite import base_experiment, partitioning, prefetch, train_setup  # noqa: E402
from paxlite.job import build_job  # noqa: E402
from praxis_lite import config as config_lib  # noqa: E402
from praxis_lite.synthetic_input import SyntheticLmInput  # noqa: E402
from tasks.lm.lm_cloud import LmCloudSpmd  # noqa: E402

#: name -> (shape, steps per round). "ref" is the issue's reference point.
CONFIGS = {
    "tiny": (Shape(2, 64, 256, 4, 64, 32, 16), 40),
    "ref": (Shape(2, 256, 1024, 4, 32000, 256, 8), 3),
    "100m": (Shape(10, 768, 3072, 12, 32000, 128, 4), 2),
}


class _PlainComparable(LmCloudSpmd):
    """The plain step's architecture as a paxlite experiment (sizes set per config)."""

    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 256
    NUM_HEADS = 4
    USE_REPEATED_LAYER = False
    FPROP_DTYPE = jnp.float32
    LR_COS_WARMUP = 100
    LEARNING_RATE = 1e-3
    PERCORE_BATCH_SIZE = 8
    SUMMARY_INTERVAL_STEPS = 1_000_000
    CHECKPOINT_EVERY_N_STEPS = 1_000_000

    def datasets(self):
        return [
            config_lib.Config(
                SyntheticLmInput,
                batch_size=int(self.PERCORE_BATCH_SIZE),
                seq_len=self.MAX_SEQ_LEN,
                vocab_size=self.VOCAB_SIZE,
                random_tokens=True,
            )
        ]


class PaxliteRunner:
    """paxlite's loop path, without checkpoints or summaries (they come at intervals)."""

    def __init__(self, shape: Shape):
        knobs = {
            "NUM_LAYERS": shape.num_layers,
            "MODEL_DIMS": shape.model_dims,
            "HIDDEN_DIMS": shape.hidden_dims,
            "NUM_HEADS": shape.num_heads,
            "VOCAB_SIZE": shape.vocab_size,
            "MAX_SEQ_LEN": shape.seq_len,
            "PERCORE_BATCH_SIZE": shape.batch,
        }
        exp = base_experiment.with_overrides(_PlainComparable, knobs)()
        self.job = build_job(exp, exp.task(), exp.datasets(), "/nonexistent", jax.devices()[:1])
        with self._scope():
            run = train_setup.init_or_restore(self.job, train_setup.StateSource.FRESH)
            self.state, self.key = run.state, run.train_key
            self.step_fn, self.compile_s = train_setup.compile_train_step(self.job, run)
        sharding = self.job.batch_sharding
        self.batches = prefetch.Prefetcher(
            self.job.train_input, lambda b: partitioning.to_global(b, sharding)
        )
        self.tokens_per_step = shape.batch * shape.seq_len
        self.step = 0

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


def compare(name: str, rounds: int) -> dict:
    shape, steps = CONFIGS[name]
    plain, pax = PlainRunner(shape), PaxliteRunner(shape)
    try:
        for runner in (plain, pax):  # Compile and warm up.
            runner.run(2)
        rates = {"plain": [], "paxlite": []}
        for _ in range(rounds):
            for label, runner in (("plain", plain), ("paxlite", pax)):
                start = time.perf_counter()
                runner.run(steps)
                seconds = time.perf_counter() - start
                rates[label].append(steps * runner.tokens_per_step / seconds)
    finally:
        pax.close()
    plain_rate = statistics.median(rates["plain"])
    pax_rate = statistics.median(rates["paxlite"])
    return {
        "config": name,
        "shape": shape.__dict__,
        "steps_per_round": steps,
        "rounds": rounds,
        "plain_tokens_per_sec": plain_rate,
        "paxlite_tokens_per_sec": pax_rate,
        "ratio": pax_rate / plain_rate,
        "rounds_tokens_per_sec": rates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="tiny,ref,100m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results = []
    print(f"{'config':8} {'plain tok/s':>12} {'paxlite tok/s':>14} {'paxlite/plain':>14}")
    for name in args.configs.split(","):
        r = compare(name, args.rounds)
        results.append(r)
        print(
            f"{name:8} {r['plain_tokens_per_sec']:12,.0f} {r['paxlite_tokens_per_sec']:14,.0f} "
            f"{r['ratio']:14.3f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
