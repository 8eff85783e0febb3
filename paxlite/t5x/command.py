"""What T5X's three commands share here: T5X's flags, and the gin files read into the
call of the script (``paxlite.t5x.train``, ``.eval``, ``.infer``).

T5X's flags: ``--gin_file`` (repeatable), ``--gin_search_paths`` (comma list; paxlite's
copies of T5X's standard gin files come last), ``--gin.NAME=VALUE`` and ``--gin_bindings``
(gin syntax; they win over the files), ``--tfds_data_dir``, ``--seqio_additional_cache_dirs``,
and for multi-host jobs ``--coordinator_address --process_count --process_index
--initialization_timeout`` (``--multiprocess_gpu`` on GPU clusters). One flag is
paxlite's: ``--t5_spm_path=FILE``, a local copy of the SentencePiece model of the tasks
T5X's example gin files name (default: its gs:// path).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app, flags  # noqa: E402

import paxlite.main as paxlite_main  # noqa: E402
from paxlite.cli import command_line, exits  # noqa: E402
from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS  # noqa: E402
from paxlite.experiments import registry  # noqa: E402
from paxlite.formats.t5x import gin_files, gin_run, t5x_modules, translation  # noqa: E402
from paxlite.formats.t5x.t5_subset import data as t5_data  # noqa: E402

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


#: paxlite's flags that have no place in T5X's eval and infer commands (the gin files say
#: what they would): flag -> what decides it.
INFERENCE_DECIDED = {
    "exp": "the gin files are the experiment",
    "mode": "the command says what it does (infer: infer.mode in a gin file)",
    "set": "bind the value in gin: --gin.NAME=VALUE",
    "print_config": "the command writes the gin config to its output dir's config.gin",
    "init_from": 'the checkpoint is CHECKPOINT_PATH: --gin.CHECKPOINT_PATH=\\"...\\"',
    "init_from_exp": "the gin files describe the model",
    "restore_checkpoint_dir": 'the checkpoint is CHECKPOINT_PATH: --gin.CHECKPOINT_PATH=\\"...\\"',
    "restore_checkpoint_step": "CHECKPOINT_PATH names the step (or RestoreCheckpointConfig.mode)",
}


def reject_flags(decided: dict[str, str], command: str) -> None:
    """One line for a paxlite flag the gin files decide in T5X's ``command`` (``decided``:
    flag -> what decides it)."""
    for name, why in decided.items():
        if FLAGS[name].present:
            fail(f"--{name} is not a flag of T5X's {command} command ({why}).")


def read(script: gin_run.Script) -> gin_run.GinRun:
    """The flags' gin files read into ``script``'s call (T5X's order: SeqIO's data dirs
    first, then the user's task modules, imported as the files name them)."""
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
        return gin_run.read_call(
            script, FLAGS.gin_file, FLAGS.gin_bindings, search_paths, own, FLAGS.t5_spm_path
        )
    except gin_run.GinRunError as e:
        fail(e)


def join_flags() -> None:
    """T5X's multi-host flags as paxlite's (``--coordinator_address`` is the same flag)."""
    if FLAGS.process_count is not None:
        FLAGS.num_processes = FLAGS.process_count
    if FLAGS.process_index is not None:
        FLAGS.process_id = FLAGS.process_index
    if FLAGS.initialization_timeout is not None:
        FLAGS.distributed_timeout_s = FLAGS.initialization_timeout


def parser(doc: str) -> Callable[[Sequence[str]], list[str]]:
    """A T5X command's flag parser: T5X's ``--gin.NAME=VALUE`` rewritten, then paxlite's
    parsing (one-line errors); ``--help`` prints ``doc`` and T5X's flags."""

    def parse(argv: Sequence[str]) -> list[str]:
        if any(arg in ("--help", "-h", "--helpshort") for arg in argv[1:]):
            print(doc.rstrip() + "\n\n" + (__doc__ or ""))
            raise SystemExit(0)
        return command_line.parse(gin_run.rewrite_gin_args(argv))

    return parse


def run(main: Callable[[Sequence[str]], None], parse: Callable[[Sequence[str]], list[str]]) -> None:
    """Runs a T5X command's ``main`` with ``parse`` (:func:`parser`), and paxlite's
    one-line errors and exit codes."""
    try:
        app.run(main, flags_parser=parse)
    except BaseException as e:
        exits.end_process(e)
        raise
