"""``python -m paxlite.t5x.convert_tf_checkpoint``: T5X's ``t5x/scripts/convert_tf_checkpoint.py``,
which converts a Mesh TensorFlow checkpoint (``model.ckpt-<step>``), run by paxlite. With
plain flags::

    python -m paxlite.t5x.convert_tf_checkpoint \\
      --tf_checkpoint_path=gs://BUCKET/pretrained_models/base/model.ckpt-1000000 \\
      --output_dir=/tmp/base --output_format=t5x

or T5X's own gin form (a model gin file of the checkpoint's size, which must agree with it)::

    python -m paxlite.t5x.convert_tf_checkpoint --gin_file=MODEL.gin \\
      --gin.convert_checkpoint.model=%MODEL \\
      --gin.convert_checkpoint.tf_checkpoint_path=\\"gs://.../model.ckpt-1000000\\" \\
      --gin.convert_checkpoint.output_dir=\\"/tmp/t5x_checkpoints/base\\"

``--tf_checkpoint_path``: the prefix (its ``.index`` beside it) or its directory (the newest
step). ``--output_format``: ``t5x`` (T5X's ``checkpoint_<step>/``, as T5X's script writes it,
with a ``config.gin`` naming the model), ``hf`` (a Hugging Face ``T5ForConditionalGeneration``
directory; ``--sentencepiece_model`` copied in as ``spiece.model``, by default the vocabulary
the checkpoint's operative_config.gin names when that is a local file, else a line says none
is written) or ``paxlite`` (a job
directory's ``checkpoints/<step>/`` in the scanned layout paxlite's experiments train with, for
``--init_from`` or ``from_pretrained(dir, exp=...)``).
``--save_dtype``: float32 (T5X's default) or bfloat16. The model's sizes are the
checkpoint's. The t5x and hf outputs are written a tensor at a time (hf: safetensors files of
at most ``--max_shard_bytes``); paxlite's holds the model once (host arrays, filled a tensor
at a time) while orbax writes it.
docs/t5x.md has the commands for T5X's README's checkpoints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Before TensorFlow loads.

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags, logging  # noqa: E402
from etils import epath  # noqa: E402
from flax import traverse_util  # noqa: E402

from paxlite.checkpoints import checkpoint_sources, train_checkpoints  # noqa: E402
from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError  # noqa: E402
from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS  # noqa: E402
from paxlite.formats.hf import checkpoint as hf_checkpoint  # noqa: E402
from paxlite.formats.mtf import checkpoint as mtf_checkpoint  # noqa: E402
from paxlite.formats.mtf import convert, operative_config  # noqa: E402
from paxlite.formats.t5x import gin_run  # noqa: E402
from paxlite.formats.t5x.api import convert_script  # noqa: E402
from paxlite.runtime import job_config, platforms, storage  # noqa: E402
from paxlite.t5x import command  # noqa: E402
from paxlite.train.train_state import TrainState  # noqa: E402

FORMATS = ("t5x", "hf", "paxlite")
_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

flags.DEFINE_string("tf_checkpoint_path", None, "The MTF checkpoint: a prefix or its directory.")
flags.DEFINE_string("output_dir", None, "Where the converted checkpoint is written.")
flags.DEFINE_enum("output_format", "t5x", FORMATS, "What to write.")
flags.DEFINE_enum("save_dtype", "float32", sorted(_DTYPES), "The parameters' dtype written.")
flags.DEFINE_string(
    "sentencepiece_model", None, "hf: the SentencePiece model copied in as spiece.model."
)
flags.DEFINE_integer(
    "max_shard_bytes", hf_checkpoint.DEFAULT_MAX_SHARD_BYTES, "hf: the most bytes a file holds."
)

#: paxlite's flags with no place here -> what says it instead.
_DECIDED = {
    name: "the converter reads --tf_checkpoint_path and writes --output_dir"
    for name in ("exp", "job_log_dir", "print_config")
}


def main(argv: Sequence[str]) -> None:
    """Converts the checkpoint the flags (or T5X's gin form) name."""
    del argv
    logging.set_verbosity(logging.WARNING)  # Libraries stay quiet, as in paxlite's runs.
    command.reject_flags(_DECIDED, "convert_tf_checkpoint")
    path, output_dir, dtype, gin_shape = _request()
    storage.configure()
    platforms.choose()  # Before JAX is first touched: no TPU probing on a host without.
    try:
        prefix = mtf_checkpoint.prefix_of(storage.job_path(path))
        config_file, shape = mtf_checkpoint.shape_of_checkpoint(prefix)
    except CheckpointSourceError as e:
        fail(e)
    differ = convert.gin_model_mismatches(gin_shape, shape) if gin_shape is not None else []
    if differ:
        fail(
            f"convert_checkpoint.model is not the model of {prefix}: {'; '.join(differ)}; "
            "use the model gin file of the checkpoint's size."
        )
    _check_format_flags()
    output = storage.job_path(output_dir)
    job_config.check_job_dir_writable(output, name="--output_dir")
    _check_empty(output)
    spm = _sentencepiece_model(prefix) if FLAGS.output_format == "hf" else None
    described = convert.described(shape)
    print(f"paxlite: converting {prefix} ({described}; sizes from {config_file.name})")
    try:
        written = _convert(prefix, shape, output, dtype, spm)
    except (CheckpointSourceError, OSError, ValueError) as e:  # Storage and tensorstore's.
        _remove_written(output)  # It was empty: nothing of the user's is lost.
        fail(f"{storage.one_line(e)} (nothing written to {output})")
    print(f"paxlite: wrote {written}")


def _request() -> tuple[str, str, np.dtype, Any]:
    """``(checkpoint path, output dir, dtype, the gin model's sizes or None)`` from the flags
    or, with ``--gin_file``, from T5X's ``convert_checkpoint`` call."""
    if not FLAGS.gin_file:
        if not FLAGS.tf_checkpoint_path or not FLAGS.output_dir:
            fail(
                "give --tf_checkpoint_path=PREFIX_OR_DIR and --output_dir=DIR (or T5X's gin "
                "form: --gin_file=... --gin.convert_checkpoint.tf_checkpoint_path=...)."
            )
        return FLAGS.tf_checkpoint_path, FLAGS.output_dir, _DTYPES[FLAGS.save_dtype], None
    if FLAGS.tf_checkpoint_path or FLAGS.output_dir:
        fail(
            "with --gin_file the gin files name the checkpoint and the output "
            "(convert_checkpoint.tf_checkpoint_path, .output_dir); drop --tf_checkpoint_path "
            "and --output_dir."
        )
    call: convert_script.ConvertCall = command.read(gin_run.CONVERT).call
    name = str(getattr(call.save_dtype, "__name__", call.save_dtype))
    if name not in _DTYPES:
        fail(f"convert_checkpoint.save_dtype = {name}: give float32 or bfloat16.")
    return call.tf_checkpoint_path, call.output_dir, _DTYPES[name], call.t5_shape()


def _check_format_flags() -> None:
    """One line for a flag of another output format than the one asked for."""
    only_hf = {"sentencepiece_model": FLAGS.sentencepiece_model is not None}
    only_hf["max_shard_bytes"] = FLAGS["max_shard_bytes"].present
    for name, given in only_hf.items():
        if given and FLAGS.output_format != "hf":
            fail(f"--{name} is for --output_format=hf; this writes {FLAGS.output_format}.")


def _remove_written(output: epath.Path) -> None:
    """Removes what a failed conversion wrote into ``output`` (empty or new before)."""
    if output.exists():
        for child in output.iterdir():
            child.rmtree() if child.is_dir() else child.unlink()


def _check_empty(output: epath.Path) -> None:
    """Nothing already in --output_dir is overwritten."""
    if output.exists() and any(output.iterdir()):
        fail(f"--output_dir={output} is not empty; give a new directory (nothing is overwritten).")


def _convert(
    prefix: epath.Path, shape: Any, output: epath.Path, dtype: np.dtype, spm: epath.Path | None
) -> str:
    """Writes the output and says what it is."""
    kind = FLAGS.output_format
    if kind == "paxlite":
        step_dir = _to_paxlite(prefix, shape, output, dtype)
        return f"a paxlite checkpoint: {step_dir} (use --init_from={output})"
    source = checkpoint_sources.open_source(prefix, kind=_mtf_kind())
    try:
        if kind == "t5x":
            step_dir = convert.to_t5x(source, shape, output, dtype)
            return f"a T5X checkpoint: {step_dir}"
        files = convert.to_hf(source, shape, output, dtype, spm, FLAGS.max_shard_bytes)
        return f"a Hugging Face directory: {output} ({', '.join(files)})"
    finally:
        source.close()


def _mtf_kind() -> checkpoint_sources.Kind:
    return next(k for k in checkpoint_sources.KINDS if k.name == mtf_checkpoint.KIND)


def _sentencepiece_model(prefix: epath.Path) -> epath.Path | None:
    """--sentencepiece_model, else the operative config's vocabulary when it can be read."""
    if FLAGS.sentencepiece_model:
        given = storage.job_path(FLAGS.sentencepiece_model)
        if not given.is_file():
            fail(f"--sentencepiece_model={given} does not exist.")
        return given
    config = operative_config.read(prefix.parent)
    named = config.vocabulary if config is not None else None
    local = named is not None and not storage.is_remote(named) and epath.Path(named).is_file()
    if local:
        return epath.Path(named)
    print(
        "paxlite: no spiece.model will be written: give --sentencepiece_model=FILE"
        + (f" (the checkpoint's vocabulary is {named})." if named else ".")
    )
    return None


def _to_paxlite(prefix: epath.Path, shape: Any, output: epath.Path, dtype: np.dtype) -> epath.Path:
    """The model as host arrays (read a tensor at a time: the output, held once), saved as a
    paxlite job's checkpoint step by orbax (which copies what it writes to host buffers: on
    top of the model, up to the model again): its parameters, in the scanned layout paxlite's
    experiments train with (``USE_REPEATED_LAYER``), and its step."""
    source = checkpoint_sources.open_source(prefix, kind=_mtf_kind())
    try:
        step = convert.step_of(source)
        params = convert.our_params(source, shape, dtype)
    finally:
        source.close()
    host = jax.devices("cpu")[0]  # Host memory whatever the accelerator: no copy on CPU.
    params = {path: jax.device_put(array, host) for path, array in params.items()}
    state = TrainState(
        step=np.int32(step),
        params=traverse_util.unflatten_dict(params, sep="/"),
        opt_state={},
        nonfinite_steps=np.int32(0),
        first_nonfinite_step=np.int32(-1),
    )
    checkpointer = train_checkpoints.Checkpointer(output, max_to_keep=None, async_save=False)
    try:
        checkpointer.save(step, state, {})
        checkpointer.finish_pending()
    finally:
        checkpointer.close()
    return checkpointer.directory / str(step)


parse = command.parser(__doc__)


def run() -> None:
    """Console-script entry point (``paxlite-t5x-convert-tf-checkpoint``) and ``python -m``."""
    command.run(main, parse)


if __name__ == "__main__":
    sys.exit(run())
