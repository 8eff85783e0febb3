"""Mixtral-8x7B's HBM per TPU chip: paxlite against MaxText, both compiled for one TPU slice.

Both programs are the train step of Mixtral-8x7B's shape (46.7B parameters, 8 experts of
14336, top-2, dropless), compiled by XLA's TPU compiler through libtpu on this host (no TPU
needed), at the same sequence length, batch per chip, remat and sharding:

* paxlite: ``tasks.moe.synthetic.Mixtral8x7BSynthetic`` with ``--mode=compile --compile_topology``
  (FSDP over every chip, full remat, float32 weights and Adam, bfloat16 compute, dropless
  experts as ``ragged_dot`` on each chip's own tokens);
* MaxText 0.2.5 (its own venv, ``--maxtext-python``; ../shared/STACK-NOTES.md says how to
  install it): ``maxtext.trainers.pre_train.train_compile`` of ``model_name=mixtral-8x7b``
  with its defaults (``ici_fsdp_parallelism=-1``, ``remat_policy=full``, ``weight_dtype``
  float32, AdamW, ``sparse_matmul`` + ``megablox``, ``capacity_factor=-1``: dropless) and
  the same ``per_device_batch_size`` and ``max_target_length``.

The figure compared is the TPU compiler's buffer assignment (the HBM it checks against the
chip; XLA's memory-usage report, read by ``paxlite.runtime.tpu_topology``), with XLA's
``memory_analysis`` beside it. What differs: MaxText's load-balancing loss weight is 0 (its
default; paxlite's experiment adds Mixtral's 0.02: a few scalars), its attention kernel and
its MoE kernel (megablox's grouped matmul) are its own.

    python benchmarks/moe_tpu_memory.py --maxtext-python /tmp/maxtext-venv/bin/python \\
        [--topology v5p-32] [--seq 4096] [--batch 1]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from paxlite.runtime import tpu_topology  # noqa: E402

GIB = 2**30


def paxlite_figures(topology: str, seq: int, batch: int) -> dict[str, float]:
    """paxlite's compile report for the topology, as GiB per chip."""
    chips = tpu_topology.parse(topology).chips_per_slice
    with tempfile.TemporaryDirectory() as job_dir:
        command = [
            sys.executable,
            "-m",
            "paxlite.main",
            "--exp=tasks.moe.synthetic.Mixtral8x7BSynthetic",
            f"--job_log_dir={job_dir}",
            "--mode=compile",
            f"--compile_topology={topology}",
            f"--set=ICI_MESH_SHAPE=1,{chips},1",
            f"--set=NUM_GROUPS={chips}",
            f"--set=MAX_SEQ_LEN={seq}",
            f"--set=PERCORE_BATCH_SIZE={batch}",
        ]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    report = out.stdout + out.stderr
    rows = {
        "assigned": r"HBM assigned per chip:\s+([\d.]+) GiB",
        "memory_analysis": r"program per chip:\s+([\d.]+) GiB",
        "temp": r"XLA temp per chip:\s+([\d.]+) GiB",
    }
    figures = {}
    for name, pattern in rows.items():
        found = re.search(pattern, report)
        if found is None:
            raise SystemExit(f"paxlite's compile printed no {name!r}:\n{report[-3000:]}")
        figures[name] = float(found.group(1))
    return figures


def maxtext_figures(python: str, topology: str, seq: int, batch: int) -> dict[str, float]:
    """MaxText's train_compile for the topology, as GiB per chip (its XLA dump's report)."""
    site = subprocess.run(
        [python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        dump = pathlib.Path(work) / "dump"
        command = [
            python,
            "-m",
            "maxtext.trainers.pre_train.train_compile",
            f"{site}/configs/base.yml",
            "model_name=mixtral-8x7b",
            f"compile_topology={topology}",
            "compile_topology_num_slices=1",
            f"per_device_batch_size={batch}",
            f"max_target_length={seq}",
            "remat_policy=full",
            "dataset_type=synthetic",
            "run_name=moe_tpu_memory",
            f"base_output_directory={work}/out",
        ]
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_dump_to={dump}")
        env.pop("TPU_LIBRARY_PATH", None)  # paxlite's libtpu (set on import): MaxText has its own.
        out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
        report = out.stdout + out.stderr
        stats = re.search(r"Memory analysis: CompiledMemoryStats\((.*?)\)", report)
        assigned = tpu_topology.assigned_hbm_bytes(dump)
    if stats is None or assigned is None:
        raise SystemExit(f"MaxText's train_compile gave no memory figures:\n{report[-3000:]}")
    sizes = {k: int(v) for k, v in re.findall(r"(\w+)_size_in_bytes=(\d+)", stats.group(1))}
    total = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    total += sizes["generated_code"]
    return {
        "assigned": assigned / GIB,
        "memory_analysis": total / GIB,
        "temp": sizes["temp"] / GIB,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maxtext-python", required=True)
    parser.add_argument("--topology", default="v5p-32")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    ours = paxlite_figures(args.topology, args.seq, args.batch)
    theirs = maxtext_figures(args.maxtext_python, args.topology, args.seq, args.batch)
    print(
        f"Mixtral-8x7B train step on {args.topology}, sequence {args.seq}, "
        f"{args.batch} per chip, full remat, FSDP (GiB per chip):"
    )
    print(f"  {'':<30}{'paxlite':>10}{'MaxText 0.2.5':>16}")
    labels = {
        "assigned": "HBM assigned (TPU compiler)",
        "memory_analysis": "memory_analysis total",
        "temp": "XLA temp",
    }
    for key, label in labels.items():
        print(f"  {label:<30}{ours[key]:>10.2f}{theirs[key]:>16.2f}")
    verdict = "<=" if ours["assigned"] <= theirs["assigned"] else ">"
    print(f"paxlite {ours['assigned']:.2f} {verdict} MaxText {theirs['assigned']:.2f} GiB")


if __name__ == "__main__":
    main()
