"""T5X's infer outputs: ``<task>-<mode>.<ext>-<shard:05>-of-<shards:05>`` and its
``.COMPLETED`` marker in INFER_OUTPUT_DIR, written in chunks as T5X's ``infer`` writes them.

Each line is one example, in the dataset's order (T5X's ``write_inferences_to_file``):
``{"inputs": {<the task's *_pretokenized features>}, ...}`` with ``"prediction"`` (the
decoded text; mode predict), ``"score"`` (mode score), or ``"prediction"`` and
``"aux": {"scores": ...}`` (mode predict_with_aux). Chunks of ``checkpoint_period``
batches go to ``tmp-<task>-<shard>-of-<shards>/<name>-chunkNNNNN`` (each with its own
``.COMPLETED``; a rerun skips the chunks already written), then are merged into the output
file and the temporary folder removed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from etils import epath

#: One chunk's outputs: (its task examples, their predictions or scores, aux values).
ChunkOutputs = tuple[list[dict[str, Any]], list[Any], dict[str, list[Any]]]


def output_name(task: str, mode: str, extension: str, shard_id: int, num_shards: int) -> str:
    """T5X's file name of one task's inferences by one shard."""
    return f"{task}-{mode}.{extension}-{shard_id:05}-of-{num_shards:05}"


def completed(output_dir: epath.Path, name: str) -> bool:
    """Whether T5X's ``.COMPLETED`` marker of ``name`` exists (T5X then skips the task)."""
    return (output_dir / f"{name}.COMPLETED").exists()


def json_line(
    example: dict[str, Any], mode: str, output: Any, aux: dict[str, Any], decode: Callable
) -> str:
    """One example's line (``decode``: token ids -> text, the task's output vocabulary's)."""
    import seqio

    line: dict[str, Any] = {
        "inputs": {
            k: (v.decode("utf-8") if isinstance(v, bytes) else v)
            for k, v in example.items()
            if k.endswith("_pretokenized")
        }
    }
    if mode == "score":
        line["score"] = float(output)
    else:
        line["prediction"] = decode(output)
        if mode == "predict_with_aux":
            line["aux"] = {k: float(v) for k, v in aux.items()}
    return json.dumps(line, cls=seqio.TensorAndNumpyEncoder)


def write_task(
    output_dir: epath.Path,
    name: str,
    tmp_name: str,
    mode: str,
    chunks: Iterator[Callable[[], ChunkOutputs]],
    decode: Callable[[Sequence[int]], str],
    writes: bool = True,
    barrier: Callable[[str], None] = lambda name: None,
) -> int:
    """Writes a task's inferences chunk by chunk (``chunks``: a callable per chunk that
    computes it) under ``output_dir/tmp_name``, merges them into ``output_dir/name`` and
    marks it completed; returns the number of examples computed. A chunk completed by an
    earlier run is not recomputed. Every process computes each chunk (the model runs on all
    devices); only the one that ``writes`` (process 0) writes. ``barrier(name)`` waits for
    every process (T5X's ``sync_global_devices``): after each chunk, so that all decide on
    the next chunk from the same files, and around the merge."""
    tmp = output_dir / tmp_name
    if writes:
        tmp.mkdir(parents=True, exist_ok=True)
    count = 0
    paths = []
    for number, compute in enumerate(chunks):
        path = tmp / f"{name}-chunk{number:05}"
        paths.append(path)
        if not (tmp / f"{path.name}.COMPLETED").exists():
            count += _write_chunk(path, compute, mode, decode, writes)
        barrier(f"{name}:chunk{number:05}")
    if not paths:
        raise ValueError(f"no example to infer for {name}: the split is empty.")
    if writes:
        (output_dir / name).write_text("".join(p.read_text() for p in paths))
        tmp.rmtree()
        (output_dir / f"{name}.COMPLETED").write_text("")
    barrier(f"{name}:complete")
    return count


def _write_chunk(
    path: epath.Path,
    compute: Callable[[], ChunkOutputs],
    mode: str,
    decode: Callable[[Sequence[int]], str],
    writes: bool,
) -> int:
    """Computes one chunk and (where ``writes``) writes it with its ``.COMPLETED``."""
    examples, outputs, aux = compute()
    if writes:
        lines = [
            json_line(example, mode, output, {k: v[i] for k, v in aux.items()}, decode)
            for i, (example, output) in enumerate(zip(examples, outputs, strict=True))
        ]
        path.write_text("".join(line + "\n" for line in lines))
        (path.parent / f"{path.name}.COMPLETED").write_text("")
    return len(examples)


def tmp_name(task: str, shard_id: int, num_shards: int) -> str:
    """T5X's temporary folder of a task's shard."""
    return f"tmp-{task}-{shard_id:05}-of-{num_shards:05}"
