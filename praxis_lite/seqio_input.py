"""SeqIOInput: a BaseInput over a registered SeqIO Task or Mixture (Pax's ``SeqIOInput``).

Each host reads its own shard (``seqio.ShardInfo(infeed_host_index,
num_infeed_hosts)``), converts examples with ``seqio.DecoderFeatureConverter``
and yields ``[batch_size, T]`` numpy batches with the keys LanguageModel reads::

    ids          decoder_input_tokens (int32)
    labels       decoder_target_tokens (int32)
    weights      decoder_loss_weights (float32)
    paddings     1.0 where labels == 0 (float32)
    segment_ids  decoder_segment_ids (int32, packed inputs only)
    segment_pos  decoder_positions (int32, packed inputs only)

Pax's eval semantics (see BaseInput): training and rolling-eval inputs repeat and
drop the last partial batch. A one-epoch eval input (``reset_for_eval=True``)
stops after the same number of batches on every host: each host counts the
examples of every host's shard (once per process, cached; no communication), and
pads its short or missing batches with all-zero examples whose weights are 0, so
every real example is scored exactly once.

``get_state()`` is the number of batches read since the last reset; ``set_state``
rebuilds the (seeded, deterministic) pipeline and skips that many batches. The
skip re-reads the skipped data, so resuming late in a long run takes time.

Decoder inputs (``decode_form`` set; an experiment's ``decoder_datasets()``)
yield BaseInput's prompt/target batches instead, from one Task::

    prefix_ids      [B, 1 + P] int32: BOS (0), then the prompt; right-padded with 0
    prefix_lengths  [B]        int32: 1 + prompt tokens (0 for a padding example)
    target_ids      [B, T]     int32: the reference continuation (with the task's
                               EOS if it adds one); right-padded with 0
    target_lengths  [B]        int32

The prompt follows the BOS id 0 because that is how ``DecoderFeatureConverter``
(and seqio's prefix-LM converter) put each example before the model in training.
``DecodeForm.INPUTS_TARGETS``: prompt = the task's 'inputs' feature (``P`` =
``task_feature_lengths['inputs']``), target = its 'targets' (``T`` =
``task_feature_lengths['targets']``); for prompt -> completion tasks.
``DecodeForm.TARGETS_PREFIX``: for LM tasks with only 'targets': each example
(trimmed to ``task_feature_lengths['targets']`` = ``L`` tokens) is split into a
prompt of its first ``prompt_len`` tokens and the rest as target (``T = L -
prompt_len``); examples of ``prompt_len`` tokens or fewer have nothing to predict
and are skipped. Decoder inputs read like one-epoch eval inputs (the same
padding to an equal number of batches on every host); :meth:`SeqIOInput.postprocess`
applies the task's ``postprocess_fn`` before its ``predict_metric_fns`` score
the decoded text, as SeqIO's evaluator does.

This module also holds the small LM pieces shared by SeqIO tasks: the
concatenate-and-split preprocessors Pax took from T5, a vocabulary helper and
idempotent task registration.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import enum
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import seqio
import tensorflow as tf
from absl import logging

from praxis_lite.base_input import BaseInput, InputConfigError, InputDataError
from praxis_lite.py_utils import NestedMap

try:  # The input pipeline runs on the host; keep TensorFlow off the accelerators.
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # TF already initialized its devices.
    pass

_AUTOTUNE = tf.data.AUTOTUNE

# Inputs with a live pipeline. Their threads may be inside a task's Python code
# (numpy_function): at interpreter shutdown those can never finish and tearing the
# pipeline down would hang, so every input is closed at exit, before the shutdown.
_open_inputs: weakref.WeakValueDictionary[int, SeqIOInput] = weakref.WeakValueDictionary()
atexit.register(lambda: [inp.close() for inp in list(_open_inputs.values())])


class InputDataNotFoundError(InputDataError, FileNotFoundError):
    """Data or a vocabulary file that an input needs is not where it was looked for."""


class DecodeForm(enum.Enum):
    """Where a decoder input's prompts and targets come from (see the module docstring)."""

    INPUTS_TARGETS = "inputs_targets"  # prompt = 'inputs', target = 'targets'
    TARGETS_PREFIX = "targets_prefix"  # prompt = first prompt_len 'targets' tokens


