"""Peak memory of converting a Mesh TensorFlow T5 checkpoint, beside its largest tensor.

Writes a random T5 1.1-shaped MTF checkpoint with TensorFlow's own ``Saver`` (vocabulary
32128, d_model 1024, d_ff 4096 gated, 16 heads of 64, 2 + 2 blocks: about 0.55 GB of
float32; its largest tensors are the 132 MB table and logits), then converts it once to each
output format, each in a fresh process: the process's resident memory is sampled every 5 ms
from just before the conversion (after the same conversion of the tiny test fixture, so that
imports and one-time set-up are done) to its end. Prints the peak growth in MB and in units
of the largest tensor: the t5x and hf outputs are streamed (the hf one in files of at most
``--max_shard_bytes``, set to the largest tensor), the paxlite output holds the model once
(host arrays) while orbax writes it.

Usage::

    python benchmarks/mtf_convert_memory.py [--blocks 2] [--vocab 32128] [--formats t5x hf paxlite]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

_WARM_UP = str(ROOT / "tests" / "fixtures" / "mtf" / "t5_1_1")

_DRIVER = r"""
import json, os, sys, threading, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from absl import flags
from paxlite.formats.t5x import gin_run
from paxlite.t5x import convert_tf_checkpoint

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

prefix, output, kind, shard, warm_up = sys.argv[1:6]

def convert(prefix, output):
    argv = ["convert", f"--tf_checkpoint_path={prefix}", f"--output_dir={output}",
            f"--output_format={kind}"]
    argv += [f"--max_shard_bytes={shard}"] if kind == "hf" else []
    flags.FLAGS(gin_run.rewrite_gin_args(argv))
    convert_tf_checkpoint.main(argv[:1])
    flags.FLAGS.unparse_flags()

convert(warm_up, output + "-warm-up")  # Imports and one-time set-up, on the tiny fixture.
base = rss()
peak = [base]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.005)
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
convert(prefix, output)
seconds = time.perf_counter() - start
done.set()
peak[0] = max(peak[0], rss())
print(json.dumps({"growth": peak[0] - base, "seconds": seconds}))
"""


def make_checkpoint(directory: pathlib.Path, blocks: int, vocab: int) -> tuple[int, int]:
    """Writes the random checkpoint; returns (its largest tensor's bytes, all its bytes)."""
    from tools.t5x_fixtures import make_mtf_checkpoints

    rng = np.random.default_rng(0)
    d, f, joined = 1024, 4096, 16 * 64
    shapes = {"shared/embedding": (vocab, d), "decoder/logits/kernel": (d, vocab)}
    for stack, attentions in (
        ("encoder", ("SelfAttention",)),
        ("decoder", ("SelfAttention", "EncDecAttention")),
    ):
        shapes[f"{stack}/rms_norm/scale"] = (d,)
        shapes[f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"] = (16, 32)
        for block in range(blocks):
            for layer, attention in enumerate(attentions):
                prefix = f"{stack}/block_{block:03d}/layer_{layer:03d}/"
                shapes[prefix + "rms_norm/scale"] = (d,)
                for x in "qkv":
                    shapes[f"{prefix}{attention}/{x}"] = (d, joined)
                shapes[f"{prefix}{attention}/o"] = (joined, d)
            prefix = f"{stack}/block_{block:03d}/layer_{len(attentions):03d}/"
            shapes[prefix + "rms_norm/scale"] = (d,)
            shapes[prefix + "DenseReluDense/wi_0/kernel"] = (d, f)
            shapes[prefix + "DenseReluDense/wi_1/kernel"] = (d, f)
            shapes[prefix + "DenseReluDense/wo/kernel"] = (f, d)
    variables = {
        name: (rng.standard_normal(shape, dtype=np.float32) * 0.02)
        for name, shape in shapes.items()
    }
    make_mtf_checkpoints.save(directory, variables, 1000, "float32")
    sizes = [v.nbytes for v in variables.values()]
    return max(sizes), sum(sizes)


def measure(prefix: pathlib.Path, output: pathlib.Path, kind: str, shard: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(prefix), str(output), kind, str(shard), _WARM_UP],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=32128)
    parser.add_argument("--formats", nargs="+", default=["t5x", "hf", "paxlite"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        work = pathlib.Path(work)
        largest, total = make_checkpoint(work / "mtf", args.blocks, args.vocab)
        mb = 2**20
        print(f"checkpoint: {total / mb:.0f} MB, largest tensor {largest / mb:.1f} MB")
        print(f"{'output':<8} {'peak growth MB':>15} {'x largest':>10} {'x model':>8} {'s':>6}")
        for kind in args.formats:
            got = measure(work / "mtf" / "model.ckpt-1000", work / kind, kind, largest)
            growth = got["growth"]
            print(
                f"{kind:<8} {growth / mb:>15.0f} {growth / largest:>10.2f} "
                f"{growth / total:>8.2f} {got['seconds']:>6.1f}"
            )


if __name__ == "__main__":
    main()
