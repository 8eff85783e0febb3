"""``paxlite-export``: a run fine-tuned from a Hugging Face model, back as a Hugging Face
directory that transformers loads::

    paxlite-export --job_log_dir=/tmp/ft --out=/tmp/ft_hf [--step=N] [--dtype=bfloat16]
    paxlite-export --job_log_dir=/tmp/lora --out=/tmp/lora_adapter --adapter

The job keeps its model's config.json, generation config and tokenizer in ``hf_model/``
(``tasks.lm.hf.HfCausalLm`` copies them when it starts); the weights are its checkpoint's
(the newest, or ``--step``), in the run's float32 unless ``--dtype`` says otherwise, under
the family's names (a scanned stack is written back layer by layer). A run with LoRA
adapters (LORA_RANK > 0) is written merged (``W + scale * A B``), or with ``--adapter`` as
PEFT's adapter directory (``paxlite.formats.peft.adapter``) for the run's HF_MODEL.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import jax
import ml_dtypes
import numpy as np
from absl import app, flags, logging
from etils import epath
from flax import traverse_util
from jax.sharding import SingleDeviceSharding

from paxlite.checkpoints import checkpoint_sources
from paxlite.cli import exits, own_flags
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.pretrained import adapters
from paxlite.runtime import job_record, storage
from praxis_lite import config as config_lib
from praxis_lite.layers import lora
from praxis_lite.tokenizers.hf_tokenizer import TOKENIZER_FILES

_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}


#: The command line's own flags: paxlite.pretrained.loading (read for frozen weights) brings the
#: trainer's absl flags, some of the same names, into absl's global FLAGS.
_FLAGS = flags.FlagValues()
_PROGRAM = "paxlite-export"


def define_flags(flag_values: flags.FlagValues) -> None:
    """The command line's flags, on ``flag_values`` (:func:`run`: :data:`_FLAGS`)."""
    fv = flag_values
    flags.DEFINE_string("job_log_dir", None, "The job directory to export.", flag_values=fv)
    flags.DEFINE_string("out", None, "The Hugging Face directory to write.", flag_values=fv)
    flags.DEFINE_integer(
        "step", None, "The checkpoint step to export (default: newest).", flag_values=fv
    )
    flags.DEFINE_enum("dtype", "float32", list(_DTYPES), "The weights' dtype.", flag_values=fv)
    flags.DEFINE_bool(
        "adapter", False, "Write the LoRA adapters as a PEFT adapter directory.", flag_values=fv
    )


def parse(flag_values: flags.FlagValues, argv: Sequence[str]) -> list[str]:
    """``argv`` parsed into ``flag_values`` (:func:`define_flags`): the rest of it, or a
    one-line error (``--help``: the flags, exit 0)."""
    summary = f"{_PROGRAM}: a fine-tuned run as a Hugging Face model.\n\n{flag_values}"
    return own_flags.parse(flag_values, argv, _PROGRAM, summary)


def check_flags(flag_values: flags.FlagValues, rest: Sequence[str]) -> None:
    """One line and exit 2 for what the export cannot run with: words that are no flag
    (``rest``: what :func:`parse` left, the program first), or no --job_log_dir or --out."""
    own_flags.refuse_extra_words(rest, _PROGRAM)
    if not flag_values.job_log_dir or not flag_values.out:
        exits.fail(f"{_PROGRAM} needs --job_log_dir=DIR (the fine-tuned run) and --out=DIR.")


def kept_files(hf_dir: str) -> dict[str, str]:
    """What a job fine-tuned from the Hugging Face model ``hf_dir`` keeps for its export
    (an experiment's ``job_files``): the directory's config, generation config and
    tokenizer files, under ``job_record.HF_MODEL_DIR``."""
    names = [hf_models.CONFIG_FILE, hf_checkpoint.GENERATION_CONFIG_FILE, *TOKENIZER_FILES]
    directory = epath.Path(hf_dir)
    return {
        f"{job_record.HF_MODEL_DIR}/{name}": str(directory / name)
        for name in names
        if (directory / name).exists()
    }


class ExportError(ValueError):
    """The job cannot be exported (not fine-tuned from a Hugging Face model, no checkpoint)."""


