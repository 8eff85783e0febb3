"""The decode program: decode the job's decoder inputs with the current params.

The decoder inputs are built from the experiment's ``decoder_datasets()`` after
command-line overrides (``--fdl_set decoder_datasets[i].field=...``) by
``train.build_job``, which also checks here, before any checkpoint is read, that
they yield decode batches and that the model's stack can decode.

For each decoder input, one pass (one epoch, like a one-epoch eval) of jitted
decoding (``praxis_lite.decoding.sampling``), sharded like training: the batch over the
data axes, heads and the KV cache over 'mdl' (the cache's logical axes are mapped
by the experiment's rules). A batch of any size decodes: it is padded with zero
rows (``partitioning.pad_rows``) to what the data axes divide, and rows of prompt
length 0 are no examples. Results go to::

    <job_log_dir>/decoder_out/<input name>_step<N>.jsonl   one JSON object per example
    <job_log_dir>/summaries/decode_<input name>/           TensorBoard: decode_<name>/<metric>

JSONL fields: ``prompt``, ``prompt_ids``, ``decoded`` (text, via the input's
``ids_to_strings``, an EOS left out), ``decoded_ids`` (an EOS kept), ``target``,
``target_ids``, ``log_probs`` (per decoded token, under the model) and ``score``
(their sum; with beams, the beam rules' score); with ``num_return_sequences = n > 1``
these are the best sequence's and ``n_best`` lists all ``n`` (``decoded``,
``decoded_ids``, ``score``; best first). Metrics: the input's ``predict_metric_fns``
on (targets, decoded texts; postprocessed first by inputs that have ``postprocess``,
as SeqIO's evaluator does with a task's ``postprocess_fn``), plus ``num_examples``,
``mean_score`` and ``mean_decode_length``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec

from paxlite.experiments.tasks_lib import SingleTask
from paxlite.runtime import best_effort, partitioning
from paxlite.train import summaries
from praxis_lite.decoding import sampling, stop_strings
from praxis_lite.decoding.sampling import DecoderParams
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap

DecodeFn = Callable[[Any, NestedMap, jax.Array], dict[str, jax.Array]]
_REFERENCES = ("target_ids", "target_lengths")


class DecodeConfigError(ValueError):
    """A decoder input or the model cannot be decoded as configured (checked before decoding)."""


@runtime_checkable
class Postprocessing(Protocol):
    """An input whose texts are postprocessed before its predict metrics (SeqIOInput)."""

    def postprocess(self, text: str, *, example: Mapping[str, Any], is_target: bool) -> Any: ...


def check_can_decode(model: Any) -> None:
    """Raises :class:`DecodeConfigError` unless ``model`` can decode (its contract says why not)."""
    reason = model.decode_unsupported()
    if reason is not None:
        raise DecodeConfigError(reason)


def passed_through(model: Any) -> tuple[str, ...]:
    """The decode batch's keys the model decodes from (``decode_prompt_keys``: an LM's
    ``prefix_*``, a seq2seq model's ``input_*``) and the references, ``target_*``."""
    return (*model.decode_prompt_keys(), *_REFERENCES)


def check_decode_input(inp: BaseInput, model: Any) -> None:
    """Reads (and rewinds) ``inp``'s first batch; raises unless it is a decode batch of
    ``model``'s."""
    try:
        batch = inp.get_next()
    except StopIteration:
        raise DecodeConfigError(
            f"Decoder input '{inp.name}' is empty: it yields no batch to decode."
        ) from None
    inp.reset()
    check_decode_batch(batch, inp, passed_through(model))


def stop_table(inp: BaseInput, params: DecoderParams) -> stop_strings.StopStrings | None:
    """``params.stop_strings`` over ``inp``'s vocabulary (its ``token_bytes()``), or None
    without stop strings; DecodeConfigError when the input has no such vocabulary."""
    if not params.stop_strings:
        return None
    token_bytes = getattr(inp, "token_bytes", lambda: None)()
    if token_bytes is None:
        raise DecodeConfigError(
            f"Decoder input '{inp.name}' ({type(inp).__name__}) has no tokenizer to match "
            "task.decoder.stop_strings against; decode it with eos_token_id only, or use a "
            "SeqIOInput with a SentencePiece or Hugging Face vocabulary."
        )
    try:
        return stop_strings.StopStrings.build(params.stop_strings, token_bytes)
    except ValueError as e:
        raise DecodeConfigError(f"task.decoder.stop_strings: {e}") from None