@dataclasses.dataclass
class SeqIOInput(BaseInput):
    """Batches of a SeqIO Task or Mixture for a decoder-only LM.

    Attributes:
      mixture_name: a registered seqio Task or Mixture name.
      split_name: the split to read ('train', 'validation', ...).
      task_feature_lengths: sequence length per task feature, e.g. ``{'targets': 1024}``.
      feature_converter_pack: pack several examples into each row
        (``DecoderFeatureConverter(pack=True)``); adds segment_ids / segment_pos.
      shuffle: shuffle the examples; None: shuffle iff ``is_training``.
      shuffle_buffer_size: examples in the shuffle buffer; None: the Task's own
        (Tasks only; a Mixture's tasks use their own).
      model_vocab_size: if set, the task's output vocabulary must fit in it (ids
        past the model's embedding table are an error, not silent garbage).
      decode_form: None for LM batches; else this is a decoder input yielding
        prompt/target batches of one Task, formed as the DecodeForm says.
      prompt_len: prompt tokens per example with ``DecodeForm.TARGETS_PREFIX``
        (0 otherwise).
      data_flag: how a user points this input at other data, named by data errors
        (e.g. '--set=TEXT_DATA_PATH=PATH', '--tfds_data_dir=DIR'); empty: the
        path the task was registered with.
    """

    mixture_name: str = dataclasses.field(kw_only=True)
    task_feature_lengths: Mapping[str, int] = dataclasses.field(kw_only=True)
    split_name: str = "train"
    feature_converter_pack: bool = False
    shuffle: bool | None = None
    shuffle_buffer_size: int | None = None
    model_vocab_size: int | None = None
    decode_form: DecodeForm | None = None
    prompt_len: int = 0
    data_flag: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"SeqIOInput '{self.name}'"
        self.task_feature_lengths = dict(self.task_feature_lengths)
        if not isinstance(self.task_feature_lengths.get("targets"), int) or (
            self.task_feature_lengths["targets"] <= 0
        ):
            raise InputConfigError(
                f"{where}: task_feature_lengths needs a positive 'targets' length for a "
                f"decoder-only LM, got {self.task_feature_lengths}."
            )
        if self.shuffle_buffer_size is not None and self.shuffle_buffer_size <= 0:
            raise InputConfigError(f"{where}: shuffle_buffer_size must be > 0 or None.")
        self._provider = get_provider(self.mixture_name, where)
        if self.shuffle_buffer_size is not None and not isinstance(self._provider, seqio.Task):
            raise InputConfigError(
                f"{where}: shuffle_buffer_size applies to a Task; {self.mixture_name!r} is a "
                "Mixture whose tasks use their own buffer sizes. Leave it None."
            )
        flag = self.data_flag
        for task in seqio.get_subtasks(self._provider):
            _check_vocabularies(task, where)
            _check_tfds_data(task, self.split_name, where)  # Before splits: TFDS reads them.
            _check_split(task, self.split_name, where)
            _check_files(task, self.split_name, where, flag or "the task's file pattern")
            _check_tfds_files(task, self.split_name, where, flag or "--tfds_data_dir=DIR")
        if self.model_vocab_size is not None:
            size = self._vocabulary().vocab_size
            if size > self.model_vocab_size:
                raise InputConfigError(
                    f"{where}: the vocabulary of {self.mixture_name!r} has {size} ids but the "
                    f"model's vocabulary has {self.model_vocab_size}; raise the model's vocab "
                    f"size (the experiment's VOCAB_SIZE knob) to at least {size}."
                )
        self._check_decode_form(where)
        if self.repeats:
            self._check_yields_examples()
        self._eval_batches: int | None = None
        self._build(skip=0)

    # ----- BaseInput -----

    def get_next(self) -> NestedMap:
        """The next ``[batch_size, T]`` batch; StopIteration at the end of a finite input."""
        if self._replay:
            batch = self._replay.pop(0)
        elif self.reset_for_eval:
            batch = self._next_padded()
        else:
            batch = self._to_batch(self._next_raw())
        self._num_batches += 1
        if self._num_batches == 1:
            self._first_batch = batch
        return batch

    def reset(self) -> None:
        """Rewinds to the first batch (cheaply when at most one batch was read)."""
        if self._iterator is None:  # Closed.
            self._build(skip=0)
            return
        if self._num_batches == 0:
            return
        if self._num_batches == 1 and self._first_batch is not None:
            # The pipeline is deterministic: replay the one batch read instead of
            # rebuilding (and refilling shuffle buffers) after the trainer's sample batch.
            self._replay = [self._first_batch]
            self._num_batches = 0
            return
        self._build(skip=0)

    def get_state(self) -> dict[str, Any]:
        """``{'num_batches': k, 'num_infeed_hosts': n}``: k batches read since the last reset."""
        return {"num_batches": self._num_batches, "num_infeed_hosts": self.num_infeed_hosts}

    def set_state(self, state: dict[str, Any]) -> None:
        """Rebuilds the pipeline and skips ``state['num_batches']`` batches."""
        hosts = state.get("num_infeed_hosts", self.num_infeed_hosts)
        if hosts != self.num_infeed_hosts:
            logging.warning(
                "SeqIOInput '%s': the state was saved with %d input hosts, now %d; the "
                "shards differ, so the resumed stream is not the one the run would have read.",
                self.name,
                hosts,
                self.num_infeed_hosts,
            )
        self._build(skip=int(state["num_batches"]))

    @property
    def score_metric_fns(self) -> Sequence[Callable[[list[str], list[float]], dict[str, Any]]]:
        """The score metric fns of the task (of every task of a Mixture)."""
        fns: list[Callable] = []
        for task in seqio.get_subtasks(self._provider):
            fns += [fn for fn in task.score_metric_fns if fn not in fns]
        return fns

    @property
    def predict_metric_fns(self) -> Sequence[Callable[[list[str], list[str]], dict[str, Any]]]:
        """The predict metric fns of the task (of every task of a Mixture)."""
        fns: list[Callable] = []
        for task in seqio.get_subtasks(self._provider):
            fns += [fn for fn in task.predict_metric_fns if fn not in fns]
        return fns

    def ids_to_strings(self, ids: np.ndarray, lengths: Sequence[int] | None = None) -> list[str]:
        """Detokenizes rows of ``ids [B, T]`` with the task's 'targets' vocabulary.

        Padding ids (0) are dropped; as in Pax, decoding stops after the first EOS.
        """
        vocab = self._vocabulary()
        ids = np.asarray(ids)
        lengths = [ids.shape[1]] * ids.shape[0] if lengths is None else lengths
        rows = [
            [int(t) for t in row[: int(n)] if t != 0] for row, n in zip(ids, lengths, strict=True)
        ]
        return [vocab.decode(row) for row in rows]

    def postprocess(self, text: str, *, example: Mapping[str, Any], is_target: bool) -> Any:
        """The task's ``postprocess_fn(text, example=..., is_target=...)`` (identity if none).

        Applied to targets and predictions before the predict metric fns, as
        SeqIO's evaluator does. A Mixture's examples are not told apart: identity.
        """
        if not isinstance(self._provider, seqio.Task):
            return text
        return self._provider.postprocess_fn(text, example=example, is_target=is_target)

    def _check_decode_form(self, where: str) -> None:
        """Raises unless decode_form / prompt_len fit each other, the task and the lengths."""
        form, lengths = self.decode_form, self.task_feature_lengths
        if form is not DecodeForm.TARGETS_PREFIX and self.prompt_len:
            raise InputConfigError(
                f"{where}: prompt_len={self.prompt_len} applies to "
                "decode_form=DecodeForm.TARGETS_PREFIX only; set that form or prompt_len=0."
            )
        if form is None:
            return
        if self.is_training:
            raise InputConfigError(
                f"{where}: decode_form makes a decoder input (prompt/target batches); it "
                "cannot feed training. Set is_training=False (and reset_for_eval=True)."
            )
        if self.feature_converter_pack:
            raise InputConfigError(
                f"{where}: decode_form yields one example per row; set "
                "feature_converter_pack=False."
            )
        if not isinstance(self._provider, seqio.Task):
            raise InputConfigError(
                f"{where}: a decoder input reads one Task (its postprocess_fn and metrics), "
                f"but {self.mixture_name!r} is a Mixture; list one decoder input per task."
            )
        if form is DecodeForm.INPUTS_TARGETS:
            if "inputs" not in self._provider.output_features:
                raise InputConfigError(
                    f"{where}: DecodeForm.INPUTS_TARGETS needs an 'inputs' feature, but task "
                    f"{self.mixture_name!r} has only {sorted(self._provider.output_features)}; "
                    "use decode_form=DecodeForm.TARGETS_PREFIX with prompt_len=N to prompt "
                    "with the first N tokens of each example."
                )
            if not isinstance(lengths.get("inputs"), int) or lengths["inputs"] <= 0:
                raise InputConfigError(
                    f"{where}: DecodeForm.INPUTS_TARGETS needs a positive 'inputs' length in "
                    f"task_feature_lengths (the longest prompt), got {lengths}."
                )
        elif not 0 < self.prompt_len < lengths["targets"]:
            raise InputConfigError(
                f"{where}: DecodeForm.TARGETS_PREFIX needs 0 < prompt_len < "
                f"task_feature_lengths['targets'] ({lengths['targets']}), got prompt_len="
                f"{self.prompt_len}; the rest of each example is the target."
            )

    # ----- pipeline -----

    @property
    def shuffles(self) -> bool:
        """Whether examples are shuffled (``shuffle``, or ``is_training`` when None)."""
        return self.shuffle if self.shuffle is not None else self.is_training

    def _vocabulary(self) -> seqio.Vocabulary:
        return self._provider.output_features["targets"].vocabulary

    def _examples(
        self, shard_index: int, num_epochs: int | None, shuffle: bool | None = None
    ) -> tf.data.Dataset:
        """The converted (unbatched) examples of one host's shard (``shuffle``: ``shuffles``)."""
        kwargs: dict[str, Any] = dict(
            sequence_length=self.task_feature_lengths,
            split=self.split_name,
            shuffle=self.shuffles if shuffle is None else shuffle,
            seed=self.seed,
            shard_info=(
                seqio.ShardInfo(index=shard_index, num_shards=self.num_infeed_hosts)
                if self.num_infeed_hosts > 1
                else None
            ),
            num_epochs=num_epochs,
        )
        if self.shuffle_buffer_size is not None and self.shuffles:
            kwargs["shuffle_buffer_size"] = self.shuffle_buffer_size
        ds = self._provider.get_dataset(**kwargs)
        if self.decode_form is not None:
            return self._decode_examples(ds)
        converter = seqio.DecoderFeatureConverter(pack=self.feature_converter_pack)
        return converter(ds, self.task_feature_lengths)

    def _decode_examples(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """Task examples -> fixed-width prompt/target examples (see the module docstring)."""
        lengths = self.task_feature_lengths
        if self.decode_form is DecodeForm.INPUTS_TARGETS:
            prompt_width, target_width = lengths["inputs"], lengths["targets"]

            def split(ex):
                return ex["inputs"][:prompt_width], ex["targets"][:target_width]

        else:
            n = self.prompt_len
            prompt_width, target_width = n, lengths["targets"] - n
            ds = ds.filter(lambda ex: tf.size(ex["targets"]) > n)

            def split(ex):
                tokens = ex["targets"][: lengths["targets"]]
                return tokens[:n], tokens[n:]

        def pad(tokens: tf.Tensor, width: int) -> tf.Tensor:
            tokens = tf.cast(tokens, tf.int32)
            padded = tf.pad(tokens, [[0, width - tf.size(tokens)]])
            return tf.ensure_shape(padded, [width])

        def to_decode(ex):
            prompt, target = split(ex)
            prompt = tf.concat([tf.zeros([1], tf.int32), tf.cast(prompt, tf.int32)], 0)
            return {
                "prefix_ids": pad(prompt, prompt_width + 1),
                "prefix_lengths": tf.size(prompt, out_type=tf.int32),
                "target_ids": pad(target, target_width),
                "target_lengths": tf.size(target, out_type=tf.int32),
            }

        return ds.map(to_decode, num_parallel_calls=_AUTOTUNE)

    def _build(self, skip: int) -> None:
        """(Re)creates this host's batch iterator, positioned after ``skip`` batches."""
        ds = self._examples(self.infeed_host_index, None if self.repeats else 1)
        # One-epoch eval keeps the last partial batch (padded in numpy); all else drops it.
        ds = ds.batch(self.batch_size, drop_remainder=not self.reset_for_eval)
        self._spec = ds.element_spec
        if skip:
            ds = ds.skip(skip)
        options = tf.data.Options()
        options.deterministic = True
        ds = ds.with_options(options).prefetch(_AUTOTUNE)
        self._iterator = ds.as_numpy_iterator()
        _open_inputs[id(self)] = self
        self._num_batches = skip
        self._replay: list[NestedMap] = []
        self._first_batch: NestedMap | None = None

    def close(self) -> None:
        """Drops the pipeline's iterator (its threads end); ``reset`` rebuilds it."""
        self._iterator = None
        self._replay, self._first_batch = [], None

    def _next_raw(self) -> dict[str, np.ndarray]:
        """The pipeline's next batch; damaged or missing data becomes one InputDataError.

        After a read error the pipeline is closed at once: its other threads may be
        inside the task's Python code, and could not finish at interpreter shutdown.
        """
        if self._iterator is None:
            raise InputConfigError(f"SeqIOInput '{self.name}' is closed; reset() it first.")
        try:
            return next(self._iterator)
        except StopIteration:
            if self._num_batches == 0 and (self.repeats or self.num_infeed_hosts == 1):
                raise self._no_examples_error() from None  # (Multi-host eval: _next_padded.)
            raise
        except tf.errors.OpError as e:
            error = self._read_error(e)
        # Outside the except block: the error must not keep the iterator alive as context.
        self.close()
        raise error

    def _check_yields_examples(self) -> None:
        """Raises unless one epoch of this host's shard yields an example.

        A repeating pipeline whose every example is filtered out never returns (it
        reads its files again and again), so this reads up to the first example of
        one unshuffled epoch before the input is used.
        """
        try:
            found = any(True for _ in self._examples(self.infeed_host_index, 1, False).take(1))
        except tf.errors.OpError as e:
            error = self._read_error(e)
        else:
            error = None if found else self._no_examples_error()
        if error is not None:  # Raised outside the except: no pipeline kept alive as context.
            raise error

    def _split_files(self) -> list[str]:
        """The files every task of this input reads for ``split_name``."""
        files: list[str] = []
        for task in seqio.get_subtasks(self._provider):
            files += split_files(task, self.split_name)
        return files

    def _no_examples_error(self) -> InputDataError:
        files = self._split_files()
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return InputDataError(
            f"SeqIOInput '{self.name}': split {self.split_name!r} of {self.mixture_name!r} "
            f"yields no examples: its files ({shown}) hold no documents, or every one was "
            f"filtered out; point {self.data_flag or 'the task'} at files with documents."
        )

    def _read_error(self, e: tf.errors.OpError) -> InputDataError:
        """The one-line InputDataError for an error TensorFlow raised while reading."""
        where = f"SeqIOInput '{self.name}'"
        fix = self.data_flag or "the task"
        message = tf_error_message(e)
        marker = f"{InputDataError.__name__}: "
        if marker in message:  # Raised by a task's own parsing code (e.g. a JSONL line).
            return InputDataError(f"{where}: {message.split(marker, 1)[1].splitlines()[0]}")
        if isinstance(e, tf.errors.DataLossError):
            bad = find_bad_tfrecord(self._split_files())
            if bad:
                return InputDataError(
                    f"{where}: {bad}; re-create or remove that file, or point {fix} at "
                    "undamaged files."
                )
        return InputDataError(
            f"{where}: reading split {self.split_name!r} of {self.mixture_name!r} failed: "
            f"{type(e).__name__}: {message.splitlines()[0][:300]}; fix the data or point "
            f"{fix} at other files."
        )

    def _next_padded(self) -> NestedMap:
        """One-epoch eval: real batches padded to batch_size, then all-zero batches."""
        total = self._num_eval_batches()
        if total == 0:
            raise self._no_examples_error()  # Not one example on any host.
        if total is not None and self._num_batches >= total:
            raise StopIteration
        try:
            raw = self._next_raw()
        except StopIteration:
            if total is None:  # A single host stops when its data ends.
                raise
            raw = {
                k: np.zeros((0, *s.shape[1:]), s.dtype.as_numpy_dtype)
                for k, s in self._spec.items()
            }
        missing = self.batch_size - len(next(iter(raw.values())))
        if missing:
            raw = {
                k: np.concatenate([v, np.zeros((missing, *v.shape[1:]), v.dtype)])
                for k, v in raw.items()
            }
        return self._to_batch(raw)

    def _num_eval_batches(self) -> int | None:
        """Batches every host yields in one eval epoch (None with one host: until the end)."""
        if self.num_infeed_hosts == 1:
            return None
        if self._eval_batches is None:
            counts = self.shard_example_counts()
            self._eval_batches = -(-max(counts) // self.batch_size)
            logging.info(
                "SeqIOInput '%s': %s examples per host shard; %d eval batches on every host.",
                self.name,
                counts,
                self._eval_batches,
            )
        return self._eval_batches

    def shard_example_counts(self) -> tuple[int, ...]:
        """Converted examples in one epoch of every host's shard (counted once per process)."""
        key = (
            self.mixture_name,
            self.split_name,
            tuple(sorted(self.task_feature_lengths.items())),
            self.feature_converter_pack,
            self.shuffles,
            self.seed,
            self.shuffle_buffer_size,
            self.num_infeed_hosts,
            self.decode_form,
            self.prompt_len,
        )
        cached = _SHARD_COUNTS.get(key)
        if cached is not None and cached[0] is self._provider:
            return cached[1]
        counts = tuple(
            _count(self._examples(i, num_epochs=1)) for i in range(self.num_infeed_hosts)
        )
        _SHARD_COUNTS[key] = (self._provider, counts)
        return counts

    def _to_batch(self, raw: Mapping[str, np.ndarray]) -> NestedMap:
        if self.decode_form is not None:
            return NestedMap({k: np.asarray(v, np.int32) for k, v in raw.items()})
        labels = raw["decoder_target_tokens"].astype(np.int32)
        batch = NestedMap(
            ids=raw["decoder_input_tokens"].astype(np.int32),
            labels=labels,
            weights=raw["decoder_loss_weights"].astype(np.float32),
            paddings=(labels == 0).astype(np.float32),
        )
        if self.feature_converter_pack:
            batch.segment_ids = raw["decoder_segment_ids"].astype(np.int32)
            batch.segment_pos = raw["decoder_positions"].astype(np.int32)
        return batch


# (mixture, split, lengths, pack, shuffle, seed, buffer, hosts, decode form, prompt len)
# -> (provider, counts per shard).
_SHARD_COUNTS: dict[tuple, tuple[Any, tuple[int, ...]]] = {}


def _count(ds: tf.data.Dataset) -> int:
    """Examples in ``ds`` (a dataset of dicts of tensors)."""

    def add(total, batch):
        first = next(iter(batch.values()))
        return total + tf.shape(first, out_type=tf.int64)[0]

    return int(ds.batch(1024).reduce(np.int64(0), add))


# ----- checks with errors that say what was looked for and how to fix it -----


def get_provider(name: str, where: str = "SeqIO") -> seqio.Task | seqio.Mixture:
    """The registered Task or Mixture ``name``; an error naming the closest ones if none."""
    tasks, mixtures = set(seqio.TaskRegistry.names()), set(seqio.MixtureRegistry.names())
    if name in tasks or name in mixtures:
        return seqio.get_mixture_or_task(name)
    known = sorted(tasks | mixtures)
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
    if close:
        listed = f"Closest registered names: {', '.join(close)}."
    elif known:
        more = " ..." if len(known) > 20 else ""
        listed = f"Registered ({len(known)}): {', '.join(known[:20])}{more}."
    else:
        listed = "No Task or Mixture is registered."
    raise InputConfigError(
        f"{where}: no SeqIO Task or Mixture named {name!r}. {listed} Register it before "
        "the input is built (experiments do so in datasets(); otherwise import the module "
        "that registers it)."
    )


def _check_split(task: seqio.Task, split: str, where: str) -> None:
    splits = list(task.source.splits)
    if split not in splits:
        raise InputConfigError(
            f"{where}: task {task.name!r} has no split {split!r}; it has {splits}. "
            "Set split_name to one of them, or register the task with that split."
        )


def _check_files(task: seqio.Task, split: str, where: str, fix: str) -> None:
    """Raises unless a file source's files for ``split`` exist, hold data and start well.

    Each file must be non-empty; a source with a ``check_file(path, fix)`` method
    (the text tasks' sources) also has it look at the start of each file.
    """
    source = task.source
    if not isinstance(source, seqio.FileDataSource):
        return
    files = source.list_shards(split)
    if not files:
        pattern = getattr(source, "_split_to_filepattern", {}).get(split, source)
        raise InputDataNotFoundError(
            f"{where}: no file matches {pattern!r} (split {split!r} of task {task.name!r}); "
            f"point {fix} at existing files."
        )
    check_file = getattr(source, "check_file", None)
    for path in files:
        what = f"split {split!r} of task {task.name!r}"
        _check_not_empty(path, what, where, f"point {fix} at files with data")
        if check_file is not None:
            try:
                check_file(path, fix)
            except InputDataError as e:
                raise InputDataError(f"{where}: {e}") from None


def _check_not_empty(path: str, what: str, where: str, fix: str) -> None:
    """Raises if ``path`` (a file of ``what``) is missing or has 0 bytes; ``fix`` ends it."""
    try:
        size = tf.io.gfile.stat(path).length
    except tf.errors.OpError:
        raise InputDataNotFoundError(f"{where}: {path} ({what}) does not exist; {fix}.") from None
    if size == 0:
        raise InputDataError(f"{where}: {path} ({what}) is empty (0 bytes); {fix}.")


def tf_error_message(e: tf.errors.OpError) -> str:
    """``e``'s message without TensorFlow's function-node prefix and op suffix."""
    message = e.message
    if message.startswith("{{function_node"):
        message = message.split("}} ", 1)[-1]
    return message.split(" [Op:", 1)[0].strip()


def check_tfrecord(path: str, fix: str, *, walk: bool = True) -> None:
    """Raises :class:`InputDataError` (ending with ``fix``) if ``path`` is a bad TFRecord file.

    The first record must read; with ``walk``, the record lengths must also add up
    to the file's size (TensorFlow reads a file cut inside a record header as if it
    ended there, silently dropping the rest).
    """
    try:
        for _ in tf.data.TFRecordDataset(path).take(1):
            pass
    except tf.errors.OpError as e:
        raise InputDataError(
            f"{path}: record 1 cannot be read ({tf_error_message(e)}): the file is "
            f"truncated or not a TFRecord file; {fix}."
        ) from None
    problem = tfrecord_framing_problem(path) if walk else None
    if problem:
        raise InputDataError(f"{problem}; {fix}.")


_TFRECORD_FRAMING = 16  # Bytes around each record: length (8), its CRC (4), data CRC (4).


def tfrecord_framing_problem(path: str) -> str | None:
    """``'<path>: record <n> is cut off ...'`` if the record lengths overrun the file, or None.

    Reads the 8-byte length of each record and skips its data: cheap next to
    reading the records, but one seek per record.
    """
    size = tf.io.gfile.stat(path).length
    opener = tf.io.gfile.GFile if "://" in path else open
    offset, number = 0, 0
    with opener(path, "rb") as f:
        while offset < size:
            number += 1
            f.seek(offset)
            header = f.read(8)
            end = offset + _TFRECORD_FRAMING
            if len(header) == 8:
                end += int.from_bytes(header, "little")
            if end > size:
                return (
                    f"{path}: record {number} is cut off (it ends at byte {end}, the file at "
                    f"{size}): the file is truncated"
                )
            offset = end
    return None


def find_bad_tfrecord(files: Sequence[str]) -> str | None:
    """``'<file>: record <n> is ...'`` for the first cut-off or unreadable record, or None.

    Reads every record of every file: for after TensorFlow reported damage at a
    byte offset without naming the file, or sizes did not add up.
    """
    for path in files:
        problem = tfrecord_framing_problem(path)
        if problem:
            return problem
        count = 0
        try:
            for _ in tf.data.TFRecordDataset(path):
                count += 1
        except tf.errors.OpError as e:
            return (
                f"{path}: record {count + 1} is damaged ({tf_error_message(e)}; "
                f"the {count} records before it read)"
            )
    return None


def split_files(task: seqio.Task, split: str) -> list[str]:
    """The files ``task`` reads for ``split`` (a file source's shards or a TFDS split's)."""
    source = task.source
    if isinstance(source, seqio.FileDataSource):
        return list(source.list_shards(split))
    if isinstance(source, seqio.TfdsDataSource) and not source.tfds_dataset.tfds_splits:
        info = source.tfds_dataset.builder.info
        if split in info.splits:
            return [os.fspath(p) for p in info.splits[split].filepaths]
    return []


_VOCAB_FIX = (
    "point the task at a SentencePiece .model file; the LM experiments take it from their "
    "VOCAB_PATH knob (--set VOCAB_PATH=/path/to/spm.model)"
)


def _check_vocabularies(task: seqio.Task, where: str) -> None:
    """Raises if a SentencePiece model file of the task is missing, empty or unreadable."""
    for feature_name, feature in task.output_features.items():
        path = getattr(feature.vocabulary, "sentencepiece_model_file", None)
        if not path:
            continue
        what = (
            f"the SentencePiece vocabulary {path!r} (feature {feature_name!r} of task "
            f"{task.name!r})"
        )
        try:
            found, why = tf.io.gfile.exists(path), "does not exist"
        except tf.errors.OpError as e:
            found, why = False, f"cannot be read ({e.message.splitlines()[0]})"
        if not found:
            raise InputDataNotFoundError(f"{where}: {what} {why}; {_VOCAB_FIX}.")
        problem = _sentencepiece_problem(path)
        if problem:
            raise InputDataError(f"{where}: {what} {problem}; {_VOCAB_FIX}.")


def _sentencepiece_problem(path: str) -> str | None:
    """Why ``path`` is not a usable SentencePiece model (empty, truncated, ...), or None."""
    import sentencepiece  # seqio's own dependency.

    with tf.io.gfile.GFile(path, "rb") as f:
        proto = f.read()
    if not proto:
        return "is empty (0 bytes)"
    try:
        sentencepiece.SentencePieceProcessor(model_proto=proto)
    except (RuntimeError, OSError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        why = "its protobuf does not parse" if "ParseFromArray" in why else why[:200]
        return f"is not a SentencePiece model ({why}: truncated, or another kind of file)"
    return None


def _default_tfds_data_dir() -> str:
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def _check_tfds_data(task: seqio.Task, split: str, where: str) -> None:
    """Raises if a TFDS source's prepared data (or the split) is not in its data dir.

    Checked before reading, because TFDS would otherwise try to download and
    prepare the dataset (for C4: terabytes, or a hang without network).
    """
    source = task.source
    if not isinstance(source, seqio.TfdsDataSource) or source.tfds_dataset.tfds_splits:
        return
    loader = source.tfds_dataset
    name, data_dir = loader.get_split_params(split)
    data_dir = data_dir or _default_tfds_data_dir()
    fix = (
        f"Put the prepared dataset under DIR/{name.replace(':', '/')} (e.g. with "
        "`tfds build`, or copy it) and pass --tfds_data_dir=DIR (seqio's data dir "
        "override), or set TFDS_DATA_DIR=DIR."
    )
    try:
        builder = loader.builder
    except Exception as e:  # TFDS raises many kinds; all mean "not there".  # noqa: BLE001
        first_line = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputDataNotFoundError(
            f"{where}: TFDS dataset {name!r} of task {task.name!r} was not found in data dir "
            f"{data_dir!r} ({type(e).__name__}: {first_line[:300]}). {fix}"
        ) from None
    info_file = os.path.join(os.fspath(builder.data_dir), "dataset_info.json")
    if not tf.io.gfile.exists(info_file):
        raise InputDataNotFoundError(
            f"{where}: TFDS dataset {name!r} of task {task.name!r} is not prepared in data dir "
            f"{data_dir!r}: {info_file} does not exist. {fix}"
        )


def _check_tfds_files(task: seqio.Task, split: str, where: str, fix: str) -> None:
    """Raises if a prepared TFDS split has no examples, or files missing, empty or damaged.

    The first record of each file is read, and local files must add up to the size
    dataset_info.json implies (its bytes of serialized examples, plus 16 bytes of
    TFRecord framing per example, or without them).
    """
    source = task.source
    if not isinstance(source, seqio.TfdsDataSource) or source.tfds_dataset.tfds_splits:
        return
    info = source.tfds_dataset.builder.info.splits[split]
    files = split_files(task, split)
    what = f"split {split!r} of TFDS dataset {source.tfds_dataset.name!r}"
    fix = f"re-create the prepared dataset (e.g. with `tfds build`), or pass {fix} of a good copy"
    if info.num_examples == 0 or not files:
        raise InputDataError(f"{where}: {what} has no examples in its dataset_info.json; {fix}.")
    for path in files:
        _check_not_empty(path, what, where, fix)
        try:
            check_tfrecord(path, fix, walk=False)  # Sizes are checked below.
        except InputDataError as e:
            raise InputDataError(f"{where}: {e}") from None
    if any("://" in path for path in files):
        return  # A remote stat per shard is slow; damage is then found while reading.
    size = sum(os.path.getsize(path) for path in files)
    framed = info.num_bytes + 16 * info.num_examples
    if info.num_bytes and size not in (info.num_bytes, framed):
        bad = find_bad_tfrecord(files) or (
            f"its {len(files)} files hold {size} bytes, but dataset_info.json implies {framed}"
        )
        raise InputDataError(f"{where}: {what}: {bad}; {fix}.")


# ----- shared pieces of LM tasks -----


def make_vocabulary(vocab_path: str | None) -> seqio.Vocabulary:
    """A SentencePiece vocabulary at ``vocab_path``, or bytes (``ByteVocabulary``) if None."""
    if vocab_path is None:
        return seqio.ByteVocabulary()
    return seqio.SentencePieceVocabulary(vocab_path)


def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128, **unused: Any
) -> tf.data.Dataset:
    """Concatenates the tokens of every ``batch_size`` consecutive examples into one.

    T5's preprocessor of that name: keeps only ``feature_key``; padding (0) is dropped.
    """
    del unused
    ds = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=_AUTOTUNE)
    ds = ds.padded_batch(batch_size, padded_shapes={feature_key: [None]})

    def concat(x):
        tokens = tf.reshape(x[feature_key], [-1])
        return {feature_key: tf.boolean_mask(tokens, tf.not_equal(tokens, 0))}

    return ds.map(concat, num_parallel_calls=_AUTOTUNE)


def split_tokens_to_targets_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int] | None,
    output_features: Mapping[str, seqio.Feature],
    feature_key: str = "targets",
    **unused: Any,
) -> tf.data.Dataset:
    """Splits each example's tokens into consecutive pieces of the targets length.

    T5's preprocessor of that name: the pieces leave room for an EOS when the
    feature adds one; the last piece of an example may be shorter.
    """
    del unused
    if not sequence_length or feature_key not in sequence_length:
        raise ValueError(
            f"split_tokens_to_targets_length needs sequence_length[{feature_key!r}]; pass "
            "task_feature_lengths when reading the task."
        )
    length = sequence_length[feature_key] - int(output_features[feature_key].add_eos)

    def split(x):
        tokens = x[feature_key]
        n = tf.size(tokens)
        pieces = (n + length - 1) // length
        padded = tf.pad(tokens, [[0, pieces * length - n]])
        sizes = tf.minimum(length, n - tf.range(pieces) * length)
        return {"tokens": tf.reshape(padded, [pieces, length]), "size": sizes}

    ds = dataset.map(split, num_parallel_calls=_AUTOTUNE).unbatch()
    return ds.map(lambda x: {feature_key: x["tokens"][: x["size"]]}, num_parallel_calls=_AUTOTUNE)


