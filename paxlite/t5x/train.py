"""``python -m paxlite.t5x.train``: T5X's ``t5x/train.py`` command, run by paxlite.

A T5X user replaces ``python3 ${T5X_DIR}/t5x/train.py`` by ``python -m paxlite.t5x.train``
and keeps the rest::

    python -m paxlite.t5x.train --gin_file=USER_DIR/my_run.gin \\
      --gin_search_paths=USER_DIR --gin.MODEL_DIR=\\"/tmp/model_dir\\" \\
      --tfds_data_dir=/data/tfds

T5X's flags: ``--gin_file`` (repeatable), ``--gin_search_paths`` (comma list; paxlite's
copies of T5X's standard gin files come last), ``--gin.NAME=VALUE`` and ``--gin_bindings``
(gin syntax; they win over the files), ``--tfds_data_dir``, ``--seqio_additional_cache_dirs``,
and for multi-host jobs ``--coordinator_address --process_count --process_index
--initialization_timeout`` (``--multiprocess_gpu`` on GPU clusters). One flag is
paxlite's: ``--t5_spm_path=FILE``, a local copy of the SentencePiece model of the tasks
T5X's example gin files name (default: its gs:// path). The gin files become the knobs of
the ``T5xGin`` experiment; MODEL_DIR is the job directory and gets T5X's ``config.gin``.
docs/t5x.md shows T5X's README commands side by side with these.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from absl import app, flags  # noqa: E402
from etils import epath  # noqa: E402

import paxlite.main as paxlite_main  # noqa: E402
from paxlite.cli import command_line, exits, pax_flags  # noqa: E402
from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS, Mode  # noqa: E402
from paxlite.experiments import registry  # noqa: E402
from paxlite.formats.t5x import checkpoint as t5x_checkpoint  # noqa: E402
from paxlite.formats.t5x import gin_files, gin_run, t5x_modules, translation  # noqa: E402
from paxlite.formats.t5x.t5_subset import data as t5_data  # noqa: E402
from paxlite.runtime import distributed  # noqa: E402

flags.DEFINE_multi_string("gin_file", [], "T5X: a gin file to read (repeatable, in order).")
flags.DEFINE_list(
    "gin_search_paths", [], "T5X: folders gin files and includes are looked up in, in order."
)
flags.DEFINE_multi_string(
    "gin_bindings", [], "T5X: a gin binding, e.g. 'MODEL_DIR = \"/tmp/m\"' (--gin.NAME=VALUE too)."
)
flags.DEFINE_list("seqio_additional_cache_dirs", [], "T5X: more folders of cached SeqIO tasks.")
flags.DEFINE_string("t5_spm_path", None, t5_data.SPM_PATH_HELP)
flags.DEFINE_integer("process_count", None, "T5X: processes in a multi-host job.")
flags.DEFINE_integer("process_index", None, "T5X: this process's index in [0, process_count).")
flags.DEFINE_integer(
    "initialization_timeout", None, "T5X: seconds to wait for all processes to join."
)


#: paxlite's flags the gin files decide here (what each becomes: MODEL_DIR, the bindings).
_DECIDED_BY_GIN = {
    "exp": "the gin files are the experiment",
    "job_log_dir": 'MODEL_DIR is the job directory: --gin.MODEL_DIR=\\"...\\"',
    "mode": "T5X's train command trains (and evaluates, as its gin files say)",
    "set": "bind the value in gin: --gin.NAME=VALUE",
}


def main(argv: Sequence[str]) -> None:
    """Reads the gin files into ``T5xGin``'s knobs, then runs paxlite's main with them."""
    for name, why in _DECIDED_BY_GIN.items():
        if FLAGS[name].present:
            fail(f"--{name} is not a flag of T5X's train command ({why}).")
    if FLAGS.tfds_data_dir or FLAGS.seqio_additional_cache_dirs:
        import seqio  # Before the gin files' task modules register tasks.

        if FLAGS.tfds_data_dir:
            seqio.set_tfds_data_dir_override(FLAGS.tfds_data_dir)
        if FLAGS.seqio_additional_cache_dirs:
            seqio.add_global_cache_dirs(FLAGS.seqio_additional_cache_dirs)
    search_paths = [*FLAGS.gin_search_paths, str(gin_files.GIN_ROOT)]
    own = registry.DEFAULT_SEARCH_PACKAGES  # A user's tasks.py may have their name (T5X's README).
    t5x_modules.import_own_packages(own, pathlib.Path(paxlite_main.__file__).resolve().parents[1])
    registry.get(translation.EXPERIMENT, own)
    try:
        run = gin_run.read_train_call(
            FLAGS.gin_file, FLAGS.gin_bindings, search_paths, own, FLAGS.t5_spm_path
        )
        t5x_steps, own_steps = _model_dir_steps(str(run.call.model_dir))
        latest = max(t5x_steps or own_steps, default=None)
        knobs = translation.knobs(run.call, run.sources, run.config_text, latest)
    except (gin_run.GinRunError, translation.UnsupportedBinding) as e:
        fail(e)
    _choose_checkpoint_format(knobs, t5x_steps, own_steps, str(run.call.model_dir))
    _join_flags()
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


def _join_flags() -> None:
    """T5X's multi-host flags as paxlite's (``--coordinator_address`` is the same flag)."""
    if FLAGS.process_count is not None:
        FLAGS.num_processes = FLAGS.process_count
    if FLAGS.process_index is not None:
        FLAGS.process_id = FLAGS.process_index
    if FLAGS.initialization_timeout is not None:
        FLAGS.distributed_timeout_s = FLAGS.initialization_timeout


def parse(argv: Sequence[str]) -> list[str]:
    """T5X's ``--gin.NAME=VALUE`` rewritten, then paxlite's flag parsing (one-line errors)."""
    if any(arg in ("--help", "-h", "--helpshort") for arg in argv[1:]):
        print(__doc__)
        raise SystemExit(0)
    return command_line.parse(gin_run.rewrite_gin_args(argv))


def run() -> None:
    """Console-script entry point (``paxlite-t5x-train``) and ``python -m``."""
    try:
        app.run(main, flags_parser=parse)
    except BaseException as e:
        exits.end_process(e)
        raise


if __name__ == "__main__":
    sys.exit(run())
