"""Fine-tuning on prompt/completion pairs (JSONL): the loss counts the completions only.

Each line of TEXT_DATA_PATH / TEXT_EVAL_DATA_PATH is a JSON object such as
``{"prompt": "capital of France? ", "completion": "Paris"}`` (fields PROMPT_FIELD and
COMPLETION_FIELD). The SeqIO task has 'inputs' (the prompt, at most MAX_PROMPT_LEN
tokens: a longer one loses its end) and 'targets' (the completion, cut to leave room
for its EOS). A training row is BOS (0), the prompt, the completion and EOS, packed
several to a row with segment ids; only the completion and its EOS carry loss weight
(``SeqIOInput(prefix_lm=True)``: seqio's ``PrefixLMFeatureConverter``), so the eval's
loss and accuracy are the completions' too. ``decoder_datasets()`` prompts the model
with each held-out prompt and scores the decoded text against its completion
(``exact_match``, ``char_accuracy``); train_and_eval decodes with every eval::

    python -m tasks.lm.prompt_completion --write_examples=/tmp/pc_data
    paxlite --exp=tasks.lm.prompt_completion.LmPromptCompletionTiny \\
        --job_log_dir=/tmp/pc_job --mode=train_and_eval \\
        --set TEXT_DATA_PATH=/tmp/pc_data/train.jsonl \\
        --set TEXT_EVAL_DATA_PATH=/tmp/pc_data/eval.jsonl

A bad line, or a record without one of the fields, stops the run with one
InputDataError naming the file, the line and the knob to fix.
"""

from __future__ import annotations

import json
import os
import random
import string
import sys
from typing import Any

import seqio

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from praxis_lite.inputs.seqio_input import DecodeForm
from praxis_lite.inputs.seqio_tasks import make_vocabulary, register_task_once
from tasks.lm.knob_groups import knob_group
from tasks.lm.text import (
    LmTextTiny,
    TextFileKnobs,
    TextFileSource,
    TextFormat,
    TextLmData,
    continuation_metrics,
    jsonl_fields,
    parse_records,
    split_patterns,
)


def register_prompt_completion_task(
    name: str,
    *,
    train_path: str,
    eval_path: str | None = None,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    vocab_path: str | None = None,
    shuffle_buffer_size: int = 1000,
    inputs_eos: bool = False,
) -> seqio.Task:
    """Registers a task of JSONL prompt/completion records: split 'train' and, if given,
    'validation'.

    Features: 'inputs' = the ``prompt_field`` text (+ EOS with ``inputs_eos``: T5's
    convention, for an encoder-decoder's ``SeqIOInput(encoder_decoder=True)``; a decoder-only
    LM's prompt runs on into its completion, without one), 'targets' = the
    ``completion_field`` text + EOS; bytes unless ``vocab_path`` names a SentencePiece
    model. Scored by :func:`tasks.lm.text.continuation_metrics`. A line that is not JSON
    or lacks a field raises InputDataError naming it and the knob (PROMPT_FIELD,
    COMPLETION_FIELD). Idempotent, like :func:`tasks.lm.text.register_text_task`.
    """
    settings = dict(
        train_path=train_path,
        eval_path=eval_path,
        prompt_field=prompt_field,
        completion_field=completion_field,
        vocab_path=vocab_path,
        shuffle_buffer_size=shuffle_buffer_size,
        inputs_eos=inputs_eos,
    )
    patterns = split_patterns(train_path, eval_path)
    knobs = {prompt_field: "PROMPT_FIELD", completion_field: "COMPLETION_FIELD"}

    def parse(line: bytes, where: str) -> tuple[bytes, ...]:
        return jsonl_fields(line, where, knobs)

    def make_task(task_name: str) -> seqio.Task:
        vocabulary = make_vocabulary(vocab_path)
        return seqio.Task(
            task_name,
            source=TextFileSource(patterns, TextFormat.JSONL, parse),
            preprocessors=[
                parse_records(TextFormat.JSONL, parse, ["inputs", "targets"]),
                seqio.preprocessors.tokenize,
                seqio.preprocessors.append_eos_after_trim,
            ],
            output_features={
                "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=inputs_eos),
                "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
            },
            metric_fns=[continuation_metrics],
            shuffle_buffer_size=shuffle_buffer_size,
        )

    return register_task_once(name, settings, make_task)


# TextLmData's knobs that prompt/completion data has no use for -> what to set instead.
_UNUSED_TEXT_KNOBS = {
    "TEXT_FIELD": "PROMPT_FIELD and COMPLETION_FIELD",
    "DECODE_PROMPT_LEN": "MAX_PROMPT_LEN",
}


