"""``paxlite --exp=NAME``: train or evaluate a registered experiment.

Flags:
  --exp             registered experiment (dotted path or unique suffix).
  --job_log_dir     where checkpoints, summaries and the resolved config go.
  --mode            train | eval | train_and_eval | decode (decoder_datasets() with the
                    latest checkpoint: JSONL in <job_log_dir>/decoder_out, decode metrics).
  --set KNOB=VALUE  override an UPPERCASE knob (repeatable; type-checked).
  --fdl_set P=V     override any config path, rooted at 'task', 'datasets' or
                    'decoder_datasets' (e.g. task.learner.optimizer.learning_rate=0.01,
                    decoder_datasets[0].batch_size=4).
  --fiddler NAME    call NAME(task_config) to edit the config; NAME is a function
                    of the experiment's module or a dotted path.
  --print_config    print the resolved knobs and configs, then exit.
  --stop_at_step N  stop (with a checkpoint) at step N; re-running resumes.
  --coordinator_address, --num_processes, --process_id
                    join a multi-process job (else JAX's cluster detection: TPU pods,
                    SLURM, Open MPI); on CPU, processes talk through gloo.
  --peer_timeout_s  when another process of the job is silent this long (or fails),
                    stop with a message naming it (exit 4) instead of hanging.
  --tfds_data_dir D read TFDS datasets (e.g. c4/en/3.0.1) from D (SeqIO's data dir override).
  --peak_tflops P   peak TFLOP/s per device for MFU (default: table by device, or CPU calibration).
  --mfu_definition  causal | palm | 6N: the model-FLOPs count behind MFU (paxlite/flops.py).
  --mode=benchmark --bench_steps N --bench_warmup K
                    time the train step, write benchmark.json/.md/.png (paxlite/bench.py).
Re-running with the same --job_log_dir resumes from the latest checkpoint.
"""

from __future__ import annotations

import importlib
import math
import os
import pathlib
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from absl import app, flags, logging  # noqa: E402
from fiddle.absl_flags import utils as fdl_flag_utils  # noqa: E402  (defines --fdl_set, --fiddler)

FLAGS = flags.FLAGS
flags.DEFINE_string("exp", None, "Registered experiment, e.g. tasks.lm.synthetic.LmSyntheticTiny.")
flags.DEFINE_string("job_log_dir", None, "Directory for checkpoints, summaries and config.")
flags.DEFINE_list(
    "exp_search_packages",
    ["tasks"],
    "Packages whose modules are imported to resolve a short --exp name (e.g. LmSyntheticTiny).",
)
flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "eval", "train_and_eval", "decode", "compile", "benchmark"],
    "What to run. decode: decode the experiment's decoder_datasets() with the latest "
    "checkpoint. compile: a dry run that builds the experiment's mesh from fake CPU devices, "
    "compiles the train step on abstract arrays and prints sizes and FLOPs. benchmark: time "
    "the train step on the experiment's data (fresh parameters, no checkpoints) and write "
    "benchmark.json/.md/.png into --job_log_dir.",
)
flags.DEFINE_float(
    "peak_tflops",
    None,
    "Peak TFLOP/s of one device for MFU; default: the table of paxlite/mfu.py by device kind "
    "and dtype, or on CPU a matmul timed at the start of the run (never cached).",
)
flags.DEFINE_enum(
    "mfu_definition",
    "causal",
    ["causal", "palm", "6N"],
    "Model-FLOPs count behind MFU (see paxlite/flops.py): causal (default), palm, 6N.",
)
flags.DEFINE_integer("bench_steps", 20, "--mode=benchmark: timed steps.")
flags.DEFINE_integer("bench_warmup", 3, "--mode=benchmark: untimed warm-up steps first.")
flags.DEFINE_multi_string("set", [], "KNOB=VALUE override of an UPPERCASE experiment knob.")
flags.DEFINE_bool("print_config", False, "Print the resolved configuration and exit.")
flags.DEFINE_integer(
    "stop_at_step",
    None,
    "Stop this run at this step (with a checkpoint) even if num_train_steps is later; "
    "re-running the command resumes. For staged runs and preemption drills.",
)
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process jobs).")
flags.DEFINE_integer("num_processes", None, "Number of processes in the job.")
flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
flags.DEFINE_integer("distributed_timeout_s", 300, "Seconds to wait for all processes to join.")
flags.DEFINE_float(
    "peer_timeout_s",
    60.0,
    "In a multi-process job, seconds without a heartbeat from another process after which "
    "every other process stops (exit 4) with a message naming the lost one.",
)
flags.DEFINE_string(
    "tfds_data_dir",
    None,
    "Directory holding prepared TFDS datasets (e.g. DIR/c4/en/3.0.1); overrides the data dir "
    "of every SeqIO TFDS source. Default: TFDS's own ($TFDS_DATA_DIR or ~/tensorflow_datasets).",
)


