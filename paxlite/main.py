"""``paxlite --exp=NAME --job_log_dir=DIR [--mode=...]``: run a registered experiment.

Flags and modes: ``paxlite/cli/flags.py``; ``--set KNOB=VALUE`` and ``--fdl_set PATH=VALUE``:
``paxlite/cli/overrides.py``. The same ``--job_log_dir`` resumes from its latest checkpoint.
Exit codes (2 bad input, 3 divergence, 4 a lost peer, 5 storage, 143 preempted): exits.py.
"""

from __future__ import annotations

import functools
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
if __package__ in (None, ""):  # Run as a file (python paxlite/main.py): the repo is importable.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
from absl import app, logging  # noqa: E402

from paxlite.checkpoints.train_checkpoints import (  # noqa: E402
    CheckpointCorruptError,
    CheckpointMismatchError,
)
from paxlite.cli import command_line, config_print, error_report, exits, overrides, refusals  # noqa: E402
from paxlite.cli import flags as cli_flags  # noqa: E402
from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS, Mode, UsageError  # noqa: E402
from paxlite.cli.pax_flags import apply_jax_flags, distributed_args, restore_checkpoint  # noqa: E402
from paxlite.evaluation import decode_run, eval_run  # noqa: E402
from paxlite.perf import aot, bench  # noqa: E402
from paxlite.runtime import distributed, job_config, platforms, storage  # noqa: E402
from paxlite.runtime.job import Job, build_job  # noqa: E402
from paxlite.train import periodic_actions, train_loop  # noqa: E402
from praxis_lite.flops import FlopsDefinition  # noqa: E402


def main(argv: Sequence[str]) -> None:
    mode, job, configs = prepare()
    if job is None:  # --print_config or --mode=compile: done.
        return
    job_log_dir = job.job_log_dir
    before = job_config.read_before(job_log_dir, configs[0])
    try:
        if jax.process_index() == 0:
            job_config.write_config(job_log_dir, *configs)
    except OSError as e:
        fail(f"cannot write the job directory {job_log_dir}: {e}")
    try:
        result = _run(job, mode)
    except storage.StorageWriteError as e:
        exits.fail_storage(e, job_log_dir)
    except periodic_actions.DivergenceError as e:
        fail(e, code=exits.DIVERGED_EXIT_CODE)
    except (CheckpointMismatchError, CheckpointCorruptError, *refusals.AT_START) as e:
        if jax.process_index() == 0:  # Nothing is left of a refused start.
            job_config.undo_refused_start(job_log_dir, before, configs[0])
        fail(e)
    exits.report_unwritten()
    if result is not None and result.preempted:
        sys.exit(periodic_actions.PREEMPTED_EXIT_CODE)


def prepare() -> tuple[Mode, Job | None, tuple[Any, ...]]:
    """Everything before a run, from the flags: library logs quiet, storage and the
    platform set up, the mode resolved, the processes joined, the experiment built into a
    job (None with --print_config or --mode=compile, done by then). Errors end the process
    in one line. Nothing is written into the job directory (T5X's eval and infer commands
    use this)."""
    if not FLAGS["verbosity"].present:  # Progress lines are printed; keep libraries quiet.
        logging.set_verbosity(logging.WARNING)
        error_report.hold_library_logs()  # Storage libraries' records: for error reports.
    storage.configure()  # Before any file system or tensorstore use.
    chosen = platforms.choose()  # Before JAX starts its backends.
    if chosen is not None and not FLAGS.print_config:  # Its stdout is the config alone.
        print(platforms.describe(chosen), flush=True)
    if FLAGS.tfds_data_dir:  # Before datasets() registers tasks; seqio is imported only here.
        import seqio

        seqio.set_tfds_data_dir_override(FLAGS.tfds_data_dir)
    try:
        return _setup()
    except refusals.SETUP_ERRORS as e:
        fail(overrides.unproxied(e))


