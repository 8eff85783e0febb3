"""paxml 1.4 ``main.py``'s flags: each works with Pax's meaning here or stops the run in one line.

Pax users keep their command lines. The GPU multi-host flags (``--multiprocess_gpu
--server_addr --num_hosts --host_idx``) join the job through ``jax.distributed``
as Pax's do; ``--jax_traceback_filtering_option`` sets JAX's option and
``--jax_profiler_port`` starts JAX's profiler server (:func:`apply_jax_flags`); the
others that have no counterpart here are refused with the reason and what to
use instead (:data:`REFUSED`), never silently ignored. ``--tfds_data_dir``,
``--exp``, ``--job_log_dir`` and Fiddle's flags are defined in ``paxlite.cli.flags``.
"""

from __future__ import annotations

from absl import flags

from paxlite.runtime import gpu_flags

FLAGS = flags.FLAGS

flags.DEFINE_bool(
    "multiprocess_gpu",
    False,
    "Pax: this process joins a multi-host GPU job at --server_addr as host --host_idx of "
    "--num_hosts (jax.distributed; as --coordinator_address/--num_processes/--process_id).",
)
flags.DEFINE_string("server_addr", None, "Pax: host:port of the job's coordinator (host 0).")
flags.DEFINE_integer("num_hosts", None, "Pax: number of hosts (processes) in the job.")
flags.DEFINE_integer("host_idx", None, "Pax: this host's index in [0, num_hosts).")
flags.DEFINE_string(
    "jax_traceback_filtering_option", "auto", "Pax: JAX's traceback filtering (jax config)."
)
flags.DEFINE_integer(
    "jax_profiler_port",
    None,
    "Pax: start JAX's profiler server on this port, for on-demand captures (TensorBoard's "
    "profile plugin 'Capture profile', or python -m jax.collect_profile PORT MS).",
)

flags.DEFINE_string(
    "restore_checkpoint_dir",
    None,
    "Pax: --mode=eval / --mode=decode read the parameters of this checkpoint (a paxlite job, "
    "checkpoints or step dir, or a paxml checkpoints dir or step) instead of --job_log_dir's; "
    "outputs go to --job_log_dir. To start training from a checkpoint use --init_from.",
)
flags.DEFINE_multi_integer(
    "restore_checkpoint_step",
    None,
    "Pax: the step of --restore_checkpoint_dir (or of --job_log_dir's checkpoints) that "
    "--mode=eval / --mode=decode read; default: the newest.",
)

#: Pax's flags that do not apply here: name -> (kind, why and what to do instead). Given on
#: the command line (with a value that asks for something other than what paxlite does),
#: they stop the run.
REFUSED: dict[str, tuple[str, str]] = {
    "eval_on_test": (
        "bool",
        "every eval input of datasets() is evaluated; list the test split there",
    ),
    "decode_during_train": (
        "bool",
        "use --mode=train_and_eval with --fdl_set task.decode_interval_steps=N",
    ),
    "eval_during_decode": ("bool", "run --mode=eval and --mode=decode"),
    "maybe_use_persistence_checkpointing": (
        "bool",
        "checkpoints are orbax's, saved asynchronously",
    ),
    "jax_fully_async_checkpoint": ("bool", "checkpoints are already saved asynchronously (orbax)"),
    "exit_after_ondemand_checkpoint": (
        "bool",
        "on SIGTERM the trainer already saves, then exits with code 143",
    ),
    "tensorstore_use_ocdbt": ("bool", "orbax's own storage layout is used"),
    "async_timeout_secs": ("int", "it is a knob here: --set CHECKPOINT_ASYNC_TIMEOUT_SECS=N"),
    "startup_random_jitter_max_secs": ("int", "processes start without jitter"),
    "decode_output_pickle": ("bool", "decoder outputs are JSONL in <job_log_dir>/decoder_out"),
    "checkpoint_todelete_subdir": (
        "str",
        "old checkpoints are deleted; keep more with CHECKPOINT_MAX_TO_KEEP",
    ),
    "globally_use_hardware_rng": ("bool", "JAX's default RNG is used"),
    "enable_auto_sharding": ("bool", "shardings come from LOGICAL_AXIS_RULES"),
    "study": ("str", "hyperparameter tuning is not part of paxlite"),
    "controller_mode": ("str", "hyperparameter tuning is not part of paxlite"),
    "tuner_group": ("str", "hyperparameter tuning is not part of paxlite"),
    "metrics_from": ("str", "hyperparameter tuning is not part of paxlite"),
    "num_trials": ("int", "hyperparameter tuning is not part of paxlite"),
    "pythia_port": ("int", "hyperparameter tuning is not part of paxlite"),
    "fdl": ("multi_str", "the config comes from --exp; edit it with --fiddler or --fdl_set"),
}

