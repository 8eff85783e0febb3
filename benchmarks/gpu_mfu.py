"""MFU on one NVIDIA GPU, in one command: a Llama-style 1B, Llama-3-8B with LoRA, and plain JAX.

    python -m benchmarks.gpu_mfu --out /tmp/gpu_mfu            # a GPU machine
    python -m benchmarks.gpu_mfu --cpu --out /tmp/gpu_mfu      # tiny shapes on a CPU

Three measurements, each the training path ``--mode=benchmark`` times
(``paxlite.perf.bench.run_benchmark`` on ``tasks.lm.hf_synthetic.HfSyntheticLm``: random
weights from a config.json, synthetic token rows, nothing downloaded), in one process:

1. ``llama_1b``: Llama-3.2-1B's shape (16 layers, D 2048, F 8192 SwiGLU, 32 query / 8
   k/v heads, vocabulary 128256 tied), no logit caps, float32 weights and Adam, bfloat16
   compute, sequence 2048, cuDNN attention (``--attention``: ``ATTENTION_IMPL=cudnn``), the loss in
   NUM_LOSS_CHUNKS chunks, remat by ``--remat``, at the largest batch that fits.
2. ``llama3_8b_lora``: Llama-3-8B's shape (config only) with rank-16 LoRA on q, k, v
   and o, its frozen weights in bfloat16 (LORA_BASE_DTYPE), largest batch that fits.
3. ``plain``: the plain-JAX step of ``benchmarks.plain_jax_lm`` at leg 1's shape
   (GQA, SwiGLU, RMSNorm, tied output, bfloat16 compute, each block rematerialised by
   ``jax.checkpoint``; no rotary positions, einsum attention, the whole logits at once),
   timed against leg 1's step at the same batch in alternating rounds with both held on
   the device: their tokens/s ratio is the report's "paxlite / plain".

The legs run in this order; one that fails is recorded as its error, the next one runs,
and the command exits with status 1 at the end.

"The largest batch that fits" is read off the compiler, not found by running out of
memory: the step is compiled at batch 1 and 2 (``paxlite.perf.aot``, abstract arrays), the
program's bytes per device extrapolated linearly to the device's allocator limit
(``XLA_PYTHON_CLIENT_MEM_FRACTION``, 0.85 unless set, as MaxText's GPU runs set it) less
3%; a run that still runs out steps down by an eighth. The comparison runs at the largest
batch where both steps fit with both states held.

MFU is the causal count (``praxis_lite.flops``: ``6 N + 6 L H Q T`` per token)
over the device's dense bfloat16 peak (``paxlite.perf.mfu``: H100 SXM and H200 989 TFLOP/s).
For LoRA the frozen weights get no weight gradient, so the report also gives the
frozen-base count (``4 N + 6 L H Q T``; the adapters' own FLOPs, under 1%, are not
counted). The GPU XLA flags (``paxlite.runtime.gpu_flags``) are on unless ``--no_gpu_flags``.

Writes ``gpu_mfu.json`` (every figure, each leg's ``benchmark.json`` figures, device,
versions, flags) and ``gpu_mfu.md`` into ``--out``; ``--profile`` also writes a
``jax.profiler`` trace of 3 of leg 1's steps at the comparison's batch (``<out>/profile``,
TensorBoard or Perfetto) and lists its top kernels in the report.

On the GPU machines lent to this project (Python 3.12, jax 0.11.2 with CUDA 13, flax,
optax, orbax, tensorstore, etils, matplotlib, safetensors, tokenizers, sentencepiece,
jinja2, tensorboard installed) four wheels are missing: fiddle, libcst, graphviz and
gin-config (2.8 MB). Fetch them once, here, in the repository's root::

    echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \\
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \\
        -d .whl fiddle==0.3.1 libcst==1.9.0 graphviz==0.21 gin-config==0.5.0

and carry ``.whl`` with the command, which begins by installing them::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site python3 -m benchmarks.gpu_mfu --out $OUT

Nothing on this path imports SeqIO, TensorFlow or clu (``tests/benchmarks`` checks it).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.85")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    from paxlite.runtime import gpu_flags

    added = gpu_flags.apply(not args.no_gpu_flags)
    from benchmarks import gpu_mfu_run

    unknown = set(args.legs.split(",")) - set(gpu_mfu_run.LEGS)
    if unknown:
        raise SystemExit(
            f"gpu_mfu: error: --legs names {', '.join(sorted(unknown))}; choose from "
            f"{', '.join(gpu_mfu_run.LEGS)}."
        )
    report = gpu_mfu_run.run(args, added)
    failed = [leg for leg in gpu_mfu_run.LEGS if "error" in report.get(leg, {})]
    if failed:
        raise SystemExit(f"gpu_mfu: error: {', '.join(failed)} failed (see the report).")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="where gpu_mfu.json/.md go")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on this CPU")
    parser.add_argument("--legs", default="llama_1b,llama3_8b_lora,plain")
    parser.add_argument("--seq", type=int, default=None, help="default 2048 (--cpu: 64)")
    parser.add_argument("--remat", default="save_dot_except_logits_ffn1", help="CHECKPOINT_POLICY")
    parser.add_argument(
        "--attention",
        default="cudnn",
        choices=["cudnn", "xla", "einsum"],
        help="ATTENTION_IMPL of paxlite's legs on a GPU (the plain leg always uses einsums)",
    )
    parser.add_argument("--loss_chunks", type=int, default=None, help="default 8 (--cpu: 2)")
    parser.add_argument("--batch", type=int, default=None, help="leg 1's batch (default: fit)")
    parser.add_argument("--lora_batch", type=int, default=None, help="leg 2's (default: fit)")
    parser.add_argument("--max_batch", type=int, default=256, help="no fitted batch above")
    parser.add_argument(
        "--memory_gib", type=float, default=None, help="device budget (--cpu has none)"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per leg")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds vs plain")
    parser.add_argument(
        "--profile", action="store_true", help="trace 3 of leg 1's steps (in the plain leg)"
    )
    parser.add_argument("--no_gpu_flags", action="store_true", help="leave XLA_FLAGS alone")
    return parser


if __name__ == "__main__":
    main(sys.argv[1:])