class UsageError(Exception):
    """A problem with the command line; printed without a traceback."""


#: Fiddle's absl flags that paxlite does not use (importing fiddle's flag module defines
#: them), with what to pass instead. Given, they stop the run rather than being ignored.
UNSUPPORTED_FIDDLE_FLAGS = {
    "fdl_config": "the config comes from --exp; edit it with --fiddler or --fdl_set",
    "fdl_config_file": "the config comes from --exp; edit it with --fiddler or --fdl_set",
    "fdl_tags_set": "tags are not used; set each path with --fdl_set",
    "fdl_help": "--print_config shows every knob and config path",
}


def reject_unsupported_fiddle_flags() -> None:
    """Raises UsageError for the first of :data:`UNSUPPORTED_FIDDLE_FLAGS` given."""
    for name, instead in UNSUPPORTED_FIDDLE_FLAGS.items():
        if FLAGS[name].present:
            raise UsageError(f"--{name} is not supported by paxlite: {instead}.")


def resolve_experiment(
    name: str, knob_overrides: Sequence[str], search_packages: Sequence[str] = ()
) -> Any:
    """The experiment instance for ``name`` with ``KNOB=VALUE`` overrides applied."""
    from paxlite import base_experiment, experiment_registry

    cls = experiment_registry.get(name, search_packages)
    cls = base_experiment.apply_knob_overrides(cls, list(knob_overrides))
    return cls()


def resolve_configs(experiment: Any, fdl_sets: Sequence[str], fiddlers: Sequence[str]):
    """``(task_cfg, dataset_cfgs, decoder_dataset_cfgs)`` with fiddlers and path overrides."""
    from praxis_lite.py_utils import NestedMap

    root = NestedMap(
        task=experiment.task(),
        datasets=list(experiment.datasets()),
        decoder_datasets=list(experiment.decoder_datasets()),
    )
    for name in fiddlers:
        _find_fiddler(experiment, name)(root.task)
    for assignment in fdl_sets:
        if "=" not in assignment:
            raise UsageError(f"--fdl_set expects PATH=VALUE, got {assignment!r}.")
        path = assignment.split("=", 1)[0]
        if not path.startswith(("task", "datasets", "decoder_datasets")):
            raise UsageError(
                f"--fdl_set path {path!r} must start with 'task.', 'datasets[i].' or "
                "'decoder_datasets[i].', e.g. task.learner.optimizer.learning_rate=0.01."
            )
        try:
            fdl_flag_utils.set_value(root, assignment)
        except ValueError as e:
            cause = f" {e.__cause__}" if e.__cause__ else ""
            raise UsageError(f"--fdl_set {assignment}: {e}{cause}") from None
    return root.task, root.datasets, root.decoder_datasets


def _find_fiddler(experiment: Any, name: str):
    module = sys.modules[type(experiment).__module__]
    if hasattr(module, name):
        return getattr(module, name)
    if "." in name:
        mod_name, fn_name = name.rsplit(".", 1)
        try:
            return getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"--fiddler {name}: {e}") from None
    raise UsageError(
        f"--fiddler {name}: no function {name!r} in {module.__name__}; pass a dotted path."
    )


def write_config(
    job_log_dir: pathlib.Path,
    experiment: Any,
    task_cfg: Any,
    datasets: Any,
    decoder_datasets: Sequence[Any] = (),
) -> str:
    """Writes config.txt (readable) and config.json (Fiddle JSON) into the job dir."""
    from paxlite import base_experiment
    from praxis_lite import config as config_lib

    text = format_config(experiment, task_cfg, datasets, decoder_datasets)
    job_log_dir.mkdir(parents=True, exist_ok=True)
    (job_log_dir / "config.txt").write_text(text)
    tree = {"task": task_cfg, "datasets": list(datasets)}
    if decoder_datasets:
        tree["decoder_datasets"] = list(decoder_datasets)
    (job_log_dir / "config.json").write_text(config_lib.to_json(tree))
    del base_experiment
    return text


