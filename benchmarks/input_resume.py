"""Time from start to the first train step after resuming, at steps 100, 1,000 and 10,000.

Trains LmTextTiny on a text corpus made here (shuffled, packed: a real SeqIO pipeline) to
each step, keeping a copy of the job dir at each, then resumes every copy for one step
twice, in this order:

* ``re-read``: without the saved reader positions (``checkpoints/input_positions``
  removed): the input re-reads the stream up to the checkpoint's batch count, as every
  resume did before they were saved;
* ``saved position``: as a run resumes now.

Both read the same next batches (checked: the loss of the resumed step is equal). Prints
a table of seconds from ``train_loop.run`` to the first step done (compile included, the same
in both).

Usage::

    python benchmarks/input_resume.py [--steps 100 1000 10000] [--documents 200000]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from paxlite.checkpoints import input_positions
from paxlite.experiments import base_experiment
from paxlite.runtime.job import build_job  # noqa: E402
from paxlite.train import train_loop
from tasks.lm.text import LmTextTiny  # noqa: E402

KNOBS = {
    "ICI_MESH_SHAPE": (1, 1, 1),
    "PERCORE_BATCH_SIZE": 8,
    "MAX_SEQ_LEN": 64,
    "SUMMARY_INTERVAL_STEPS": 1_000_000,
    "CHECKPOINT_EVERY_N_STEPS": 1_000_000,  # Saves only where a stage stops.
    "EVAL_INTERVAL_STEPS": 0,
    "TEXT_TASK_NAME": "resume_benchmark",
}


def write_corpus(path: pathlib.Path, documents: int) -> None:
    """``documents`` lines of 5-60 random words (a repeating stream for 10,000 steps)."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(2000)]
    with path.open("w") as f:
        for _ in range(documents):
            f.write(" ".join(rng.choice(words, rng.integers(5, 60))) + "\n")


def experiment(corpus: pathlib.Path, num_train_steps: int) -> LmTextTiny:
    knobs = {**KNOBS, "TEXT_DATA_PATH": str(corpus), "NUM_TRAIN_STEPS": num_train_steps}
    return base_experiment.with_overrides(LmTextTiny, knobs)()


def run(corpus: pathlib.Path, job_dir: pathlib.Path, until: int) -> train_loop.RunResult:
    exp = experiment(corpus, until)
    job = build_job(exp, exp.task(), exp.datasets(), job_dir)
    return train_loop.run(job, peak_tflops=1.0)


def resume_once(corpus: pathlib.Path, snapshot: pathlib.Path, step: int, saved: bool):
    """(seconds to the first step, its loss) resuming a copy of ``snapshot`` for one step."""
    with tempfile.TemporaryDirectory() as scratch:
        job_dir = pathlib.Path(scratch) / "job"
        shutil.copytree(snapshot, job_dir)
        if not saved:
            shutil.rmtree(job_dir / "checkpoints" / input_positions.DIRNAME)
        result = run(corpus, job_dir, step + 1)
    return result.first_step["time_to_first_step_s"], result.train["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--documents", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        root = pathlib.Path(root)
        corpus = root / "corpus.txt"
        write_corpus(corpus, args.documents)
        job_dir, snapshots = root / "job", {}
        for step in sorted(args.steps):
            run(corpus, job_dir, step)
            snapshots[step] = root / f"at_{step}"
            shutil.copytree(job_dir, snapshots[step])
        rows = []
        for step in sorted(args.steps):
            reread_s, reread_loss = resume_once(corpus, snapshots[step], step, saved=False)
            saved_s, saved_loss = resume_once(corpus, snapshots[step], step, saved=True)
            assert reread_loss == saved_loss, (step, reread_loss, saved_loss)
            rows.append((step, reread_s, saved_s))
    print("\nresume at step | re-read (s) | saved position (s)")
    for step, reread_s, saved_s in rows:
        print(f"{step:>14,} | {reread_s:>11.2f} | {saved_s:>18.2f}")


if __name__ == "__main__":
    main()