def make_decode_fn(
    task: SingleTask, params: DecoderParams, max_new_tokens: int, stop: Any = None
) -> DecodeFn:
    """``decode(model_params, batch, key) -> outputs`` (a pure function; jit it).

    Outputs: ``tokens [B, N]``, ``lengths [B]``, ``log_probs [B, N]``, ``scores [B]``
    (``[B, n, ...]`` with ``num_return_sequences = n > 1``; see ``sampling.decode``) and
    the batch's prompt/target arrays (:func:`passed_through`), so that a replicated
    output holds every host's examples. The model decodes (the contract's ``decode``)
    from the batch's ``decode_prompt_keys()``; ``stop``: :func:`stop_table`'s.
    """
    model = task.model
    check_can_decode(model)
    ids_key, lengths_key = model.decode_prompt_keys()

    def decode_fn(model_params: Any, batch: NestedMap, key: jax.Array) -> dict[str, jax.Array]:
        out = model.decode(
            {"params": model_params},
            batch[ids_key],
            batch[lengths_key],
            key,
            params,
            max_new_tokens,
            stop,
        )
        return {**out, **{k: batch[k] for k in passed_through(model)}}

    return decode_fn


def check_decode_batch(batch: NestedMap, inp: BaseInput, keys: tuple[str, ...]) -> None:
    """Raises :class:`DecodeConfigError` naming the missing ``keys`` (the model's
    :func:`passed_through`) if ``batch`` is no decode batch of the model's."""
    missing = [k for k in keys if k not in batch]
    if missing:
        raise DecodeConfigError(
            f"Decoder input '{inp.name}' ({type(inp).__name__}) yields batches without "
            f"{', '.join(missing)} (it has {', '.join(sorted(batch))}); the model decodes "
            f"from {keys[0]}: a decoder-only LM's decoder dataset yields prefix/target batches "
            "(SyntheticLmInput with prompt_len > 0, or SeqIOInput with decode_form), an "
            "encoder-decoder's yields input/target batches (SyntheticSeq2SeqInput with "
            "decode=True, or SeqIOInput(encoder_decoder=True) with "
            "DecodeForm.INPUTS_TARGETS). Fix the experiment's decoder_datasets() or "
            "--fdl_set decoder_datasets[i]...; see docs/decoding.md."
        )


def example_rows(
    out: dict[str, np.ndarray],
    inp: BaseInput,
    eos_token_id: int | tuple[int, ...] | None,
    prompt_keys: tuple[str, str],
) -> list[dict]:
    """One JSON-ready dict per real example (prompt length > 0) of a decoded batch whose
    prompts are ``out[prompt_keys[0]]`` of lengths ``out[prompt_keys[1]]``; with several
    sequences per example (``tokens [B, n, N]``), the best one's fields and ``n_best``:
    ``[{"decoded", "decoded_ids", "score"}...]``, best first."""
    prompt_ids, prompt_lengths = (out[k] for k in prompt_keys)
    real = np.flatnonzero(prompt_lengths > 0)
    n_best = out["tokens"].ndim == 3
    tokens, lengths = (out[k][real] for k in ("tokens", "lengths"))
    log_probs, scores = (out[k][real] for k in ("log_probs", "scores"))
    if not n_best:
        tokens, lengths = tokens[:, None], lengths[:, None]
        log_probs, scores = log_probs[:, None], scores[:, None]
    sequences = _sequences(tokens, lengths, scores, inp, eos_token_id)
    prompts = inp.ids_to_strings(prompt_ids[real], prompt_lengths[real].tolist())
    targets = inp.ids_to_strings(out["target_ids"][real], out["target_lengths"][real].tolist())
    rows = []
    for i, r in enumerate(real):
        p, t = int(prompt_lengths[r]), int(out["target_lengths"][r])
        best = sequences[i][0]
        row = {
            "prompt": prompts[i],
            "prompt_ids": prompt_ids[r, :p].tolist(),
            "decoded": best["decoded"],
            "decoded_ids": best["decoded_ids"],
            "target": targets[i],
            "target_ids": out["target_ids"][r, :t].tolist(),
            "log_probs": [round(float(x), 6) for x in log_probs[i, 0, : int(lengths[i, 0])]],
            "score": best["score"],
        }
        if n_best:
            row["n_best"] = sequences[i]
        rows.append(row)
    return rows


