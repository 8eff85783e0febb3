"""``python -m paxlite.t5x.infer``: T5X's ``t5x/infer.py`` command, run by paxlite.

A T5X user replaces ``python3 ${T5X_DIR}/t5x/infer.py`` by ``python -m paxlite.t5x.infer``
and keeps the rest::

    python -m paxlite.t5x.infer --gin_file=USER_DIR/my_infer.gin --gin_search_paths=USER_DIR \\
      --gin.CHECKPOINT_PATH=\\"/tmp/model_dir/checkpoint_1000\\" \\
      --gin.INFER_OUTPUT_DIR=\\"/tmp/infer\\" [--shard_id=N]

The gin files are T5X's (a model gin file and ``t5x/configs/runs/infer.gin``, which paxlite
has). ``infer.mode``: 'predict' (decode, as the gin files say: beam search or
``temperature_sample``), 'score' (the targets' log-likelihood) or 'predict_with_aux' (the
decodes and their scores). CHECKPOINT_PATH: as for ``paxlite.t5x.eval`` (modes 'specific'
and 'latest'); ``RestoreCheckpointConfig.dtype`` (infer.gin: 'bfloat16') is the
parameters' dtype. ``--shard_id`` (or ``infer.shard_id``) of ``infer.num_shards``: the
part of the dataset this job infers (all its processes together; T5X runs one job per
shard). Into INFER_OUTPUT_DIR goes what T5X writes:
``config.gin`` and ``model-info.txt`` (shard 0), and per task of the mixture
``<task>-<mode>.jsonl-<shard:05>-of-<shards:05>`` with its ``.COMPLETED`` (a task already
completed is skipped), written in chunks of ``infer.checkpoint_period`` batches.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Before TensorFlow (SeqIO's) loads.

import jax  # noqa: E402
from absl import flags  # noqa: E402
from etils import epath  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from paxlite.cli.exits import fail  # noqa: E402
from paxlite.cli.flags import FLAGS  # noqa: E402
from paxlite.formats.t5x import gin_run, infer_files  # noqa: E402
from paxlite.formats.t5x.inference import T5xModelFunctions  # noqa: E402
from paxlite.t5x import command, inference_run  # noqa: E402
from paxlite.train import summaries  # noqa: E402

flags.DEFINE_integer(
    "shard_id", None, "T5X: the dataset shard this process infers (overrides infer.shard_id)."
)


def main(argv: Sequence[str]) -> None:
    """Infers each task of the dataset's mixture, as T5X's ``infer`` does."""
    run, inference = inference_run.read_inference(gin_run.INFER, "INFER_OUTPUT_DIR")
    call = run.call
    shard_id = call.shard_id if FLAGS.shard_id is None else FLAGS.shard_id
    if not 0 <= shard_id < call.num_shards:
        fail(f"--shard_id={shard_id} is not in [0, infer.num_shards={call.num_shards}).")
    if len(inference.restore.paths) > 1:  # T5X: "Cannot restore multiple checkpoints".
        fail(
            f"CHECKPOINT_PATH names {len(inference.restore.paths)} checkpoints; infer reads "
            "one (T5X's too): give one path."
        )
    path = inference_run.checkpoint_paths(inference.restore)[0]
    output_dir = epath.Path(call.output_dir)
    job = inference_run.prepared_job(inference.knobs, str(output_dir), "INFER_OUTPUT_DIR")
    restored = inference_run.restored_params(job, path, inference.restore.dtype)
    if shard_id == 0:
        inference_run.write_first_files(job, output_dir, run.config_text, restored.state.params)
    dataset = inference.dataset
    functions = T5xModelFunctions(job, restored.shardings.params, int(dataset.batch_size))
    functions.params = restored.state.params
    import seqio

    for task in seqio.get_subtasks(seqio.get_mixture_or_task(dataset.mixture_or_task_name)):
        _infer_task(task, call, dataset, shard_id, functions, output_dir)


def _infer_task(
    task: Any,
    call: Any,
    dataset: Any,
    shard_id: int,
    functions: T5xModelFunctions,
    output_dir: epath.Path,
) -> None:
    """One task's inferences into its file (skipped when already completed)."""
    name = infer_files.output_name(
        task.name, call.mode, call.file_extension, shard_id, call.num_shards
    )
    if infer_files.completed(output_dir, name):
        print(f"paxlite: {output_dir / name} is completed already: task '{task.name}' skipped.")
        return
    vocabulary = task.output_features[call.output_vocab_feature_name].vocabulary
    chunk_size = int(call.checkpoint_period) * int(dataset.batch_size)
    chunks = _chunks(task, dataset, shard_id, call.num_shards, chunk_size, call.mode, functions)
    try:
        count = infer_files.write_task(
            output_dir,
            name,
            infer_files.tmp_name(task.name, shard_id, call.num_shards),
            call.mode,
            chunks,
            lambda ids: _decoded_text(vocabulary, ids),
            writes=jax.process_index() == 0,  # Every process computes; process 0 writes.
            barrier=multihost_utils.sync_global_devices,
        )
    except ValueError as e:
        fail(e)
    summaries.log(f"infer '{task.name}' ({call.mode}): {count} examples; wrote {output_dir / name}")


def _chunks(
    task: Any,
    dataset: Any,
    shard_id: int,
    num_shards: int,
    chunk_size: int,
    mode: str,
    functions: T5xModelFunctions,
) -> Iterator[Any]:
    """Per chunk of ``chunk_size`` examples, a callable computing its outputs."""
    import seqio

    lengths = dataset.task_feature_lengths
    examples = task.get_dataset(
        sequence_length=lengths,
        split=dataset.split,
        shuffle=False,
        num_epochs=1,
        shard_info=seqio.ShardInfo(index=shard_id, num_shards=num_shards),
        use_cached=dataset.use_cached,
        seed=dataset.seed,
    )
    features = seqio.EncDecFeatureConverter(pack=False)(examples, lengths)
    pairs = zip(examples.as_numpy_iterator(), features.as_numpy_iterator(), strict=True)
    while chunk := list(itertools.islice(pairs, chunk_size)):
        yield lambda chunk=chunk: _chunk_outputs(chunk, mode, functions)


def _chunk_outputs(
    chunk: list[tuple[dict, dict]], mode: str, functions: T5xModelFunctions
) -> infer_files.ChunkOutputs:
    """One chunk's task examples, outputs (in order) and aux values."""
    import tensorflow as tf

    examples = [example for example, _ in chunk]
    model_features = tf.data.Dataset.from_tensor_slices(
        {k: [f[k] for _, f in chunk] for k in chunk[0][1]}
    ).enumerate()
    aux: dict[str, list[Any]] = {}
    if mode == "score":
        indexed = functions.score(model_features)
    elif mode == "predict":
        indexed = functions.predict(model_features)
    else:
        indexed, aux = functions.predict_with_aux(model_features)
    return examples, [output for _, output in indexed], aux


def _decoded_text(vocabulary: Any, ids: Sequence[int]) -> str:
    """T5X's prediction text: the vocabulary's TF decoding of the ids (up to EOS)."""
    import tensorflow as tf

    return vocabulary.decode_tf(tf.constant(ids)).numpy().decode("utf-8")


parse = command.parser(__doc__)


def run() -> None:
    """Console-script entry point (``paxlite-t5x-infer``) and ``python -m``."""
    command.run(main, parse)


if __name__ == "__main__":
    sys.exit(run())
