"""paxlite's command-line flags (absl), and the one :class:`Mode` enum every mode is chosen by."""

from __future__ import annotations

import enum

from absl import flags
from fiddle.absl_flags import utils as fdl_flag_utils  # noqa: F401  (defines --fdl_set, --fiddler)

from paxlite.cli import pax_flags
from paxlite.experiments import registry


class Mode(enum.Enum):
    """What a run does (``--mode``); paxml's values parse too (see :func:`resolved_mode`)."""

    TRAIN = "train"
    EVAL = "eval"
    TRAIN_AND_EVAL = "train_and_eval"
    DECODE = "decode"
    COMPILE = "compile"
    BENCHMARK = "benchmark"
    DECODE_ONCE = "decode_once"  # paxml's: decode the latest checkpoint once (our DECODE).
    INFER = "infer"  # paxml's; refused.
    TF_DATA_SERVICE_DISPATCHER = "tf_data_service_dispatcher"  # paxml's; refused.
    TF_DATA_SERVICE_WORKER = "tf_data_service_worker"  # paxml's; refused.


#: paxml's modes without a counterpart here, with what to do instead.
REFUSED_MODES = {
    Mode.INFER: "export or serve a model with paxlite.pretrained.loading",
    Mode.TF_DATA_SERVICE_DISPATCHER: "inputs are read by each training process",
    Mode.TF_DATA_SERVICE_WORKER: "inputs are read by each training process",
}


class UsageError(Exception):
    """A problem with the command line; printed without a traceback."""


FLAGS = flags.FLAGS
flags.DEFINE_string("exp", None, f"Registered experiment, e.g. {registry.EXAMPLE_EXPERIMENT}.")
flags.DEFINE_string("job_log_dir", None, "Directory for checkpoints, summaries and config.")
flags.DEFINE_list(
    "exp_search_packages",
    list(registry.DEFAULT_SEARCH_PACKAGES),
    "Packages whose modules are imported to resolve a short --exp name (e.g. LmSyntheticTiny).",
)
flags.DEFINE_enum_class(
    "mode",
    Mode.TRAIN,
    Mode,
    "What to run. train: train, evaluating the experiment's eval inputs every "
    "EVAL_INTERVAL_STEPS and at the end (Pax's train). train_and_eval: the same, and also "
    "decodes every task.decode_interval_steps. decode: decode the experiment's "
    "decoder_datasets() with the latest checkpoint. compile: a dry run that builds the "
    "experiment's mesh from fake CPU devices (or a TPU slice's, --compile_topology), "
    "compiles the train step on abstract arrays and prints sizes and FLOPs. benchmark: "
    "time the train step on the experiment's data "
    "(fresh parameters, no checkpoints) and write benchmark.json/.md/.png into "
    "--job_log_dir.",
)
flags.DEFINE_float(
    "peak_tflops",
    None,
    "Peak TFLOP/s of one device for MFU; default: the table of paxlite/perf/mfu.py by device kind "
    "and dtype, or on CPU a matmul timed at the start of the run (never cached).",
)
flags.DEFINE_enum(
    "mfu_definition",
    "causal",
    ["causal", "palm", "6N"],
    "Model-FLOPs count behind MFU (see praxis_lite/flops.py): causal (default), palm, 6N.",
)
flags.DEFINE_string(
    "compile_topology",
    None,
    "--mode=compile: compile for this TPU slice instead of fake CPU devices and say whether "
    "it fits in HBM: a Cloud TPU name (v4-8, v5p-128: TensorCores; v5e-256, v6e-64: chips), "
    "a libtpu layout (v4:2x2x1), or 'target' (the experiment's TPU_TARGET). Needs libtpu "
    "(pip install 'paxlite[tpu]'); no TPU needed.",
)
flags.DEFINE_integer(
    "compile_topology_num_slices",
    None,
    "--mode=compile --compile_topology: slices joined over DCN (default: the experiment's, "
    "the product of DCN_MESH_SHAPE).",
)
flags.DEFINE_integer("bench_steps", 20, "--mode=benchmark: timed steps.")
flags.DEFINE_integer("bench_warmup", 3, "--mode=benchmark: untimed warm-up steps first.")
flags.DEFINE_multi_string(
    "set", [], "KNOB=VALUE: override of an UPPERCASE experiment knob, one per --set."
)
flags.DEFINE_string(
    "init_from",
    None,
    "Start from this checkpoint's parameters when --job_log_dir has no checkpoint (the knob "
    "INIT_FROM): a paxlite job, checkpoints or step dir, a paxml checkpoint step, a Hugging "
    "Face model directory, a T5X checkpoint or a PEFT adapter; the optimizer state and step "
    "start fresh. Once the run has saved it resumes from its own.",
)
flags.DEFINE_string(
    "init_from_exp",
    None,
    "The experiment a paxml --init_from checkpoint was trained with (the knob INIT_FROM_EXP); "
    "default: this run's.",
)
flags.DEFINE_bool("print_config", False, "Print the resolved configuration and exit.")
flags.DEFINE_bool(
    "help_knobs",
    False,
    "With --exp=NAME: list the experiment's knobs (type, value, what each does) and exit.",
)
flags.DEFINE_bool(
    "xla_gpu_defaults",
    True,
    "On NVIDIA GPUs, add the XLA flags MaxText and JAX-Toolbox train with to XLA_FLAGS (each "
    "one XLA_FLAGS does not already set; paxlite/runtime/gpu_flags.py); false: add none.",
)
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
flags.DEFINE_bool(
    "restore_fallback",
    False,
    "Training: when the newest checkpoint's files cannot be read, move it to "
    "<job_log_dir>/damaged_checkpoints/ and resume from the newest one that reads (without "
    "it, the run stops with an error naming the damaged step).",
)
flags.DEFINE_string(
    "tfds_data_dir",
    None,
    "Directory holding prepared TFDS datasets (e.g. DIR/c4/en/3.0.1); overrides the data dir "
    "of every SeqIO TFDS source. Default: TFDS's own ($TFDS_DATA_DIR or ~/tensorflow_datasets).",
)