@knob_group
class PairFieldKnobs(TextFileKnobs):
    """JSONL text files of pairs (a prompt and its completion, T5's inputs and targets):
    the two fields of each record and the SeqIO task of 'inputs' and 'targets' they make.

    Attributes (knobs, beyond TextFileKnobs'):
      PROMPT_FIELD: the JSON field of each record's prompt (the model's input).
      COMPLETION_FIELD: the JSON field of each record's completion (its target).
    """

    PROMPT_FIELD: str = "prompt"
    COMPLETION_FIELD: str = "completion"

    def check_pair_fields(self) -> None:
        """KnobError unless the two fields differ."""
        if self.PROMPT_FIELD == self.COMPLETION_FIELD:
            raise KnobError(
                f"{type(self).__qualname__}: PROMPT_FIELD and COMPLETION_FIELD are both "
                f"{self.PROMPT_FIELD!r}; name the two fields of each record."
            )

    def register_pairs_task(self, inputs_eos: bool = False) -> None:
        """Registers the files as the SeqIO task TEXT_TASK_NAME ('inputs', 'targets'; an EOS
        after the inputs with ``inputs_eos``)."""
        register_prompt_completion_task(
            self.TEXT_TASK_NAME,
            train_path=self.TEXT_DATA_PATH,
            eval_path=self.TEXT_EVAL_DATA_PATH,
            prompt_field=self.PROMPT_FIELD,
            completion_field=self.COMPLETION_FIELD,
            vocab_path=self.VOCAB_PATH,
            inputs_eos=inputs_eos,
        )


@knob_group
class PromptCompletionKnobs(PairFieldKnobs, TextLmData):
    """Prompt/completion records as a decoder-only LM's text data: the knobs and the
    inputs they make (its ``register_task``, ``lm_input_fields`` and
    ``prompt_input_fields`` hooks call the ``prompt_completion_*`` methods).

    Attributes (knobs, beyond PairFieldKnobs' and TextLmData's):
      MAX_PROMPT_LEN: prompt tokens per example (a longer prompt loses its end); the
        completion and its EOS get MAX_SEQ_LEN - MAX_PROMPT_LEN (a longer one is cut).
    """

    MAX_PROMPT_LEN: int = 32

    def check_prompt_completion_knobs(self) -> None:
        """KnobError for knobs that do not fit prompt/completion records (JSONL)."""
        self.check_records_of_prompts("prompt/completion records", "the completion's")
        for knob, instead in _UNUSED_TEXT_KNOBS.items():
            if getattr(self, knob) != getattr(TextLmData, knob):
                raise KnobError(
                    f"{type(self).__qualname__}: {knob} does not apply to prompt/completion "
                    f"data; set {instead}."
                )
        self.check_pair_fields()

    def check_records_of_prompts(self, records: str, rest: str) -> None:
        """KnobError unless TEXT_FORMAT is JSONL (``records``, e.g. "chat records", are JSON
        objects) and MAX_PROMPT_LEN leaves room after the prompt for ``rest`` (whose tokens end
        the row, e.g. "the completion's")."""
        name = type(self).__qualname__
        if self.TEXT_FORMAT is not TextFormat.JSONL:
            raise KnobError(
                f"{name}: TEXT_FORMAT={self.TEXT_FORMAT.name}, but {records} are JSONL (one "
                "JSON object a line); set --set=TEXT_FORMAT=JSONL."
            )
        if not 0 < self.MAX_PROMPT_LEN < self.MAX_SEQ_LEN:
            raise KnobError(
                f"{name}: MAX_PROMPT_LEN={self.MAX_PROMPT_LEN} must be in [1, MAX_SEQ_LEN="
                f"{self.MAX_SEQ_LEN}): the rest of each row is {rest}."
            )

    def feature_lengths(self) -> dict[str, int]:
        """Prompt and completion tokens: a row of both is MAX_SEQ_LEN long."""
        return {"inputs": self.MAX_PROMPT_LEN, "targets": self.MAX_SEQ_LEN - self.MAX_PROMPT_LEN}

    def prompt_completion_input_fields(self) -> dict[str, Any]:
        """Rows of prompt then completion, the loss on the completion (``prefix_lm``)."""
        return {"task_feature_lengths": self.feature_lengths(), "prefix_lm": True}

    def prompt_completion_prompt_fields(self) -> dict[str, Any]:
        """The held-out pairs (split 'validation' of TEXT_TASK_NAME): prompt, then completion."""
        self.register_pairs_task()
        return {
            "mixture_name": self.TEXT_TASK_NAME,
            "task_feature_lengths": self.feature_lengths(),
            "decode_form": DecodeForm.INPUTS_TARGETS,
        }

    def decode_with_every_eval(self, task: Any) -> Any:
        """With held-out pairs, train_and_eval decodes them with every eval
        (EVAL_INTERVAL_STEPS) and at the end."""
        if self.TEXT_EVAL_DATA_PATH is not None:
            task.decode_interval_steps = self.EVAL_INTERVAL_STEPS or self.NUM_TRAIN_STEPS
        return task