def _sequences(
    tokens: np.ndarray,
    lengths: np.ndarray,
    scores: np.ndarray,
    inp: BaseInput,
    eos_token_id: int | tuple[int, ...] | None,
) -> list[list[dict]]:
    """Per example, its sequences (``tokens [E, n, N]`` of ``lengths [E, n]``) as
    ``{"decoded" (an ending EOS left out), "decoded_ids" (kept), "score"}``."""
    e, n, steps = tokens.shape
    flat, counts = tokens.reshape(e * n, steps), lengths.reshape(e * n)
    last = flat[np.arange(e * n), np.maximum(counts - 1, 0)]
    ended = (counts > 0) & sampling.is_eos(last, eos_token_id)
    texts = inp.ids_to_strings(flat, (counts - ended).tolist())
    return [
        [
            {
                "decoded": texts[i * n + j],
                "decoded_ids": flat[i * n + j, : int(counts[i * n + j])].tolist(),
                "score": float(scores[i, j]),
            }
            for j in range(n)
        ]
        for i in range(e)
    ]


def run_decode_pass(
    decode_fn: Callable[[Any, NestedMap, jax.Array, int], dict[str, jax.Array]],
    model_params: Any,
    inp: BaseInput,
    to_global: Callable[[NestedMap], Any],
    params: DecoderParams,
    step: int,
    keys: tuple[str, ...],
) -> tuple[list[dict], dict[str, float]]:
    """Decodes one pass of ``inp``: ``(rows, metrics)``; ``keys``: the model's
    :func:`passed_through` (prompt ids and lengths first).

    ``decode_fn(model_params, global_batch, key, max_new_tokens)`` returns
    replicated numpy-gettable outputs (see :func:`make_decode_fn`). The pass reads
    until the input is exhausted (a repeating input: ``eval_loop_num_batches`` batches;
    then rewinds it) with ``reset_for_eval``, else ``eval_loop_num_batches`` batches.
    """
    rows: list[dict] = []
    num_batches = 0
    start = time.perf_counter()
    base_key = jax.random.fold_in(jax.random.key(params.seed), step)
    one_epoch = inp.reset_for_eval and not inp.repeats
    while one_epoch or num_batches < inp.eval_loop_num_batches:
        try:
            batch = inp.get_next()
        except StopIteration:
            break
        check_decode_batch(batch, inp, keys)
        steps = params.max_new_tokens or int(batch["target_ids"].shape[1])
        key = jax.random.fold_in(base_key, num_batches)
        out = jax.device_get(decode_fn(model_params, to_global(batch), key, steps))
        host = {k: np.asarray(v) for k, v in out.items()}
        rows += example_rows(host, inp, params.eos_token_id, keys[:2])
        num_batches += 1
    if inp.reset_for_eval:
        inp.reset()
    if not rows:
        raise ValueError(f"Decoder input '{inp.name}' produced no example to decode.")
    metrics = {
        "num_examples": float(len(rows)),
        "num_batches": float(num_batches),
        "mean_score": float(np.mean([r["score"] for r in rows])),
        "mean_decode_length": float(np.mean([len(r["decoded_ids"]) for r in rows])),
        "seconds": time.perf_counter() - start,
    }
    targets, predictions = metric_texts(inp, rows)
    for metric_fn in inp.predict_metric_fns:
        for name, value in metric_fn(targets, predictions).items():
            metrics[name] = float(getattr(value, "value", value))
    return rows, metrics


def metric_texts(inp: BaseInput, rows: list[dict]) -> tuple[list[Any], list[Any]]:
    """``(targets, predictions)`` for the predict metric fns, one per row.

    The texts of the rows, passed through ``inp.postprocess`` (with
    ``example={'inputs': prompt ids, 'targets': target ids}``) where the input has it.
    """
    targets, predictions = [r["target"] for r in rows], [r["decoded"] for r in rows]
    if not isinstance(inp, Postprocessing):
        return targets, predictions
    examples = [
        {"inputs": np.asarray(r["prompt_ids"]), "targets": np.asarray(r["target_ids"])}
        for r in rows
    ]
    return (
        [
            inp.postprocess(t, example=e, is_target=True)
            for t, e in zip(targets, examples, strict=True)
        ],
        [
            inp.postprocess(p, example=e, is_target=False)
            for p, e in zip(predictions, examples, strict=True)
        ],
    )


