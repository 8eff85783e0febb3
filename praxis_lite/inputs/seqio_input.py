"""SeqIOInput: a BaseInput over a registered SeqIO Task or Mixture (Pax's ``SeqIOInput``).

Each host reads its own shard (``seqio.ShardInfo(infeed_host_index,
num_infeed_hosts)``), converts examples with ``seqio.DecoderFeatureConverter``
(``T = task_feature_lengths['targets']``) or, with ``prefix_lm=True``, with
``seqio.PrefixLMFeatureConverter(loss_on_targets_only=True)`` (each row is BOS, the
'inputs' tokens, then the 'targets' tokens with weights 1 on the targets only; ``T =
task_feature_lengths['inputs'] + task_feature_lengths['targets']``; its
``decoder_causal_attention`` is not used: the model stays causal), and yields
``[batch_size, T]`` numpy batches with the keys LanguageModel reads::

    ids          decoder_input_tokens (int32)
    labels       decoder_target_tokens (int32)
    weights      decoder_loss_weights (float32)
    paddings     1.0 at padding: where the converter's labels are 0 (float32)
    segment_ids  decoder_segment_ids (int32, packed inputs only)
    segment_pos  decoder_positions (int32, packed inputs only)

With ``encoder_decoder=True`` (T5) batches come from ``seqio.EncDecFeatureConverter``
instead, with its keys (``encoder_input_tokens``, ``decoder_input_tokens``,
``decoder_target_tokens``, ``decoder_loss_weights``; packed: the segment ids and
positions of both sides), and decoder inputs yield ``input_ids`` / ``input_lengths`` (the
encoder's prompt, no start token) with ``target_ids`` / ``target_lengths``; see
``seqio_seq2seq``, which shapes them. Their id 0 must be padding: a Hugging Face
vocabulary (below) is refused.

Hugging Face vocabularies (``seqio_tasks.HfVocabulary``). seqio's converters and packing
take id 0 for padding (loss weights, segment ids and packed lengths come from ``ids != 0``)
and shift 0 in as BOS; in a Hugging Face model's vocabulary id 0 is a real token ("!" for
Llama 3, Qwen, GPT-2). So, for tasks with such a vocabulary, every token id is raised by 1
before the converter (its 0s are then only its own padding), the converter shifts in
``start_id + 1`` (``HfVocabulary.start_id``: BOS, else EOS), and the batch is lowered by 1
after it: ids and labels are the model's ids, padding is ``paddings`` / ``weights`` (its
ids and labels are 0, which means nothing there), and each sequence's first input is the
start id. Packing and the converters are seqio's own, untouched. Decoder prompts start with
the start id too, and ``ids_to_strings`` keeps 0s (rows are cut by their lengths, and by
the first EOS). The results with seqio's vocabularies (bytes, SentencePiece) are unchanged.

Pax's eval semantics (see BaseInput): training and rolling-eval inputs repeat and
drop the last partial batch. A one-epoch eval input (``reset_for_eval=True``)
stops after the same number of batches on every host: each host counts the
examples of every host's shard (once per process, cached; no communication), and
pads its short or missing batches with all-zero examples whose weights are 0, so
every real example is scored exactly once.

``get_state()`` is the number of batches read since the last reset; ``set_state``
rebuilds the (seeded, deterministic) pipeline and skips that many batches, re-reading
them (its cost grows with the step). ``save_position`` writes the tf.data iterator's own
state instead (TensorFlow's checkpoint of it: file offsets, the shuffle buffer's
examples, packing and prefetch buffers), and ``restore_position`` puts a rebuilt pipeline
back there without reading anything: a resume costs the same at any step. Both refuse a
state saved with another number of input hosts (each host's stream is its own shard).

Decoder inputs (``decode_form`` set; an experiment's ``decoder_datasets()``) of a
decoder-only LM yield BaseInput's prompt/target batches instead, from one Task::

    prefix_ids      [B, 1 + P] int32: BOS (0; a Hugging Face vocabulary's start id),
                               then the prompt; right-padded with 0
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

The checks of a Task's data and vocabularies are in ``seqio_checks``; the pieces
experiments register LM Tasks with (Pax's preprocessors, vocabularies) in ``seqio_tasks``.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import sentencepiece
import seqio
import tensorflow as tf
from absl import logging

from praxis_lite.decoding import stop_strings
from praxis_lite.inputs import seqio_seq2seq
from praxis_lite.inputs.base_input import BaseInput, InputConfigError, InputDataError
from praxis_lite.inputs.seqio_checks import (
    check_files,
    check_split,
    check_tfds_data,
    check_tfds_files,
    check_vocabularies,
    find_bad_tfrecord,
    get_provider,
    split_files,
    tf_error_message,
)
from praxis_lite.inputs.seqio_tasks import zero_is_padding
from praxis_lite.py_utils import NestedMap
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer

try:  # The input pipeline runs on the host; keep TensorFlow off the accelerators.
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # TF already initialized its devices.
    pass

_AUTOTUNE = tf.data.AUTOTUNE

# Inputs with a live pipeline. Their threads may be inside a task's Python code
# (numpy_function): at interpreter shutdown those can never finish and tearing the
# pipeline down would hang, so every input is closed at exit, before the shutdown.
_open_inputs: weakref.WeakValueDictionary[int, SeqIOInput] = weakref.WeakValueDictionary()


@atexit.register
def _close_open_inputs() -> None:
    for inp in list(_open_inputs.values()):
        inp.close()


class DecodeForm(enum.Enum):
    """Where a decoder input's prompts and targets come from (see the module docstring)."""

    INPUTS_TARGETS = "inputs_targets"  # prompt = 'inputs', target = 'targets'
    TARGETS_PREFIX = "targets_prefix"  # prompt = first prompt_len 'targets' tokens


