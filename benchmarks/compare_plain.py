"""paxlite's train step against the simplest plain-JAX one (``plain_jax_lm``), same work.

    python -m benchmarks.compare_plain [--configs ref,vocab1024] [--rounds 5] [--json out.json]

Both sides train the same shape on the same data path: each reads its own
``Prefetcher`` of the experiment's training input (random tokens, made on a thread
and put on the device ahead of the step). The paxlite side is ``LmCloudSpmd2B``
shrunk with knobs (``PAXLITE_KNOBS``): its step as the training loop compiles it
(``train_setup.compile_train_step``). What paxlite does that the plain step does
not (sinusoidal positions added to the embeddings, the learned per-dim query scale,
the shared softmax's bias, feed-forward biases, gradient clipping, the learning-rate
schedule, the non-finite-step guard, the step's metrics) stays on: it is paxlite's
to make cheap. Both are compiled and warmed up, then timed in alternating rounds
(plain, paxlite, plain, ...) so that this machine's drift hits both alike. Prints
tokens/s of both (medians over rounds) and paxlite / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402

from benchmarks.paxlite_runner import PaxliteRunner, alternating_rounds  # noqa: E402
from benchmarks.plain_jax_lm import PlainRunner, Shape  # noqa: E402
from paxlite.experiments import base_experiment
from praxis_lite.layers.repeats import AutodiffCheckpointType  # noqa: E402
from tasks.lm.lm_cloud import LmCloudSpmd2B  # noqa: E402

#: name -> (shape, steps per round). "ref" is the issue's reference point.
CONFIGS = {
    "ref": (Shape(2, 256, 1024, 4, 64, 32000, 256, 8), 3),
    "vocab1024": (Shape(2, 256, 1024, 4, 64, 1024, 256, 8), 6),
}

#: LmCloudSpmd2B's knobs that make it the plain step's shape and dtype on one device.
PAXLITE_KNOBS = {
    "ICI_MESH_SHAPE": (1, 1, 1),
    "FPROP_DTYPE": jnp.float32,
    "EMBEDDING_LOOKUP_STYLE": "index",
    "CHECKPOINT_POLICY": AutodiffCheckpointType.NONE,
    "SOFTMAX_CAP_LOGITS": 0.0,
    "ATTEN_LOGIT_CAP": 0.0,
    "SUMMARY_INTERVAL_STEPS": 1_000_000,
}


def _experiment(shape: Shape) -> LmCloudSpmd2B:
    knobs = {
        **PAXLITE_KNOBS,
        "NUM_LAYERS": shape.num_layers,
        "MODEL_DIMS": shape.model_dims,
        "HIDDEN_DIMS": shape.hidden_dims,
        "NUM_HEADS": shape.num_heads,
        "DIMS_PER_HEAD": shape.dims_per_head,
        "VOCAB_SIZE": shape.vocab_size,
        "MAX_SEQ_LEN": shape.seq_len,
        "PERCORE_BATCH_SIZE": shape.batch,
    }
    return base_experiment.with_overrides(LmCloudSpmd2B, knobs)()


def compare(name: str, rounds: int) -> dict:
    shape, steps = CONFIGS[name]
    pax = PaxliteRunner(_experiment(shape))
    plain_batches = pax.prefetcher()
    plain = PlainRunner(shape, plain_batches.next)
    try:
        rates = alternating_rounds({"plain": plain, "paxlite": pax}, rounds, steps, warmup=2)
    finally:
        pax.close()
        plain_batches.close()
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
    parser.add_argument("--configs", default="ref,vocab1024")
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
