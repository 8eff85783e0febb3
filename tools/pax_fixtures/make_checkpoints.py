"""Trains each tiny experiment of tiny_experiments.py with paxml's own main.py, then writes
the checkpoint it saved and the logits praxis computes from those parameters on a fixed batch.

Runs in the paxml venv (make_venv.sh), from the repository root:

    JAX_PLATFORMS=cpu /tmp/paxml-venv/bin/python tools/pax_fixtures/make_checkpoints.py \\
        tests/fixtures/pax

Writes, per experiment, ``<out>/<Class>/checkpoints/checkpoint_00000003/...`` (paxml's
files, unchanged, less the optimizer state) and ``<out>/<Class>/logits.npz`` (``ids
[2, T]`` int32, ``logits [2, T, V]`` float32 from praxis's ``compute_predictions``).
"""

import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import tensorstore as ts
from paxml import experiment_registry
from praxis import base_layer, pax_fiddle, py_utils

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tools.pax_fixtures import tiny_experiments  # noqa: E402

EXPERIMENTS = ("TinyLmCloudSpmd", "TinyC4SpmdAdam", "TinyC4SpmdGpt3AdamOrgHP")


def train(name: str, job_dir: pathlib.Path) -> pathlib.Path:
    """paxml's main.py, as a user runs it; returns the saved step's directory."""
    shutil.rmtree(job_dir, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "paxml.main",
            f"--exp=tools.pax_fixtures.tiny_experiments.{name}",
            f"--job_log_dir={job_dir}",
            "--mode=train",
        ],
        check=True,
        cwd=pathlib.Path(__file__).resolve().parents[2],
    )
    step = f"checkpoint_{tiny_experiments.STEPS:08d}"
    return job_dir / "checkpoints" / step


def read_params(step_dir: pathlib.Path) -> dict:
    """The ``mdl_vars.params.*`` arrays of a paxml checkpoint, as a nested dict (tensorstore)."""
    params: dict = {}
    for array_dir in sorted((step_dir / "state").iterdir()):
        if not array_dir.name.startswith("mdl_vars.params."):
            continue
        spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(array_dir)}}
        value = ts.open(spec).result().read().result()
        node = params
        *parents, leaf = array_dir.name[len("mdl_vars.params.") :].split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = np.asarray(value)
    return params


def lm_batch(ids: np.ndarray) -> py_utils.NestedMap:
    """praxis' LM batch of ``ids [B, T]``: no padding, one segment a row."""
    return py_utils.NestedMap(
        ids=ids,
        labels=ids,
        weights=np.ones(ids.shape, np.float32),
        paddings=np.zeros(ids.shape, np.float32),
        segment_ids=np.ones(ids.shape, np.int32),
        segment_pos=np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape),
    )


def logits(name: str, params: dict, ids: np.ndarray) -> np.ndarray:
    """praxis's logits of ``ids [B, T]`` with ``params``."""
    experiment = experiment_registry.get(name)()
    model = pax_fiddle.instantiate(experiment.task().model)
    context = base_layer.JaxContext.HParams(do_eval=True)
    with base_layer.JaxContext.new_context(hparams=context):
        out = model.apply({"params": params}, lm_batch(ids), method=model.compute_predictions)
    return np.asarray(out.logits, np.float32)


def make(name: str, out: pathlib.Path) -> None:
    """Trains experiment ``name`` and writes its checkpoint and logits under ``out/name``."""
    job_dir = pathlib.Path("/tmp/pax_fixture_jobs") / name
    step_dir = train(name, job_dir)
    experiment = experiment_registry.get(name)()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, experiment.VOCAB_SIZE, (2, experiment.MAX_SEQ_LEN)).astype(np.int32)
    values = logits(name, read_params(step_dir), ids)
    target = out / name
    shutil.rmtree(target, ignore_errors=True)
    # The optimizer state (opt_states_*, 2/3 of the bytes) stays out: only weights load.
    shutil.copytree(
        step_dir,
        target / "checkpoints" / step_dir.name,
        ignore=shutil.ignore_patterns("opt_states_*"),
    )
    np.savez(target / "logits.npz", ids=ids, logits=values)
    print(name, "logits", values.shape, "max |logit|", float(np.abs(values).max()), flush=True)


def main(out_dir: str) -> None:
    for name in EXPERIMENTS:
        make(name, pathlib.Path(out_dir))


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    main(sys.argv[1])
