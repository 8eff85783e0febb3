"""A tiny mixture-of-experts LM against the dense LM of the same active FLOPs, on this CPU.

Three models of LmSyntheticTiny's shape (4 layers, D=64, T=32, batch 16, float32), trained
by the same jitted step (forward + backward of the loss plus the aux losses, no optimizer)
on the same synthetic batch, in alternating rounds in one process:

* ``dense``: HIDDEN_DIMS = 256;
* ``moe capacity``: every layer 8 experts of F = 128, GShard top-2 with capacity factor 2
  (praxis' routing: one group, dispatch and combine einsums over [G, S, E, C]);
* ``moe dropless``: the same experts, top-2 with nothing dropped (routes sorted by expert,
  grouped matmuls: ``praxis_lite.moe.dispatch``).

A token multiplies 2 experts of 2 x 64 x 128 weights: the dense layer's 2 x 64 x 256, plus
the router's 64 x 8. Prints, per model and round, ms/step, tokens/s and MFU of the model
FLOPs by definition (``causal``: active weights only; the dispatch is overhead) against
this CPU's calibrated matmul peak; then the medians and dropless / dense. Goal: dropless
>= 0.8x the dense model's tokens/s.

    python benchmarks/moe_speed.py [--rounds 5] [--steps 20] [--grouped-matmul ragged]

``--grouped-matmul ragged``: the dropless experts' grouped matmuls as ``jax.lax.ragged_dot``
(what accelerators run) instead of this platform's choice (``blocked`` on a CPU; see
``praxis_lite.moe.dispatch``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from paxlite.experiments.base_experiment import with_overrides  # noqa: E402
from paxlite.perf import mfu  # noqa: E402
from paxlite.perf.flops import achieved_flops  # noqa: E402
from praxis_lite import config as config_lib  # noqa: E402
from praxis_lite.base_layer import AUX_LOSS, summaries_and_aux_losses  # noqa: E402
from praxis_lite.moe import Dispatch  # noqa: E402
from praxis_lite.moe import dispatch as dispatch_lib  # noqa: E402
from praxis_lite.py_utils import NestedMap  # noqa: E402
from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyMoe  # noqa: E402

SHAPE = dict(NUM_LAYERS=4, MAX_SEQ_LEN=32, PERCORE_BATCH_SIZE=16)
MOE = dict(SHAPE, MOE_EVERY_N=1, NUM_EXPERTS=8, MOE_HIDDEN_DIMS=128)
MODELS = {
    "dense": (LmSyntheticTiny, dict(SHAPE, HIDDEN_DIMS=256)),
    "moe capacity": (LmSyntheticTinyMoe, dict(MOE, MOE_DISPATCH=Dispatch.CAPACITY)),
    "moe dropless": (LmSyntheticTinyMoe, dict(MOE, MOE_DISPATCH=Dispatch.DROPLESS)),
}


def _batch(batch: int, seq: int, vocab: int) -> NestedMap:
    ids = jnp.asarray(np.random.default_rng(0).integers(0, vocab, (batch, seq)), jnp.int32)
    return NestedMap(ids=ids, labels=jnp.roll(ids, -1, axis=1), weights=jnp.ones(ids.shape))


def build(name: str) -> tuple:
    """``(jitted step, params, batch, model FLOPs per step (causal))`` of model ``name``."""
    base, knobs = MODELS[name]
    experiment = with_overrides(base, knobs)()
    model = config_lib.instantiate(experiment.task().model)
    batch = _batch(16, experiment.MAX_SEQ_LEN, experiment.VOCAB_SIZE)
    params = jax.jit(lambda k: model.init(k, batch))(jax.random.key(0))["params"]

    def loss(p, batch):
        out, mutables = model.apply({"params": p}, batch, mutable=[AUX_LOSS])
        _, aux = summaries_and_aux_losses(mutables)
        return out.metrics["total_loss"][0] + aux

    step = jax.jit(jax.value_and_grad(loss))
    jax.block_until_ready(step(params, batch))  # Compile.
    flops = model.train_flops(batch).per_step(16)["causal"]
    return step, params, batch, flops


def time_steps(step, params, batch, steps: int) -> float:
    """Seconds per step over ``steps`` steps (after the compile)."""
    start = time.perf_counter()
    for _ in range(steps):
        out = step(params, batch)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / steps


def _mfu(flops: float, seconds: float, peak: mfu.Peak) -> float:
    """MFU of ``flops`` model FLOPs per step at ``seconds`` per step on one device."""
    return achieved_flops(flops, 1.0 / seconds, 1, peak).mfu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--grouped-matmul", choices=("blocked", "ragged"), default=None)
    args = parser.parse_args()
    if args.grouped_matmul == "ragged":
        dispatch_lib.BLOCKED_PLATFORMS = ()
    peak = mfu.calibrate()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; peak {peak.tflops:.4g} TFLOP/s")
    print(f"dropless grouped matmul: {dispatch_lib.grouped_matmul_kind()}")
    built = {name: build(name) for name in MODELS}
    times: dict[str, list[float]] = {name: [] for name in MODELS}
    tokens = 16 * SHAPE["MAX_SEQ_LEN"]
    for r in range(args.rounds):
        for name, (step, params, batch, flops) in built.items():
            seconds = time_steps(step, params, batch, args.steps)
            times[name].append(seconds)
            print(
                f"round {r + 1} {name:>13}: {1e3 * seconds:7.2f} ms/step "
                f"{tokens / seconds:9.0f} tokens/s MFU {100 * _mfu(flops, seconds, peak):5.2f}%"
            )
    medians = {name: statistics.median(t) for name, t in times.items()}
    print("median:")
    for name, seconds in medians.items():
        flops = built[name][3]
        print(
            f"  {name:>13}: {1e3 * seconds:7.2f} ms/step {tokens / seconds:9.0f} tokens/s "
            f"MFU {100 * _mfu(flops, seconds, peak):5.2f}% "
            f"({flops / 1e6:.1f} model MFLOP/step) = {medians['dense'] / seconds:.2f}x dense"
        )


if __name__ == "__main__":
    main()