def format_config(
    experiment: Any, task_cfg: Any, datasets: Any, decoder_datasets: Sequence[Any] = ()
) -> str:
    from fiddle import printing

    from paxlite import base_experiment

    cls = type(experiment)
    lines = [f"# Experiment {cls.__module__}.{cls.__qualname__}", "", "## Knobs"]
    lines.append(base_experiment.format_knobs(cls))
    lines += ["", "## Task (Fiddle paths)", printing.as_str_flattened(task_cfg)]
    for i, cfg in enumerate(datasets):
        lines += ["", f"## datasets[{i}]", printing.as_str_flattened(cfg)]
    for i, cfg in enumerate(decoder_datasets):
        lines += ["", f"## decoder_datasets[{i}]", printing.as_str_flattened(cfg)]
    return "\n".join(lines) + "\n"


def check_job_dir_writable(job_log_dir: pathlib.Path) -> None:
    """Raises :class:`UsageError` unless ``job_log_dir`` is (or can be made) a writable directory.

    Creates nothing: the nearest existing directory is probed with a temporary
    directory that is removed at once. Remote paths (``gs://...``) are not checked.
    """
    if "://" in str(job_log_dir):
        return
    path = job_log_dir.absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # A dangling link: the directory it names is gone.
            break
        existing = existing.parent
    blockers = [existing] + [path / sub for sub in ("checkpoints", "summaries")]
    for blocker in blockers:
        if (blocker.exists() or blocker.is_symlink()) and not blocker.is_dir():
            where = "is" if blocker == path else f"cannot be used: {blocker} is"
            raise UsageError(
                f"--job_log_dir {job_log_dir} {where} a file, not a directory; pass another "
                "path, or move that file."
            )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".paxlite-write-check-", dir=existing))
    except OSError as e:
        where = "" if existing == path else f" (its nearest existing parent {existing} is not)"
        raise UsageError(
            f"--job_log_dir {job_log_dir} is not writable{where}: {e.strerror}; pass a "
            "directory you can write to, or fix its permissions."
        ) from None


def _read_config_files(job_log_dir: pathlib.Path) -> dict[pathlib.Path, bytes]:
    """The bytes of the config files already in the job dir (from an earlier run)."""
    paths = (job_log_dir / "config.txt", job_log_dir / "config.json")
    return {p: p.read_bytes() for p in paths if p.is_file()}


def _write_config_files(job_log_dir: pathlib.Path, saved: dict[pathlib.Path, bytes]) -> None:
    """Puts back the config files of :func:`_read_config_files` (or removes new ones)."""
    for path in (job_log_dir / "config.txt", job_log_dir / "config.json"):
        if path in saved:
            path.write_bytes(saved[path])
        else:
            path.unlink(missing_ok=True)


def _unproxied(error: BaseException) -> BaseException:
    """The error itself, not Fiddle's proxy of it (which appends the config being built)."""
    while hasattr(error, "proxy_base_exception"):
        error = error.proxy_base_exception
    return error


def _mesh_size(experiment: Any) -> int:
    dcn = experiment.DCN_MESH_SHAPE or (1,)
    return math.prod(experiment.ICI_MESH_SHAPE) * math.prod(dcn)