@registry.register
class LmPromptCompletionTiny(PromptCompletionKnobs, LmTextTiny):
    """LmTextTiny's model (same shapes) trained on prompt/completion pairs, loss on completions
    (the knobs of :class:`PromptCompletionKnobs`; TEXT_FORMAT stays JSONL, TEXT_FIELD and
    DECODE_PROMPT_LEN do not apply)."""

    TEXT_FORMAT = TextFormat.JSONL
    TEXT_TASK_NAME = "prompt_completion"
    NUM_TRAIN_STEPS = 400  # write_example_task's table, from scratch: about a minute on 2 cores.
    LR_COS_DECAY_END = NUM_TRAIN_STEPS

    def validate(self) -> None:
        super().validate()
        self.check_prompt_completion_knobs()

    def task(self) -> Any:
        return self.decode_with_every_eval(super().task())

    def register_task(self) -> None:
        self.register_pairs_task()

    def lm_input_fields(self) -> dict[str, Any]:
        return self.prompt_completion_input_fields()

    def prompt_input_fields(self) -> dict[str, Any]:
        return self.prompt_completion_prompt_fields()


# ----- a generated example task -----


def example_pairs(num_pairs: int, seed: int = 0) -> list[dict[str, str]]:
    """Records of a fixed letter-substitution table: a word of 3-6 letters, then its letters
    each looked up in the table (``{"prompt": "xdpv=", "completion": "xbeg"}``).

    The table depends on ``seed`` alone (the same for every ``num_pairs``); the words
    are drawn after it, without repeats.
    """
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    table = dict(zip(letters, rng.sample(letters, len(letters)), strict=True))
    words: dict[str, None] = {}
    while len(words) < num_pairs:
        words["".join(rng.choices(letters, k=rng.randint(3, 6)))] = None
    return [{"prompt": f"{w}=", "completion": "".join(table[c] for c in w)} for w in words]


def write_example_task(
    directory: str, num_train: int = 2000, num_eval: int = 64, seed: int = 0
) -> tuple[str, str]:
    """Writes ``train.jsonl`` and ``eval.jsonl`` of :func:`example_pairs` into ``directory``.

    The eval words are not among the training words: the model must learn the
    table, not the pairs. LmPromptCompletionTiny learns it from scratch in about a
    minute on a 2-core CPU (decoded exact_match from 0 to about 0.98). Returns
    ``(train_path, eval_path)``.
    """
    os.makedirs(directory, exist_ok=True)
    pairs = example_pairs(num_train + num_eval, seed)
    paths = os.path.join(directory, "train.jsonl"), os.path.join(directory, "eval.jsonl")
    for path, part in zip(paths, (pairs[:num_train], pairs[num_train:]), strict=True):
        with open(path, "w") as f:
            f.writelines(json.dumps(pair) + "\n" for pair in part)
    return paths


def _main(argv: list[str]) -> None:
    """``--write_examples=DIR``: writes the example task, prints the command to train on it."""
    from absl import flags

    if len(argv) > 1:
        raise SystemExit(f"Unexpected arguments: {' '.join(argv[1:])}")
    train_path, eval_path = write_example_task(flags.FLAGS.write_examples)
    print(f"Wrote {train_path} and {eval_path}. Train on them:")
    print(
        f"  {sys.executable} -m paxlite.main --exp={_MODULE}.LmPromptCompletionTiny "
        "--job_log_dir=/tmp/pc_job --mode=train_and_eval "
        f"--set TEXT_DATA_PATH={train_path} --set TEXT_EVAL_DATA_PATH={eval_path}"
    )


_MODULE = "tasks.lm.prompt_completion"

if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("write_examples", None, "Directory to write the example JSONL into.")
    flags.mark_flag_as_required("write_examples")
    app.run(_main)