def _setup() -> tuple[Mode, Job | None, tuple[Any, ...]]:
    """The mode, the processes joined, the job built (None: nothing to run)."""
    apply_jax_flags()  # Before anything could start JAX's backends.
    command = command_line.checked_command()
    mode, experiment_cls, knob_settings = command.mode, command.experiment_cls, command.knobs
    target = None
    if mode is Mode.COMPILE:  # As many fake CPU devices as the mesh (or TPU target) has.
        target = aot.compile_target(experiment_cls, *command.topology)
        distributed.use_fake_cpu_devices(aot.devices_needed(experiment_cls, target))
    else:
        timeouts = (FLAGS.distributed_timeout_s, FLAGS.peer_timeout_s)
        distributed.initialize(*distributed_args(), *timeouts)
        cli_flags.restore_fallback(mode, processes=jax.process_count())
    if FLAGS.print_config:  # Also before the required knobs are set.
        print(config_print.config_text(experiment_cls, knob_settings, FLAGS.fdl_set, FLAGS.fiddler))
        return mode, None, ()
    experiment = experiment_cls()  # Validation may ask JAX for the devices: set up by now.
    task_cfg, dataset_cfgs, decoder_cfgs = overrides.resolve_configs(
        experiment, FLAGS.fdl_set, FLAGS.fiddler
    )
    configs = (experiment, task_cfg, dataset_cfgs, decoder_cfgs)
    if mode is Mode.COMPILE:
        print(aot.run(experiment, task_cfg, dataset_cfgs, FLAGS.exp, target))
        return mode, None, configs
    job_log_dir = storage.job_path(FLAGS.job_log_dir)  # A local path or gs://bucket/...
    job_config.check_job_dir_writable(job_log_dir)
    decodes = mode is Mode.DECODE or (
        mode is Mode.TRAIN_AND_EVAL and task_cfg.decode_interval_steps
    )
    if decodes and not decoder_cfgs:
        raise UsageError(
            f"--mode={mode.value} decodes, but {type(experiment).__qualname__} has no "
            "decoder_datasets(); define it in the experiment (prompt/target inputs, see "
            "docs/decoding.md)."
        )
    if mode is Mode.BENCHMARK:
        bench.BenchSettings(steps=FLAGS.bench_steps, warmup=FLAGS.bench_warmup)
    decoders = decoder_cfgs if decodes else ()
    job = build_job(experiment, task_cfg, dataset_cfgs, job_log_dir, decoder_dataset_cfgs=decoders)
    return mode, job, configs


def _run(job: Job, mode: Mode) -> periodic_actions.RunResult | None:
    """Runs ``mode`` on the built job."""
    definition = FlopsDefinition(FLAGS.mfu_definition)
    if mode in (Mode.EVAL, Mode.DECODE):  # Pax's --restore_checkpoint_dir/step, or the job's.
        return (eval_run if mode is Mode.EVAL else decode_run).run(job, *restore_checkpoint(True))
    if mode is Mode.BENCHMARK:
        settings = bench.BenchSettings(
            FLAGS.bench_steps,
            FLAGS.bench_warmup,
            peak_tflops=FLAGS.peak_tflops,
            definition=definition,
        )
        bench.run_and_report(job, settings)
        return None
    return train_loop.run(
        job,
        evaluate=True,  # Pax's --mode=train evaluates too, every EVAL_INTERVAL_STEPS.
        stop_at_step=FLAGS.stop_at_step,
        peak_tflops=FLAGS.peak_tflops,
        flops_definition=definition,
        restore_fallback=FLAGS.restore_fallback,
    )


def run() -> None:
    """Console-script entry point: the run, then how it ended (``exits.end_process``)."""
    try:
        app.run(main, flags_parser=functools.partial(command_line.parse, init_from_reads=_kinds))
    except BaseException as e:
        exits.end_process(e)
        raise


def _kinds() -> str:
    """The checkpoint kinds --init_from reads, for --help (each format registers its own)."""
    from paxlite.checkpoints import checkpoint_sources, init_from  # noqa: F401 (registers them)

    return "; ".join(kind.name for kind in checkpoint_sources.KINDS)


def run_benchmark_cli() -> None:
    """``paxlite-bench --exp=NAME --job_log_dir=DIR [--steps=N --warmup=K]`` (console script)."""
    sys.argv = bench_argv(sys.argv)
    run()


def bench_argv(argv: Sequence[str]) -> list[str]:
    """``paxlite-bench``'s command line as paxlite's: ``--mode=benchmark``, and ``--steps`` /
    ``--warmup`` as ``--bench_steps`` / ``--bench_warmup``."""
    renames = {"--steps": "--bench_steps", "--warmup": "--bench_warmup"}
    rewritten = [argv[0], "--mode=benchmark"]
    for arg in argv[1:]:
        name, sep, value = arg.partition("=")
        rewritten.append(renames.get(name, name) + sep + value)
    return rewritten


if __name__ == "__main__":
    run()