def main(argv: Sequence[str]) -> None:
    if not FLAGS["verbosity"].present:  # Progress lines are printed; keep library INFO quiet.
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if not FLAGS.exp:
        raise app.UsageError("--exp is required (e.g. --exp=tasks.lm.synthetic.LmSyntheticTiny).")
    import jax

    from paxlite import distributed, train
    from paxlite.base_experiment import KnobError
    from paxlite.checkpoints import CheckpointCorruptError, CheckpointMismatchError
    from paxlite.experiment_registry import ExperimentRegistryError
    from paxlite.mesh import MeshShapeError
    from praxis_lite.base_input import InputDataError

    if FLAGS.tfds_data_dir:  # Before datasets() registers tasks; seqio is imported only here.
        import seqio

        seqio.set_tfds_data_dir_override(FLAGS.tfds_data_dir)
    try:
        reject_unsupported_fiddle_flags()
        experiment = resolve_experiment(FLAGS.exp, FLAGS.set, FLAGS.exp_search_packages)
        if FLAGS.mode == "compile":
            distributed.use_fake_cpu_devices(_mesh_size(experiment))
        else:
            distributed.initialize(
                FLAGS.coordinator_address,
                FLAGS.num_processes,
                FLAGS.process_id,
                FLAGS.distributed_timeout_s,
                FLAGS.peer_timeout_s,
            )
        task_cfg, dataset_cfgs, decoder_cfgs = resolve_configs(
            experiment, FLAGS.fdl_set, FLAGS.fiddler
        )
        if FLAGS.print_config:
            print(format_config(experiment, task_cfg, dataset_cfgs, decoder_cfgs))
            return
        if FLAGS.mode == "compile":
            from paxlite import aot

            inputs = aot.stand_in_inputs(experiment, dataset_cfgs)
            job = train.build_job(experiment, task_cfg, inputs, pathlib.Path("/nonexistent"))
            print(aot.format_report(FLAGS.exp, aot.compile_train_step(job)))
            return
        if not FLAGS.job_log_dir:
            raise UsageError("--job_log_dir is required (where checkpoints and summaries go).")
        job_log_dir = pathlib.Path(FLAGS.job_log_dir)
        check_job_dir_writable(job_log_dir)
        decodes = FLAGS.mode == "decode" or (
            FLAGS.mode == "train_and_eval" and task_cfg.decode_interval_steps
        )
        if decodes and not decoder_cfgs:
            raise UsageError(
                f"--mode={FLAGS.mode} decodes, but {type(experiment).__qualname__} has no "
                "decoder_datasets(); define it in the experiment (prompt/target inputs, see "
                "README 'Decoding')."
            )
        job = train.build_job(
            experiment,
            task_cfg,
            dataset_cfgs,
            job_log_dir,
            decoder_dataset_cfgs=decoder_cfgs if decodes else (),
        )
    except (
        UsageError,
        KnobError,
        ExperimentRegistryError,
        MeshShapeError,
        distributed.DistributedSetupError,
        AttributeError,
        TypeError,
        ValueError,
    ) as e:
        print(f"paxlite: error: {_unproxied(e)}", file=sys.stderr)
        sys.exit(2)
    previous_config = _read_config_files(job_log_dir)
    try:
        if jax.process_index() == 0:
            write_config(job_log_dir, experiment, task_cfg, dataset_cfgs, decoder_cfgs)
    except OSError as e:
        print(f"paxlite: error: cannot write the job directory {job_log_dir}: {e}", file=sys.stderr)
        sys.exit(2)
    from paxlite.flops import FlopsDefinition

    definition = FlopsDefinition(FLAGS.mfu_definition)
    if FLAGS.mode == "benchmark":
        _benchmark(job, job_log_dir, definition)
        return
    try:
        result = train.run(
            job,
            train.Mode(FLAGS.mode),
            stop_at_step=FLAGS.stop_at_step,
            peak_tflops=FLAGS.peak_tflops,
            flops_definition=definition,
        )
    except train.DivergenceError as e:
        print(f"paxlite: error: {e}", file=sys.stderr)
        sys.exit(3)
    except (CheckpointMismatchError, CheckpointCorruptError) as e:
        # Nothing ran: the job dir keeps the config its checkpoints were written with.
        if jax.process_index() == 0:
            _write_config_files(job_log_dir, previous_config)
        print(f"paxlite: error: {e}", file=sys.stderr)
        sys.exit(2)
    except (FileNotFoundError, InputDataError) as e:  # Data found missing or bad while read.
        print(f"paxlite: error: {e}", file=sys.stderr)
        sys.exit(2)
    if result.get("preempted"):
        sys.exit(train.PREEMPTED_EXIT_CODE)


def _benchmark(job: Any, job_log_dir: pathlib.Path, definition: Any) -> None:
    """--mode=benchmark: times the train step and writes the report (see paxlite/bench.py)."""
    import jax

    from paxlite import bench

    try:
        settings = bench.BenchSettings(
            steps=FLAGS.bench_steps,
            warmup=FLAGS.bench_warmup,
            peak_tflops=FLAGS.peak_tflops,
            definition=definition,
        )
    except ValueError as e:
        print(f"paxlite: error: {e}", file=sys.stderr)
        sys.exit(2)
    figures = bench.run_benchmark(job, settings)
    if jax.process_index() == 0:
        paths = bench.write_report(figures, job_log_dir)
        print(bench.summary_line(figures))
        print("Wrote " + ", ".join(str(p) for p in paths))


def run() -> None:
    """Console-script entry point; tells the job's other processes how this one ended."""
    try:
        app.run(main)
    except BaseException as e:
        from paxlite import distributed

        distributed.report_exit(e.code if isinstance(e, SystemExit) else 1, e)
        raise


if __name__ == "__main__":
    if __package__ in (None, ""):  # Run as a file: make the repo importable.
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    run()