def write_jsonl(path: epath.Path, rows: list[dict]) -> None:
    """Writes ``rows`` one JSON object per line (process 0 only)."""
    if jax.process_index() != 0:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def output_path(job_log_dir: epath.PathLike, name: str, step: int) -> epath.Path:
    return epath.Path(job_log_dir) / "decoder_out" / f"{name}_step{step}.jsonl"


class DecodeProgram:
    """Decoder inputs, jitted decode functions and writers of one run (built once).

    Args:
      task: the task (its model and ``decoder`` settings).
      inputs: the decoder inputs (``Job.decoder_inputs``).
      job_log_dir: where outputs and summaries go.
      params_shardings: the shardings of the model params (as trained).
      batch_sharding: the data-parallel sharding of a batch's leading axis.
      to_global: host-local numpy batch -> global arrays on ``batch_sharding`` (padded
        to what it divides, for ``for_job``).
    """

    def __init__(
        self,
        task: SingleTask,
        inputs: list[BaseInput],
        job_log_dir: epath.PathLike,
        params_shardings: Any,
        batch_sharding: NamedSharding,
        to_global: Callable[[NestedMap], Any],
    ):
        self.task = task
        self.params = task.decoder_params()
        self.job_log_dir = epath.Path(job_log_dir)
        self.inputs = list(inputs)
        self._to_global = to_global
        self._in_shardings = (
            params_shardings,
            batch_sharding,
            NamedSharding(batch_sharding.mesh, PartitionSpec()),
        )
        self._replicated = NamedSharding(batch_sharding.mesh, PartitionSpec())
        self._jitted: dict[tuple[int, str], Any] = {}
        self._stops = {i.name: stop_table(i, self.params) for i in self.inputs}
        self._layout = summaries.layout_of(task)
        self._writers = {
            i.name: summaries.writer_of(self.job_log_dir, self._layout.decode_run(i.name))
            for i in self.inputs
        }

    @classmethod
    def for_job(cls, job: Any, params_shardings: Any) -> DecodeProgram:
        """The program of a ``paxlite.runtime.job.Job``'s decoder inputs (which it must have)."""
        if not job.decoder_inputs:
            raise ValueError(
                "This run decodes, but the job has no decoder inputs; pass "
                "decoder_dataset_cfgs (the experiment's decoder_datasets()) to build_job."
            )
        layout = job.batch_sharding
        return cls(
            job.task,
            job.decoder_inputs,
            job.job_log_dir,
            params_shardings,
            layout,
            lambda b: partitioning.to_global(partitioning.pad_rows(b, layout), layout),
        )

    def _decode(
        self, model_params: Any, batch: Any, key: jax.Array, steps: int, *, name: str
    ) -> Any:
        """Decodes ``batch`` of input ``name`` (one program per steps and input)."""
        if (steps, name) not in self._jitted:
            self._jitted[steps, name] = jax.jit(
                make_decode_fn(self.task, self.params, steps, self._stops[name]),
                in_shardings=self._in_shardings,
                out_shardings=self._replicated,
            )
        return self._jitted[steps, name](model_params, batch, key)

    def run(self, model_params: Any, step: int) -> dict[str, dict[str, float]]:
        """Decodes every decoder input; writes JSONL and summaries; returns metrics by name."""
        results = {}
        for inp in self.inputs:
            rows, metrics = run_decode_pass(
                functools.partial(self._decode, name=inp.name),
                model_params,
                inp,
                self._to_global,
                self.params,
                step,
                passed_through(self.task.model),
            )
            path = output_path(self.job_log_dir, inp.name, step)
            write = functools.partial(write_jsonl, path, rows)
            wrote = best_effort.write(best_effort.Output.DECODER_OUTPUTS, path, write)
            scalars = self._layout.decode_scalars(inp.name, metrics)
            self._writers[inp.name].write_scalars(step, scalars)
            shown = ", ".join(
                f"{k} {v:.4f}"
                for k, v in metrics.items()
                if k not in ("num_examples", "num_batches", "seconds")
            )
            summaries.log(
                f"decode '{inp.name}' at step {step}: {int(metrics['num_examples'])} examples "
                f"in {metrics['seconds']:.1f} s; {shown}; {'wrote' if wrote else 'NOT written:'} "
                f"{path}"
            )
            results[inp.name] = metrics
        return results

    def close(self) -> None:
        """Closes the summary writers."""
        for writer in self._writers.values():
            writer.close()