def export(
    job_log_dir: epath.PathLike,
    out: epath.PathLike,
    step: int | None = None,
    dtype: str = "float32",
    adapter: bool = False,
) -> list[str]:
    """Writes the job's checkpoint (``step``, default its newest) as a Hugging Face model
    directory ``out`` (LoRA adapters merged), or with ``adapter`` its adapters as a PEFT
    adapter directory; returns the files written.

    Raises:
      ExportError: the job kept no Hugging Face model files (``hf_model/``), or
        ``adapter`` for a run without adapters.
      checkpoint_sources.CheckpointSourceError: no such checkpoint.
    """
    job = storage.job_path(job_log_dir)
    kept = job / job_record.HF_MODEL_DIR
    if not (kept / hf_models.CONFIG_FILE).is_file():
        raise ExportError(
            f"{job} keeps no {job_record.HF_MODEL_DIR}/config.json: export runs fine-tuned "
            "from a Hugging Face model directory (HfCausalLm --set HF_MODEL=DIR, or an "
            "experiment of the same model with --init_from=DIR)."
        )
    config = hf_models.HfConfig.load(kept)
    family = hf_models.family_of(config)
    params = _host_params(job, step)
    settings = _lora_settings(job)
    out = epath.Path(out)
    if adapter:
        if settings is None:
            raise ExportError(f"{job} trained no LoRA adapters (LORA_RANK=0); drop --adapter.")
        return peft_adapter.save(out, params, family, _adapter_config(job, settings, family))
    if _froze_parameters(job):  # Its checkpoints hold what it trained: the rest as it began.
        params = _whole_params(job, step)
    if settings is not None:
        params = lora.merged(params, settings.scale)
    host = {path: value.astype(_DTYPES[dtype]) for path, value in params.items()}
    files = hf_checkpoint.save(out, host, family, config.fields)
    for path in sorted(kept.iterdir()):
        if path.name != hf_models.CONFIG_FILE:
            path.copy(out / path.name, overwrite=True)
            files.append(path.name)
    return files


def _lora_settings(job: epath.Path) -> lora.LoraSettings | None:
    """The run's LoRA settings (from its config.json's model), or None without adapters."""
    return adapters.settings_in(config_lib.from_json((job / "config.json").read_text())["task"])


def _adapter_config(
    job: epath.Path, settings: lora.LoraSettings, family: hf_models.Family
) -> peft_adapter.AdapterConfig:
    """PEFT's config of the run's adapters: its LoRA knobs, its HF_MODEL as the base."""
    knobs = job_record.read_knobs(job)
    modules = [m.strip() for m in str(knobs.get("LORA_TARGET_MODULES") or "").split(",")]
    modules = [m for m in modules if m] or list(peft_adapter.default_modules(family))
    if modules == [peft_adapter.ALL_LINEAR]:
        modules = list(peft_adapter.module_targets(family.table))
    return peft_adapter.AdapterConfig(
        rank=settings.rank,
        alpha=settings.alpha,
        dropout=settings.dropout_prob,
        use_rslora=settings.use_rslora,
        target_modules=tuple(modules),
        base_model_name_or_path=knobs.get("HF_MODEL"),
        fan_in_fan_out=peft_adapter.fan_in_fan_out(family),
    )


def _froze_parameters(job: epath.Path) -> bool:
    """Whether the job's learner froze parameters (its checkpoints then leave them out)."""
    learner = config_lib.from_json((job / "config.json").read_text())["task"].learner
    return bool(learner.bprop_variable_inclusion or learner.bprop_variable_exclusion)


def _whole_params(job: epath.Path, step: int | None) -> dict[str, np.ndarray]:
    """Every parameter of the job's step as host arrays, its frozen ones read from where
    the job started them (``paxlite.pretrained.loading.from_pretrained`` of the job, on one device:
    the command line runs on the CPU)."""
    # Imported here: inference brings paxlite.main's absl flags, which share names with ours.
    from paxlite.pretrained import loading

    path = job if step is None else job / "checkpoints" / str(step)
    model = loading.from_pretrained(path, overrides=["ICI_MESH_SHAPE=1,1,1", "DCN_MESH_SHAPE=None"])
    flat = traverse_util.flatten_dict(model.params, sep="/")
    return {name: np.asarray(jax.device_get(value)) for name, value in flat.items()}


def _host_params(job: epath.Path, step: int | None) -> dict[str, np.ndarray]:
    """The checkpoint's parameters as whole host arrays (flat paths, no ``params/``)."""
    cpu = SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    source = checkpoint_sources.open_source(job, step)
    try:
        variables = source.variables()
        run_params = {
            name[len(checkpoint_sources.PARAMS) :]: jax.ShapeDtypeStruct(
                v.shape, v.dtype, sharding=cpu
            )
            for name, v in variables.items()
        }
        arrays = source.read({name: name for name in variables}, run_params)
    finally:
        source.close()
    return {path: np.asarray(value) for path, value in arrays.items()}


def main(argv: Sequence[str]) -> None:
    check_flags(_FLAGS, argv)
    given = _FLAGS
    out = given.out
    try:
        files = export(given.job_log_dir, out, given.step, given.dtype, given.adapter)
    except (ExportError, checkpoint_sources.CheckpointSourceError, ValueError) as e:
        exits.fail(e)
    print(f"Wrote {out}: {', '.join(files)}")


def _parse(argv: list[str]) -> list[str]:
    """``argv`` parsed into :data:`_FLAGS` (:func:`parse`)."""
    rest = parse(_FLAGS, argv)
    flags.FLAGS.mark_as_parsed()  # absl's own (logging's) flags keep their defaults,
    logging.set_verbosity(logging.WARNING)  # and libraries stay quiet, as in paxlite's runs.
    return rest


def run() -> None:
    """Console-script entry point: on the host's CPU (an export only moves weights; a job's
    frozen weights are read onto one CPU device, never onto an accelerator's memory)."""
    jax.config.update("jax_platforms", "cpu")
    define_flags(_FLAGS)
    app.run(main, argv=sys.argv, flags_parser=_parse)