#: Pax's flags whose default is what paxlite does: refused only when set the other way.
REFUSED_WHEN: dict[str, tuple[bool, str]] = {
    "enable_checkpoint_saving": (False, "checkpoints are always saved (they make runs resumable)"),
    "enforce_restore_shape_check": (False, "a checkpoint of other shapes is always refused"),
    "enable_summary_writer": (False, "TensorBoard summaries are always written"),
}

_DEFINE = {
    "bool": flags.DEFINE_bool,
    "int": flags.DEFINE_integer,
    "str": flags.DEFINE_string,
    "multi_int": flags.DEFINE_multi_integer,
    "multi_str": flags.DEFINE_multi_string,
}
for _name, (_kind, _why) in REFUSED.items():
    _DEFINE[_kind](_name, None, f"Pax's flag; refused here: {_why}.")
for _name, (_refused_value, _why) in REFUSED_WHEN.items():
    flags.DEFINE_bool(_name, not _refused_value, f"Pax's flag; {_why}.")


def refused_flag() -> str | None:
    """The one-line reason for the first Pax flag given that paxlite does not honour, or None."""
    for name, (_, why) in REFUSED.items():
        if FLAGS[name].present:
            return f"--{name} (a paxml flag) is not supported by paxlite: {why}."
    for name, (refused_value, why) in REFUSED_WHEN.items():
        if FLAGS[name].present and FLAGS[name].value == refused_value:
            return f"--{name}={str(refused_value).lower()} is not supported by paxlite: {why}."
    return None


def restore_checkpoint(evaluates: bool) -> tuple[str | None, int | None]:
    """``(--restore_checkpoint_dir, --restore_checkpoint_step)`` for an eval or decode run.

    Raises:
      ValueError: given for a training mode (``evaluates`` False), or several steps given.
    """
    path, steps = FLAGS.restore_checkpoint_dir, FLAGS.restore_checkpoint_step or []
    if (path or steps) and not evaluates:
        raise ValueError(
            "--restore_checkpoint_dir/--restore_checkpoint_step pick the checkpoint that "
            "--mode=eval and --mode=decode read; to start training from a checkpoint pass "
            "--init_from=PATH."
        )
    if len(steps) > 1:
        raise ValueError(f"--restore_checkpoint_step is given {len(steps)} times; pass one step.")
    return path, (steps[0] if steps else None)


def distributed_args() -> tuple[str | None, int | None, int | None]:
    """``(coordinator address, process count, process index)`` from paxlite's or Pax's flags.

    Raises:
      ValueError: both spellings given, or Pax's without ``--multiprocess_gpu``.
    """
    ours = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    pax = (FLAGS.server_addr, FLAGS.num_hosts, FLAGS.host_idx)
    if not any(v is not None for v in pax):
        return ours
    if any(v is not None for v in ours):
        raise ValueError(
            "give either --coordinator_address/--num_processes/--process_id or Pax's "
            "--multiprocess_gpu --server_addr/--num_hosts/--host_idx, not both."
        )
    if not FLAGS.multiprocess_gpu:
        raise ValueError(
            "--server_addr, --num_hosts and --host_idx join a job with --multiprocess_gpu (as in "
            "Pax); add --multiprocess_gpu."
        )
    return pax


def apply_jax_flags() -> None:
    """Adds the NVIDIA GPU XLA flags (``--xla_gpu_defaults``, before the backend starts);
    sets JAX's traceback filtering; starts the profiler server if a port is given."""
    import jax

    gpu_flags.apply(FLAGS.xla_gpu_defaults)

    jax.config.update("jax_traceback_filtering", FLAGS.jax_traceback_filtering_option)
    if FLAGS.jax_profiler_port is not None:
        jax.profiler.start_server(FLAGS.jax_profiler_port)