@dataclasses.dataclass
class SeqIOInput(BaseInput):
    """Batches of a SeqIO Task or Mixture for a decoder-only LM or an encoder-decoder.

    Attributes:
      mixture_name: a registered seqio Task or Mixture name.
      split_name: the split to read ('train', 'validation', ...).
      task_feature_lengths: sequence length per task feature, e.g. ``{'targets': 1024}``.
      feature_converter_pack: pack several examples into each row
        (``DecoderFeatureConverter(pack=True)``); adds segment_ids / segment_pos.
      prefix_lm: train on prompt -> completion examples: each row is an example's
        'inputs' then its 'targets', and only the 'targets' tokens count in the loss
        (``seqio.PrefixLMFeatureConverter(loss_on_targets_only=True)``); rows are
        ``task_feature_lengths['inputs'] + task_feature_lengths['targets']`` long.
        Every task needs an 'inputs' feature. Without it, LM batches are of 'targets'
        only and task_feature_lengths has no 'inputs' (seqio's DecoderFeatureConverter
        would make prefix-LM rows of it unasked). Not for decoder inputs (their
        ``DecodeForm.INPUTS_TARGETS`` prompts with the same 'inputs').
      encoder_decoder: batches for an encoder-decoder (T5): 'inputs' to the encoder,
        'targets' to the decoder (``seqio.EncDecFeatureConverter``, packed with
        feature_converter_pack; the keys in ``seqio_seq2seq``). Every task needs both
        features and a vocabulary whose id 0 is padding; task_feature_lengths gives
        both lengths. Decoder inputs take ``DecodeForm.INPUTS_TARGETS``.
      shuffle: shuffle the examples; None: shuffle iff ``is_training``.
      shuffle_buffer_size: examples in the shuffle buffer; None: the Task's own
        (Tasks only; a Mixture's tasks use their own).
      model_vocab_size: if set, the task's output vocabulary must fit in it (ids
        past the model's embedding table are an error, not silent garbage).
      decode_form: None for LM batches; else this is a decoder input yielding
        prompt/target batches of one Task, formed as the DecodeForm says.
      prompt_len: prompt tokens per example with ``DecodeForm.TARGETS_PREFIX``
        (0 otherwise).
      num_batches_to_skip: the stream starts after this many batches (Pax's
        ``num_batches_to_skip``: e.g. to step past data that made a run diverge);
        a resumed input skips these plus the batches it had read.
      use_cached: read the task's offline cache (seqio's ``cache_tasks_main``), as T5X's
        ``DatasetConfig.use_cached``; the task must have been cached.
      data_flag: how a user points this input at other data, named by data errors
        (e.g. '--set=TEXT_DATA_PATH=PATH', '--tfds_data_dir=DIR'); empty: the
        path the task was registered with.
    """

    mixture_name: str = dataclasses.field(kw_only=True)
    task_feature_lengths: Mapping[str, int] = dataclasses.field(kw_only=True)
    split_name: str = "train"
    feature_converter_pack: bool = False
    prefix_lm: bool = False
    encoder_decoder: bool = False
    shuffle: bool | None = None
    shuffle_buffer_size: int | None = None
    model_vocab_size: int | None = None
    decode_form: DecodeForm | None = None
    prompt_len: int = 0
    num_batches_to_skip: int = 0
    use_cached: bool = False
    data_flag: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        where = f"SeqIOInput '{self.name}'"
        self.task_feature_lengths = dict(self.task_feature_lengths)
        if not self.encoder_decoder and (
            not isinstance(self.task_feature_lengths.get("targets"), int)
            or self.task_feature_lengths["targets"] <= 0
        ):
            raise InputConfigError(
                f"{where}: task_feature_lengths needs a positive 'targets' length for a "
                f"decoder-only LM, got {self.task_feature_lengths}."
            )
        if self.shuffle_buffer_size is not None and self.shuffle_buffer_size <= 0:
            raise InputConfigError(f"{where}: shuffle_buffer_size must be > 0 or None.")
        if not self.mixture_name:
            raise InputConfigError(
                f"{where} names no SeqIO task or mixture; set {self.data_flag or 'mixture_name'}."
            )
        self._provider = get_provider(self.mixture_name, where)
        if self.shuffle_buffer_size is not None and not isinstance(self._provider, seqio.Task):
            raise InputConfigError(
                f"{where}: shuffle_buffer_size applies to a Task; {self.mixture_name!r} is a "
                "Mixture whose tasks use their own buffer sizes. Leave it None."
            )
        flag = self.data_flag
        for task in seqio.get_subtasks(self._provider):
            check_vocabularies(task, where)
            check_tfds_data(task, self.split_name, where)  # Before splits: TFDS reads them.
            check_split(task, self.split_name, where)
            check_files(task, self.split_name, where, flag or "the task's file pattern")
            check_tfds_files(task, self.split_name, where, flag or "--tfds_data_dir=DIR")
        if self.encoder_decoder:
            self._check_encoder_decoder(where)
        if self.model_vocab_size is not None:
            size = max(v.vocab_size for v in self._model_vocabularies())
            if size > self.model_vocab_size:
                raise InputConfigError(
                    f"{where}: the vocabulary of {self.mixture_name!r} has {size} ids but the "
                    f"model's vocabulary has {self.model_vocab_size}; raise the model's vocab "
                    f"size (the experiment's VOCAB_SIZE knob) to at least {size}."
                )
        self._check_decode_form(where)
        self._check_prefix_lm(where)
        self._start_id = self._hf_start_id(where)
        if self.repeats:
            self._check_yields_examples()
        self._eval_batches: int | None = None
        self._build(skip=0)

    # ----- BaseInput -----

    def get_next(self) -> NestedMap:
        """The next ``[batch_size, T]`` batch; StopIteration at the end of a finite input."""
        if self._replay:
            batch = self._replay.pop(0)
        elif self.reset_for_eval and not self.repeats:
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
        """``{'num_batches': k, 'num_infeed_hosts': n, 'num_batches_to_skip': s}``: k
        batches read since the last reset, by one of n hosts, after skipping s."""
        return {
            "num_batches": self._num_batches,
            "num_infeed_hosts": self.num_infeed_hosts,
            "num_batches_to_skip": self.num_batches_to_skip,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Rebuilds the pipeline and skips ``state['num_batches']`` batches (re-reading them)."""
        self._check_same_hosts(state)
        self._build(skip=int(state["num_batches"]))

    def save_position(self, directory: str) -> bool:
        """Writes the tf.data iterator's state (TensorFlow checkpoint files ``iterator.*``).

        Nothing is written (False) for one-epoch and decoder inputs, or while the
        trainer's sample batch is still to be replayed.
        """
        if self._iterator is None or self._replay or self.reset_for_eval:
            return False
        tf.train.Checkpoint(iterator=self._iterator).write(os.path.join(directory, "iterator"))
        return True

    def restore_position(self, directory: str, state: dict[str, Any]) -> None:
        """Rebuilds the pipeline and restores the iterator's state (reads no data).

        A changed ``num_batches_to_skip`` (Pax's TRAINING_NUM_BATCHES_TO_SKIP, e.g. to
        step past data that made the run diverge) moves the stream, as ``set_state``
        does: it then re-reads to ``num_batches`` + the new skip.
        """
        self._check_same_hosts(state)
        if state.get("num_batches_to_skip", self.num_batches_to_skip) != self.num_batches_to_skip:
            logging.info(
                "SeqIOInput '%s': num_batches_to_skip changed since the checkpoint; the "
                "stream restarts %d batches after the saved position's count.",
                self.name,
                self.num_batches_to_skip,
            )
            self._build(skip=int(state["num_batches"]))
            return
        self._build(skip=0)
        checkpoint = tf.train.Checkpoint(iterator=self._iterator)
        checkpoint.read(os.path.join(directory, "iterator")).assert_consumed()
        self._num_batches = int(state["num_batches"])

    def _check_same_hosts(self, state: dict[str, Any]) -> None:
        """Raises unless ``state`` was saved by as many input hosts as read this input now."""
        hosts = state.get("num_infeed_hosts", self.num_infeed_hosts)
        if hosts != self.num_infeed_hosts:
            raise InputConfigError(
                f"SeqIOInput '{self.name}': the checkpoint's input position was saved by "
                f"{hosts} input hosts (processes) and this run has {self.num_infeed_hosts}; "
                f"each host reads its own shard, so resume with {hosts} processes, or "
                "start this job afresh in another --job_log_dir."
            )

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

    def token_bytes(self) -> list[bytes] | None:
        """Each id's bytes in the 'targets' vocabulary's text (``stop_strings`` matches
        against them), or None for a vocabulary that is neither a Hugging Face tokenizer
        nor SentencePiece."""
        vocab = self._vocabulary()
        tokenizer = getattr(vocab, "tokenizer", None)
        if isinstance(tokenizer, HfTokenizer):
            return tokenizer.token_bytes()
        if isinstance(tokenizer, sentencepiece.SentencePieceProcessor):
            return stop_strings.sentencepiece_bytes(tokenizer, vocab.vocab_size)
        return None

    def ids_to_strings(self, ids: np.ndarray, lengths: Sequence[int] | None = None) -> list[str]:
        """Detokenizes rows of ``ids [B, T]`` with the task's 'targets' vocabulary (an
        encoder-decoder's prompts, ``input_ids``, too: T5's tasks share one vocabulary).

        Padding ids (0) are dropped (kept with a Hugging Face vocabulary, whose id 0 is a
        token: pass ``lengths``); as in Pax, decoding stops after the first EOS.
        """
        vocab = self._vocabulary()
        ids = np.asarray(ids)
        lengths = [ids.shape[1]] * ids.shape[0] if lengths is None else lengths
        pads = zero_is_padding(vocab)
        rows = [
            [int(t) for t in row[: int(n)] if t != 0 or not pads]
            for row, n in zip(ids, lengths, strict=True)
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

    def _check_encoder_decoder(self, where: str) -> None:
        """Raises unless the tasks, lengths and other fields fit ``encoder_decoder``."""
        if self.prefix_lm:
            raise InputConfigError(
                f"{where}: prefix_lm makes decoder-only rows of inputs then targets, but "
                "encoder_decoder reads 'inputs' in the encoder; set prefix_lm=False."
            )
        if self.decode_form is DecodeForm.TARGETS_PREFIX:
            raise InputConfigError(
                f"{where}: DecodeForm.TARGETS_PREFIX prompts a decoder-only LM with the first "
                "'targets' tokens, but an encoder-decoder is prompted by 'inputs'; set "
                "decode_form=DecodeForm.INPUTS_TARGETS."
            )
        seqio_seq2seq.check_tasks(self._provider, self.task_feature_lengths, where)

    def _check_prefix_lm(self, where: str) -> None:
        """Raises unless every task has the 'inputs' that ``prefix_lm`` puts before the targets,
        or, without it, LM batches are of 'targets' only."""
        if not self.prefix_lm:
            lm_rows = self.decode_form is None and not self.encoder_decoder
            if lm_rows and "inputs" in self.task_feature_lengths:
                raise InputConfigError(
                    f"{where}: task_feature_lengths has an 'inputs' length, which would make "
                    "rows of inputs then targets; set prefix_lm=True for those (the loss on "
                    "the targets only), or leave 'inputs' out for rows of targets only."
                )
            return
        if self.decode_form is not None:
            raise InputConfigError(
                f"{where}: prefix_lm makes LM batches (inputs then targets); a decoder input "
                "prompts with 'inputs' through decode_form=DecodeForm.INPUTS_TARGETS. Set "
                "prefix_lm=False."
            )
        for task in seqio.get_subtasks(self._provider):
            if "inputs" not in task.output_features:
                raise InputConfigError(
                    f"{where}: prefix_lm puts each example's 'inputs' before its 'targets', but "
                    f"task {task.name!r} has only {sorted(task.output_features)}; set "
                    "prefix_lm=False for an LM task of 'targets' only."
                )
        length = self.task_feature_lengths.get("inputs")
        if not isinstance(length, int) or length <= 0:
            raise InputConfigError(
                f"{where}: prefix_lm needs a positive 'inputs' length in task_feature_lengths "
                f"(the longest prompt; rows are inputs + targets long), got "
                f"{self.task_feature_lengths}."
            )

    def _hf_start_id(self, where: str) -> int | None:
        """The start id of Hugging Face vocabularies (module docstring); None for seqio's.

        Raises unless every task's features use one kind, and one start id.
        """
        vocabs = [
            task.output_features[key].vocabulary
            for task in seqio.get_subtasks(self._provider)
            for key in ("inputs", "targets")
            if key in task.output_features
        ]
        hf = [v for v in vocabs if not zero_is_padding(v)]
        if not hf:
            return None
        starts = {v.start_id for v in hf}
        if len(hf) < len(vocabs) or len(starts) > 1:
            raise InputConfigError(
                f"{where}: the tasks of {self.mixture_name!r} mix Hugging Face tokenizers "
                "with other vocabularies, or tokenizers with different BOS tokens; give "
                "every task (and feature) of one input the same kind of vocabulary."
            )
        return starts.pop()

    # ----- pipeline -----

    @property
    def shuffles(self) -> bool:
        """Whether examples are shuffled (``shuffle``, or ``is_training`` when None)."""
        return self.shuffle if self.shuffle is not None else self.is_training

    def _vocabulary(self) -> seqio.Vocabulary:
        return self._provider.output_features["targets"].vocabulary

    def _model_vocabularies(self) -> list[seqio.Vocabulary]:
        """The vocabularies of the features batches are made of ('targets', and 'inputs' if
        task_feature_lengths has it)."""
        features = self._provider.output_features
        keys = [k for k in ("inputs", "targets") if k in self.task_feature_lengths]
        return [features[k].vocabulary for k in keys if k in features]

    def _task_examples(
        self, shard_index: int, num_epochs: int | None, shuffle: bool | None = None
    ) -> tf.data.Dataset:
        """The task's (or mixture's) own examples of one host's shard, before conversion."""
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
        if self.use_cached:  # A task cached by seqio's cache_tasks_main (T5X's use_cached).
            kwargs["use_cached"] = True
        if self.shuffle_buffer_size is not None and self.shuffles:
            kwargs["shuffle_buffer_size"] = self.shuffle_buffer_size
        return self._provider.get_dataset(**kwargs)

    def _examples(
        self, shard_index: int, num_epochs: int | None, shuffle: bool | None = None
    ) -> tf.data.Dataset:
        """The converted (unbatched) examples of one host's shard (``shuffle``: ``shuffles``)."""
        ds = self._task_examples(shard_index, num_epochs, shuffle)
        if self.encoder_decoder:
            return seqio_seq2seq.examples(
                ds,
                self.task_feature_lengths,
                pack=self.feature_converter_pack,
                decode=self.decode_form is not None,
            )
        if self.decode_form is not None:
            return self._decode_examples(ds)
        bos = 0
        if self._start_id is not None:  # Ids past 0, which is then padding only (docstring).
            ds = ds.map(_shift_tokens, num_parallel_calls=_AUTOTUNE)
            bos = self._start_id + 1
        pack = self.feature_converter_pack
        if self.prefix_lm:
            converter = seqio.PrefixLMFeatureConverter(
                pack=pack, loss_on_targets_only=True, bos_id=bos
            )
        else:
            converter = seqio.DecoderFeatureConverter(pack=pack, bos_id=bos)
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
            start = tf.fill([1], self._start_id or 0)
            prompt = tf.concat([start, tf.cast(prompt, tf.int32)], 0)
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
        ds = ds.batch(self.batch_size, drop_remainder=self.repeats or not self.reset_for_eval)
        self._spec = ds.element_spec
        # Always a skip node (even of 0): a saved iterator state restores only into a
        # pipeline of the same structure.
        ds = ds.skip(skip + self.num_batches_to_skip)
        options = tf.data.Options()
        options.deterministic = True
        # A task's Python functions (numpy_function) count as external state; the
        # pipeline a state is restored into is rebuilt by the same code, so saving may
        # leave them out.
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        ds = ds.with_options(options).prefetch(_AUTOTUNE)
        self._iterator = iter(ds)
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
            return tf.nest.map_structure(lambda t: t.numpy(), next(self._iterator))
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
        one unshuffled epoch before the input is used. Training conversions keep every
        example, so their check reads the task's examples unconverted (a pipeline about
        a quarter as costly to build); decoding conversions drop some, so theirs is read.
        """
        host = self.infeed_host_index
        epoch = (
            self._task_examples(host, 1, False)
            if self.decode_form is None
            else self._examples(host, 1, False)
        )
        try:
            found = any(True for _ in epoch.take(1))
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
            self.prefix_lm,
            self.encoder_decoder,
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
        """A converter's (or decoder input's) numpy batch -> the model's keys (module docstring)."""
        if self.decode_form is not None:
            return NestedMap({k: np.asarray(v, np.int32) for k, v in raw.items()})
        if self.encoder_decoder:
            return seqio_seq2seq.to_batch(raw)
        labels = raw["decoder_target_tokens"].astype(np.int32)
        ids = raw["decoder_input_tokens"].astype(np.int32)
        paddings = (labels == 0).astype(np.float32)
        if self._start_id is not None:  # Back to the model's ids (module docstring).
            labels, ids = np.maximum(labels - 1, 0), np.maximum(ids - 1, 0)
        batch = NestedMap(
            ids=ids,
            labels=labels,
            weights=raw["decoder_loss_weights"].astype(np.float32),
            paddings=paddings,
        )
        if self.feature_converter_pack:
            batch.segment_ids = raw["decoder_segment_ids"].astype(np.int32)
            batch.segment_pos = raw["decoder_positions"].astype(np.int32)
        return batch


# (mixture, split, lengths, pack, prefix LM, encoder-decoder, shuffle, seed, buffer, hosts,
# decode form, prompt len) -> (provider, counts per shard).
_SHARD_COUNTS: dict[tuple, tuple[Any, tuple[int, ...]]] = {}


def _shift_tokens(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Raises the token ids of 'inputs' and 'targets' by 1 (Hugging Face vocabularies)."""
    return {k: v + 1 if k in ("inputs", "targets") else v for k, v in example.items()}


def _count(ds: tf.data.Dataset) -> int:
    """Examples in ``ds`` (a dataset of dicts of tensors)."""

    def add(total, batch):
        first = next(iter(batch.values()))
        return total + tf.shape(first, out_type=tf.int64)[0]

    return int(ds.batch(1024).reduce(np.int64(0), add))