#: Fiddle's absl flags that paxlite does not use (importing fiddle's flag module defines
#: them), with what to pass instead. Given, they stop the run rather than being ignored.
UNSUPPORTED_FIDDLE_FLAGS = {
    "fdl_config": "the config comes from --exp; edit it with --fiddler or --fdl_set",
    "fdl_config_file": "the config comes from --exp; edit it with --fiddler or --fdl_set",
    "fdl_tags_set": "tags are not used; set each path with --fdl_set",
    "fdl_help": "--print_config shows every knob and config path",
}


def resolved_mode() -> Mode:
    """``--mode``, with paxml's ``decode_once`` as DECODE; UsageError for paxml's other modes."""
    mode = FLAGS.mode
    if mode in REFUSED_MODES:
        why = REFUSED_MODES[mode]
        raise UsageError(f"--mode={mode.value} (a paxml mode) is not supported by paxlite: {why}.")
    return Mode.DECODE if mode is Mode.DECODE_ONCE else mode


def restore_fallback(mode: Mode, processes: int = 1) -> bool:
    """``--restore_fallback``; UsageError outside training (only training resumes) and in a
    job of several ``processes`` (each could see a step's damage differently, and they
    would resume from different steps or wait for each other)."""
    if not FLAGS.restore_fallback:
        return False
    if mode not in (Mode.TRAIN, Mode.TRAIN_AND_EVAL):
        raise UsageError(
            f"--restore_fallback applies to training, which resumes from its checkpoints; "
            f"--mode={mode.value} does not (restore a step with --restore_checkpoint_step)."
        )
    if processes > 1:
        raise UsageError(
            f"--restore_fallback is for one-process runs; this job has {processes} processes, "
            "which could see a step's damage differently. Move the damaged step directory "
            "(the error without it names it) out of checkpoints/ and rerun."
        )
    return True


def compile_topology() -> tuple[str | None, int | None]:
    """``(--compile_topology, --compile_topology_num_slices)``; UsageError if the slices are
    given without a topology or either is given outside ``--mode=compile``."""
    given = [n for n in ("compile_topology", "compile_topology_num_slices") if FLAGS[n].present]
    if given and FLAGS.mode is not Mode.COMPILE:
        raise UsageError(f"--{given[0]} sizes a job for a TPU slice: add --mode=compile.")
    if FLAGS.compile_topology_num_slices is not None and not FLAGS.compile_topology:
        raise UsageError("--compile_topology_num_slices needs --compile_topology=NAME.")
    return FLAGS.compile_topology, FLAGS.compile_topology_num_slices


def reject_unsupported_flags() -> None:
    """Raises UsageError for the first flag given that paxlite does not honour.

    Fiddle's (:data:`UNSUPPORTED_FIDDLE_FLAGS`) and paxml's (``pax_flags.REFUSED``).
    """
    for name, instead in UNSUPPORTED_FIDDLE_FLAGS.items():
        if FLAGS[name].present:
            raise UsageError(f"--{name} is not supported by paxlite: {instead}.")
    reason = pax_flags.refused_flag()
    if reason is not None:
        raise UsageError(reason)


def knob_settings() -> list[str]:
    """``--set`` with ``--init_from`` / ``--init_from_exp`` as the knobs they set."""
    settings = list(FLAGS.set)
    for flag, knob in (("init_from", "INIT_FROM"), ("init_from_exp", "INIT_FROM_EXP")):
        if FLAGS[flag].value is not None:
            settings.append(f"{knob}={FLAGS[flag].value}")
    return settings