def lm_preprocessors(text_key: str, concat_batch_size: int = 128) -> list[Callable]:
    """Pax's C4 LM recipe: text -> targets, tokenize, concatenate, split, append EOS."""
    return [
        lambda ds: ds.map(lambda x: {"targets": x[text_key]}, num_parallel_calls=_AUTOTUNE),
        seqio.preprocessors.tokenize,
        lambda ds: reduce_concat_tokens(ds, batch_size=concat_batch_size),
        split_tokens_to_targets_length,
        seqio.preprocessors.append_eos_after_trim,
    ]


# Task name -> the settings this module registered it with.
_REGISTERED_SETTINGS: dict[str, Mapping[str, Any]] = {}


def register_task_once(
    name: str, settings: Mapping[str, Any], make_task: Callable[[str], seqio.Task]
) -> seqio.Task:
    """Registers ``make_task(name)`` unless it is already registered with ``settings``.

    Idempotent: the same settings return the registered task; different settings
    (say, a new vocabulary path) replace it. A name that other code registered is
    an error rather than silently replaced.
    """
    if name in seqio.TaskRegistry.names():
        if _REGISTERED_SETTINGS.get(name) == dict(settings):
            return seqio.TaskRegistry.get(name)
        if name not in _REGISTERED_SETTINGS:
            raise InputConfigError(
                f"SeqIO task {name!r} is already registered by other code; pick another "
                "task name (the experiment's *_TASK_NAME knob)."
            )
        seqio.TaskRegistry.remove(name)
    task = make_task(name)
    seqio.TaskRegistry.add_provider(name, task)
    _REGISTERED_SETTINGS[name] = dict(settings)
    return task
