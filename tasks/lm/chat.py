"""Chat conversations (JSONL) as prefix-LM examples: the loss counts the assistant turns only.

Each line of the files is a JSON object whose MESSAGES_FIELD holds a conversation,
``{"messages": [{"role": "system", "content": ...}, {"role": "user", ...},
{"role": "assistant", ...}, ...]}``, rendered with the model directory's chat template
and tokenized by its tokenizer (``praxis_lite.tokenizers.hf_chat.encode_chat``: the template writes
BOS where the model wants one). A conversation gives one example per assistant turn:

    inputs   the conversation's tokens before that turn's content (every earlier turn,
             earlier assistant turns included, and the turn's role header); a longer one
             than ``sequence_length['inputs']`` (MAX_PROMPT_LEN) keeps its END, the recent
             context; a leading start id (BOS) is dropped: the converter puts it back
    targets  the turn's tokens: its content and the template's end-of-turn token
             (``<|im_end|>``, ``<|eot_id|>``); a longer one is cut (seqio's trim)

Both are token ids already (int32; features with the HfVocabulary, no EOS added), fed to
``SeqIOInput(prefix_lm=True)``: seqio's ``PrefixLMFeatureConverter`` weights the targets
only, so an earlier assistant turn is context (weight 0) in a later turn's example and
weighted once, in its own. Tokenizing runs in Python (Jinja + tokenizers) inside the
pipeline (``tf.numpy_function``). A line that is not JSON, a record without the field, or a
conversation the template cannot render raises one InputDataError naming the file, the
line and the knob (MESSAGES_FIELD, HF_MODEL).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import seqio
import tensorflow as tf

from praxis_lite.inputs.base_input import InputConfigError, InputDataError
from praxis_lite.inputs.seqio_tasks import HfVocabulary, make_vocabulary, register_task_once
from praxis_lite.tokenizers.hf_chat import ChatTemplate, ChatTemplateError, encode_chat
from tasks.lm.text import TextFileSource, TextFormat, continuation_metrics, split_patterns

_AUTOTUNE = tf.data.AUTOTUNE


class ChatEncoder:
    """A JSONL record -> its per-assistant-turn (inputs, targets) token ids.

    The tokenizer and chat template of ``vocabulary``'s directory are read on first use
    (registering a task reads no file).
    """

    def __init__(self, vocabulary: HfVocabulary, messages_field: str):
        self.vocabulary, self.messages_field = vocabulary, messages_field
        self._template: ChatTemplate | None = None
        self._template_read = False

    @property
    def template(self) -> ChatTemplate | None:
        if not self._template_read:
            try:
                self._template = ChatTemplate.from_dir(self.vocabulary.directory)
            except ChatTemplateError as e:
                raise InputDataError(f"{e} (HF_MODEL's chat template)") from None
            self._template_read = True
        return self._template

    def messages(self, line: bytes, where: str) -> Any:
        """The MESSAGES_FIELD of one JSON line (at ``where``: 'FILE: line N')."""
        field = self.messages_field
        try:
            record = json.loads(line)
        except ValueError as e:
            why = f"{e.msg}: column {e.colno}" if isinstance(e, json.JSONDecodeError) else e
            raise InputDataError(
                f"{where} is not JSON ({why}); fix or remove that line (a cut-off last line "
                "means a truncated file)."
            ) from None
        if not isinstance(record, dict) or field not in record:
            has = f"it has {sorted(record)}" if isinstance(record, dict) else "it is no object"
            raise InputDataError(
                f"{where} has no field {field!r} ({has}); set --set=MESSAGES_FIELD= to the "
                "field that holds the conversation."
            )
        return record[field]

    def examples(self, line: bytes, where: str) -> list[tuple[list[int], list[int]]]:
        """``(inputs, targets)`` ids of each assistant turn of the line's conversation, in
        order (none for a conversation without one)."""
        messages = self.messages(line, where)
        try:
            ids, weights = encode_chat(self.vocabulary.tokenizer, self.template, messages)
        except ChatTemplateError as e:
            raise InputDataError(
                f"{where}: field {self.messages_field!r} (MESSAGES_FIELD) does not render with "
                f"HF_MODEL's chat template: {e}"
            ) from None
        start = self.vocabulary.start_id
        out, t = [], 0
        while t < len(ids):
            if not weights[t]:
                t += 1
                continue
            end = t
            while end < len(ids) and weights[end]:
                end += 1
            prefix = ids[:t]
            if prefix and prefix[0] == start:  # The converter shifts the start id in.
                prefix = prefix[1:]
            out.append((prefix, ids[t:end]))
            t = end
        return out

    def flat(self, line: bytes, path: bytes, number: int) -> tuple[np.ndarray, ...]:
        """``examples`` as (inputs ids, inputs lengths, targets ids, targets lengths)."""
        where = f"{path.decode()}: line {int(number)}"
        pairs = self.examples(line, where)
        inputs = [i for p, _ in pairs for i in p]
        targets = [i for _, t in pairs for i in t]
        return (
            np.asarray(inputs, np.int32),
            np.asarray([len(p) for p, _ in pairs], np.int64),
            np.asarray(targets, np.int32),
            np.asarray([len(t) for _, t in pairs], np.int64),
        )

    def check(self, line: bytes, where: str) -> tuple[bytes, ...]:
        """A ``RecordParser`` for ``TextFileSource.check_file``: raises on a bad line."""
        self.examples(line, where)
        return ()


def chat_examples(encoder: ChatEncoder):
    """Preprocessor: TextFileSource examples (JSONL lines) -> ``{'inputs', 'targets'}`` int32
    examples, one per assistant turn; blank lines are skipped."""

    def to_turns(x: dict[str, tf.Tensor]) -> dict[str, tf.RaggedTensor]:
        args = [x["data"], x["file"], x["number"]]
        out = [tf.int32, tf.int64, tf.int32, tf.int64]
        inputs, in_lens, targets, tg_lens = tf.numpy_function(
            encoder.flat, args, out, stateful=False
        )
        inputs = tf.ensure_shape(inputs, [None])
        targets = tf.ensure_shape(targets, [None])
        return {
            "inputs": tf.RaggedTensor.from_row_lengths(inputs, tf.ensure_shape(in_lens, [None])),
            "targets": tf.RaggedTensor.from_row_lengths(targets, tf.ensure_shape(tg_lens, [None])),
        }

    def preprocess(ds: tf.data.Dataset) -> tf.data.Dataset:
        ds = ds.filter(lambda x: tf.strings.length(tf.strings.strip(x["data"])) > 0)
        ds = ds.map(to_turns, num_parallel_calls=_AUTOTUNE)  # Tokenizing in parallel, in order.
        return ds.flat_map(tf.data.Dataset.from_tensor_slices)

    return preprocess


def keep_recent_inputs(
    ds: tf.data.Dataset, sequence_length: dict[str, int] | None = None
) -> tf.data.Dataset:
    """Preprocessor: 'inputs' cut to its last ``sequence_length['inputs']`` tokens (the
    context nearest the turn); unchanged without a length."""
    if not sequence_length or sequence_length.get("inputs") is None:
        return ds
    n = sequence_length["inputs"]
    return ds.map(lambda x: {**x, "inputs": x["inputs"][-n:]}, num_parallel_calls=_AUTOTUNE)


def register_chat_task(
    name: str,
    *,
    train_path: str,
    eval_path: str | None = None,
    messages_field: str = "messages",
    vocab_path: str,
    shuffle_buffer_size: int = 1000,
) -> seqio.Task:
    """Registers a task of JSONL conversations: split 'train' and, if given, 'validation'.

    Features (module docstring): 'inputs' = the conversation before an assistant turn,
    'targets' = that turn; token ids of ``vocab_path``, a Hugging Face model directory with
    a chat template. Scored by :func:`tasks.lm.text.continuation_metrics`. Idempotent,
    like :func:`tasks.lm.text.register_text_task`.
    """
    settings = dict(
        train_path=train_path,
        eval_path=eval_path,
        messages_field=messages_field,
        vocab_path=vocab_path,
        shuffle_buffer_size=shuffle_buffer_size,
    )
    patterns = split_patterns(train_path, eval_path)

    def make_task(task_name: str) -> seqio.Task:
        vocabulary = make_vocabulary(vocab_path)
        if not isinstance(vocabulary, HfVocabulary):
            raise InputConfigError(
                f"Chat task {task_name!r}: {vocab_path} is not a Hugging Face model directory "
                "(its tokenizer and chat template tokenize the conversations)."
            )
        encoder = ChatEncoder(vocabulary, messages_field)
        return seqio.Task(
            task_name,
            source=TextFileSource(patterns, TextFormat.JSONL, encoder.check),
            preprocessors=[chat_examples(encoder), keep_recent_inputs],
            output_features={
                "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=False),
                "targets": seqio.Feature(vocabulary=vocabulary, add_eos=False),
            },
            metric_fns=[continuation_metrics],
            shuffle_buffer_size=shuffle_buffer_size,
        )

    return register_task_once(name, settings, make_task)
