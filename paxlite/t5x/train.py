"""``python -m paxlite.t5x.train``: T5X's ``t5x/train.py`` command, run by paxlite.

A T5X user replaces ``python3 ${T5X_DIR}/t5x/train.py`` by ``python -m paxlite.t5x.train``
and keeps the rest::

    python -m paxlite.t5x.train --gin_file=USER_DIR/my_run.gin \\
      --gin_search_paths=USER_DIR --gin.MODEL_DIR=\\"/tmp/model_dir\\" \\
      --tfds_data_dir=/data/tfds

T5X's flags: see :mod:`paxlite.t5x.command`. The gin files become the knobs of
the ``T5xGin`` experiment; MODEL_DIR is the job directory and gets T5X's ``config.gin``.
docs/t5x.md shows T5X's README commands side by side with these.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Before TensorFlow (SeqIO's) loads.

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from etils import epath  # noqa: E402

import paxlite.main as paxlite_main  # noqa: E402
from paxlite.cli import pax_flags  # noqa: E402
from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS, Mode  # noqa: E402
from paxlite.formats.t5x import checkpoint as t5x_checkpoint  # noqa: E402
from paxlite.formats.t5x import gin_run, translation  # noqa: E402
from paxlite.runtime import distributed  # noqa: E402
from paxlite.t5x import command  # noqa: E402

#: paxlite's flags the gin files decide here (what each becomes: MODEL_DIR, the bindings).
_DECIDED_BY_GIN = {
    "exp": "the gin files are the experiment",
    "job_log_dir": 'MODEL_DIR is the job directory: --gin.MODEL_DIR=\\"...\\"',
    "mode": "T5X's train command trains (and evaluates, as its gin files say)",
    "set": "bind the value in gin: --gin.NAME=VALUE",
}


def main(argv: Sequence[str]) -> None:
    """Reads the gin files into ``T5xGin``'s knobs, then runs paxlite's main with them."""
    command.reject_flags(_DECIDED_BY_GIN, "train")
    run = command.read(gin_run.TRAIN)
    try:
        t5x_steps, own_steps = _model_dir_steps(str(run.call.model_dir))
        latest = max(t5x_steps or own_steps, default=None)
        knobs = translation.knobs(run.call, run.sources, run.config_text, latest)
    except translation.UnsupportedBinding as e:
        fail(e)
    _choose_checkpoint_format(knobs, t5x_steps, own_steps, str(run.call.model_dir))
    command.join_flags()
    knobs |= _fresh_seeds(run.call)
    FLAGS.exp = translation.EXPERIMENT
    FLAGS.job_log_dir = str(run.call.model_dir)
    FLAGS.mode = Mode.TRAIN_AND_EVAL if knobs.get("DECODE_VALIDATION") else Mode.TRAIN
    FLAGS.set = [f"{name}={translation.knob_text(value)}" for name, value in knobs.items()]
    paxlite_main.main(argv)


def _fresh_seeds(call: Any) -> dict[str, int]:
    """T5X's seeds left None (``RANDOM_SEED``; the train ``DatasetConfig.seed``), as T5X
    sets them: the time in seconds (int32), process 0's in a multi-process job; printed,
    so that the run can be repeated."""
    unset = [
        (knob, name)
        for knob, name, value in (
            ("SEED", "RANDOM_SEED (initialization and dropout)", call.random_seed),
            ("DATA_SEED", "the train DatasetConfig.seed", call.train_dataset_cfg.seed),
        )
        if value is None
    ]
    if not unset:
        return {}
    seed = int(np.int32(time.time()))
    try:  # Joined here already (paxlite's main finds the processes joined); no backend yet.
        joined = distributed.join(
            *pax_flags.distributed_args(), FLAGS.distributed_timeout_s, FLAGS.peer_timeout_s
        )
    except ValueError as e:  # Half the flags given, or a bad process index.
        fail(e)
    if joined:
        seed = int(distributed.agreed("t5x_seed", str(seed)))
    for _, name in unset:
        print(f"paxlite: {name} is None: this run's seed is {seed} (T5X's, from the time).")
    return {knob: seed for knob, _ in unset}


def _model_dir_steps(model_dir: str) -> tuple[list[int], list[int]]:
    """MODEL_DIR's complete checkpoint steps: T5X's ``checkpoint_<step>/`` and paxlite's own
    ``checkpoints/<step>/`` (for T5X's ``relative_steps`` and periods)."""
    path = epath.Path(model_dir)
    try:
        if not path.is_dir():
            return [], []
        own = path / "checkpoints"
        return t5x_checkpoint.steps(path), (ocp.utils.checkpoint_steps(own) if own.is_dir() else [])
    except OSError as e:
        fail(f"cannot read MODEL_DIR {model_dir}: {e}")


def _choose_checkpoint_format(
    knobs: dict[str, Any], t5x_steps: list[int], own_steps: list[int], model_dir: str
) -> None:
    """T5X's checkpoint format, unless MODEL_DIR already holds paxlite's own (an earlier
    paxlite's run: resumed in its format, said) or the optimizer state has no place in
    T5X's while MODEL_DIR holds T5X's steps (refused)."""
    if knobs["T5X_CHECKPOINTS"] and own_steps and not t5x_steps:
        knobs["T5X_CHECKPOINTS"] = False
        print(
            f"paxlite: note: {model_dir} holds paxlite's own checkpoints/<step> (steps "
            f"{own_steps[0]}-{own_steps[-1]}): the run resumes from them and goes on in that "
            "format; a new MODEL_DIR gets T5X's checkpoint_<step>/."
        )
    elif not knobs["T5X_CHECKPOINTS"] and t5x_steps:
        fail(
            f"{model_dir} holds T5X checkpoints (checkpoint_{t5x_steps[-1]}), which paxlite "
            "resumes for Adafactor without momentum only; start a new MODEL_DIR with "
            f'--gin.INITIAL_CHECKPOINT_PATH=\\"{model_dir}/checkpoint_{t5x_steps[-1]}\\" '
            "(its parameters and step)."
        )


parse = command.parser(__doc__)


def run() -> None:
    """Console-script entry point (``paxlite-t5x-train``) and ``python -m``."""
    command.run(main, parse)


if __name__ == "__main__":
    sys.exit(run())
