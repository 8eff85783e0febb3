"""Pipeline bubble: measured step time against the theoretical bubble fraction.

Runs the pipelined stack (forward and backward, jitted, sharded over a 'stage'
mesh axis) for a few microbatch counts M at a fixed microbatch size, GPipe and
circular, and prints per configuration:

* step time (median of several steps, after compiling);
* the theoretical bubble: ``(S - 1) / (R M + S - 1)`` (R = 1 for GPipe);
* the measured bubble: ``1 - M t_mb / T(M)``, where ``t_mb`` is the time one
  microbatch costs (the slope of ``T`` over ``M`` in a least-squares fit of the
  GPipe runs). In this SPMD design every stage computes in every iteration (the
  bubble runs on placeholder data), so the bubble shows up as the extra
  ``S - 1`` iterations of the scan.

Usage (8 fake CPU devices unless XLA_FLAGS says otherwise)::

    python benchmarks/pipeline_bubble.py [--stages 4] [--layers 8] [--dims 64]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from praxis_lite import instantiate  # noqa: E402
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined  # noqa: E402
from praxis_lite.layers.repeats import AutodiffCheckpointType  # noqa: E402
from praxis_lite.sharding import (  # noqa: E402
    DEFAULT_RULES,
    filter_rules_for_mesh,
    logical_shardings,
    strip_boxes,
)


def step_time(
    mesh: Mesh, stages: int, repeat: int, microbatches: int, args: argparse.Namespace
) -> float:
    """Median seconds of one jitted forward+backward of the pipelined stack."""
    cfg = LayerwiseShardablePipelined.HParams.config(
        num_stages=stages, circular_repeat=repeat, microbatch_size=args.microbatch_size
    )
    cfg.stage_tpl.num_layers = args.layers // (stages * repeat)
    cfg.stage_tpl.checkpoint_policy = AutodiffCheckpointType.SAVE_NOTHING
    block = cfg.stage_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads = args.dims, 4 * args.dims, 4
    pipe = instantiate(cfg)
    batch = microbatches * args.microbatch_size
    x = jax.random.normal(jax.random.key(1), (batch, args.seq, args.dims))
    rules = filter_rules_for_mesh(DEFAULT_RULES, mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(pipe.init, jax.random.key(0), x)
        shardings = strip_boxes(logical_shardings(abstract, mesh, rules))
        params = jax.jit(lambda k: nn.unbox(pipe.init(k, x)), out_shardings=shardings)(
            jax.random.key(0)
        )
        x = jax.device_put(x, NamedSharding(mesh, PartitionSpec(("replica", "data"))))
        grad = jax.jit(jax.grad(lambda p, x: jnp.mean(pipe.apply(p, x) ** 2)))
        compiled = grad.lower(params, x).compile()
        jax.block_until_ready(compiled(params, x))
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, x))
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--microbatch_size", type=int, default=2)
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--circular_repeat", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    s = args.stages
    devices = np.array(jax.devices())
    mesh = Mesh(devices.reshape(s, 1, len(devices) // s, 1), ("stage", "replica", "data", "mdl"))
    print(
        f"{len(devices)} {devices[0].platform} devices, mesh {dict(mesh.shape)}; {args.layers} "
        f"layers of d={args.dims}, seq {args.seq}, microbatch {args.microbatch_size}; "
        "forward+backward"
    )
    runs = []
    for r in (1, args.circular_repeat):
        for m in args.microbatches:
            if r > 1 and m < s:
                continue
            runs.append((r, m, step_time(mesh, s, r, m, args)))
    gpipe = [(m, t) for r, m, t in runs if r == 1]
    t_mb, _ = np.polyfit([m for m, _ in gpipe], [t for _, t in gpipe], 1)
    print(f"time per microbatch (slope of GPipe step times): {t_mb * 1e3:.2f} ms")
    header = ("schedule", "M", "iters", "step ms", "bubble theory", "measured")
    print("{:>12} {:>4} {:>6} {:>9} {:>14} {:>9}".format(*header))
    for r, m, t in runs:
        iters = r * m + s - 1
        theory = (s - 1) / iters
        measured = 1 - m * t_mb / t
        name = "GPipe" if r == 1 else f"circular R={r}"
        print(f"{name:>12} {m:>4} {iters:>6} {t * 1e3:>9.2f} {theory:>14.3f} {measured:>9.3f}")


if __name__ == "__main__":
    main()
