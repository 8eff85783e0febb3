"""Fine-tuning a Hugging Face model as an experiment: ``HfCausalLm`` with ``HF_MODEL=DIR``.

The model is the directory's ``config.json`` built by its family
(``paxlite.formats.hf.models``), its blocks scanned (USE_REPEATED_LAYER, with
CHECKPOINT_POLICY's remat) unless they differ; the weights start from the directory's at
step 0 through the loading rules of ``--init_from`` (float32 master weights and optimizer
state whatever the checkpoint's dtype; FPROP_DTYPE computes). The data are TextLmData's
files tokenized with the model's tokenizer (VOCAB_PATH is the directory): documents
(RECORDS=TEXT, TEXT_FORMAT, TEXT_FIELD) or prompt/completion pairs
(RECORDS=PROMPT_COMPLETION, PROMPT_FIELD, COMPLETION_FIELD, MAX_PROMPT_LEN) or chat
conversations rendered with the model's chat template, the loss on the assistant turns
(RECORDS=CHAT, MESSAGES_FIELD, MAX_PROMPT_LEN: ``tasks.lm.chat``)::

    paxlite --exp=tasks.lm.hf.HfCausalLm --job_log_dir=/tmp/ft --set HF_MODEL=/models/qwen \\
        --set TEXT_DATA_PATH=train.jsonl --set TEXT_EVAL_DATA_PATH=eval.jsonl \\
        --set RECORDS=PROMPT_COMPLETION --set TEXT_FORMAT=JSONL

The model's shape is config.json's, so the knobs of paxlite's own Transformer are not
this experiment's: ``--set NUM_LAYERS=4`` is one KnobError naming config.json's field.
The job keeps the directory's config, generation config and tokenizer
(``<job>/hf_model/``) for ``paxlite-export``, and ``from_pretrained(<job>)`` takes its
tokenizer from there (``generate`` of texts).
"""

from __future__ import annotations

import enum
import json
from typing import Any

from etils import epath

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.pretrained import adapters, loading
from praxis_lite.inputs.seqio_input import DecodeForm
from praxis_lite.tokenizers.hf_chat import ChatTemplate, ChatTemplateError
from tasks.lm.chat import register_chat_task
from tasks.lm.hf_model import HfModelKnobs
from tasks.lm.prompt_completion import PromptCompletionKnobs


class Records(enum.Enum):
    """What each line of the data files is."""

    TEXT = "text"  # A document (TEXT_FORMAT, TEXT_FIELD): TextLmData's.
    PROMPT_COMPLETION = "prompt_completion"  # {PROMPT_FIELD: ..., COMPLETION_FIELD: ...}
    CHAT = "chat"  # {MESSAGES_FIELD: [{"role": ..., "content": ...}, ...]}: tasks.lm.chat.


@registry.register
class HfCausalLm(HfModelKnobs, PromptCompletionKnobs):
    """A Hugging Face decoder-only model fine-tuned on text or prompt/completion files.

    Attributes (knobs, beyond HfModelKnobs' HF_MODEL, TextLmData's and the
    prompt/completion ones):
      RECORDS: what the data files hold (see :class:`Records`).
      MESSAGES_FIELD: RECORDS=CHAT: the JSON field of each record's conversation (a list
        of {"role", "content"}); each assistant turn is an example, its context (at most
        MAX_PROMPT_LEN tokens: a longer one keeps its end) the prompt.
      HF_RANDOM_INIT: start from random weights (the seed's), not HF_MODEL's: for a
        directory holding a config alone. Unset, a directory without weights is refused
        when training starts (a config alone still sizes a job: --mode=compile).
    """

    RECORDS: Records = Records.TEXT
    MESSAGES_FIELD: str = "messages"
    HF_RANDOM_INIT: bool = False

    TEXT_TASK_NAME = "hf_text"
    LEARNING_RATE = 1e-5
    LR_COS_WARMUP = 0
    LR_COS_DECAY_START = 0
    NUM_TRAIN_STEPS = 100
    LR_COS_DECAY_END = NUM_TRAIN_STEPS
    PERCORE_BATCH_SIZE = 1
    MAX_SEQ_LEN = 512

    def __init__(self) -> None:
        adapter = self._init_adapter()
        if adapter is not None:
            self._take_adapter(adapter)
        if isinstance(self.HF_MODEL, str):
            self._check_vocab_path()
            self.VOCAB_PATH = self.HF_MODEL  # The model's tokenizer, for the inputs.
        super().__init__()

    def validate(self) -> None:
        super().validate()
        if self.HF_RANDOM_INIT and self.INIT_FROM is not None:
            raise KnobError(
                f"{type(self).__qualname__}: HF_RANDOM_INIT=True and INIT_FROM={self.INIT_FROM} "
                "both say where the weights start; give one."
            )
        if self.RECORDS is Records.PROMPT_COMPLETION:
            self.check_prompt_completion_knobs()
        elif self.RECORDS is Records.CHAT:
            self._check_chat_knobs()

    def _check_chat_knobs(self) -> None:
        """KnobError unless the records can be chat (JSONL) and HF_MODEL has a chat template."""
        name = type(self).__qualname__
        self.check_records_of_prompts("chat records", "the assistant turn's")
        try:
            template = ChatTemplate.from_dir(self.HF_MODEL)
        except ChatTemplateError as e:
            raise KnobError(f"{name}: HF_MODEL: {e}") from None
        if template is None:
            raise KnobError(
                f"{name}: RECORDS=CHAT, but HF_MODEL={self.HF_MODEL} has no chat template "
                "(chat_template.jinja, or chat_template in tokenizer_config.json); use an "
                "instruct model's directory, or RECORDS=TEXT / PROMPT_COMPLETION."
            )

    def _init_adapter(self) -> peft_adapter.AdapterConfig | None:
        """INIT_FROM's adapter config when INIT_FROM is a PEFT adapter directory."""
        if self.INIT_FROM is None or not peft_adapter.is_adapter_dir(epath.Path(self.INIT_FROM)):
            return None
        try:
            return peft_adapter.AdapterConfig.load(self.INIT_FROM)
        except peft_adapter.PeftError as e:
            raise KnobError(f"{type(self).__qualname__}: INIT_FROM: {e}") from None

    def _take_adapter(self, adapter: peft_adapter.AdapterConfig) -> None:
        """HF_MODEL (when unset) and the LoRA knobs (when LORA_RANK is unset) from the
        adapter INIT_FROM continues; KnobError when they cannot be, or disagree with it."""
        name = type(self).__qualname__
        if self.HF_MODEL is None:
            base = adapter.base_model_name_or_path
            if not base or not hf_checkpoint.is_hf_model_dir(epath.Path(base)):
                raise KnobError(
                    f"{name}: INIT_FROM={self.INIT_FROM} adapts {base!r}, which is no local "
                    "Hugging Face model directory (a hub id? paxlite downloads nothing); "
                    "set --set HF_MODEL=DIR to the base model."
                )
            self.HF_MODEL = base
        else:
            self._check_adapter_base()
        theirs = {
            "LORA_RANK": adapter.rank,
            "LORA_ALPHA": adapter.alpha,
            "LORA_USE_RSLORA": adapter.use_rslora,
            "LORA_TARGET_MODULES": ",".join(adapter.target_modules),
        }
        if not self.LORA_RANK:
            for knob, value in theirs.items():
                setattr(self, knob, value)
            self.LORA_DROPOUT = adapter.dropout
            return
        ours = {**{k: getattr(self, k) for k in theirs}, "LORA_TARGET_MODULES": self.lora_modules()}
        ours["LORA_TARGET_MODULES"] = ",".join(sorted(ours["LORA_TARGET_MODULES"]))
        differ = [f"{k}={ours[k]!r} (adapter: {v!r})" for k, v in theirs.items() if ours[k] != v]
        if differ:
            raise KnobError(
                f"{name}: INIT_FROM={self.INIT_FROM} is an adapter these LoRA knobs disagree "
                f"with: {'; '.join(differ)}; leave them unset to continue the adapter as it is."
            )

    def _check_adapter_base(self) -> None:
        """KnobError when HF_MODEL is not the model INIT_FROM's adapter was trained on; a
        warning when the adapter names a base that cannot be opened, under another name."""
        try:
            adapters.check_base(epath.Path(self.INIT_FROM), epath.Path(self.HF_MODEL))
        except adapters.AdapterError as e:
            raise KnobError(f"{type(self).__qualname__}: HF_MODEL: {e}") from None

    def _check_vocab_path(self) -> None:
        if type(self).VOCAB_PATH not in (None, self.HF_MODEL):
            raise KnobError(
                f"{type(self).__qualname__}: VOCAB_PATH={type(self).VOCAB_PATH!r}, but the "
                "model's tokenizer is HF_MODEL's; leave VOCAB_PATH unset."
            )

    def task(self) -> Any:
        """TextLmData's task over this model, its parameters from HF_MODEL at step 0 (unless
        INIT_FROM names another start, e.g. a job fine-tuned before)."""
        task = super().task()
        if self._init_adapter() is not None:  # The adapter's tensors, then the base's.
            task.train.init_from_checkpoint_rules = {
                self.INIT_FROM: CheckpointLoadingRules(),
                self.HF_MODEL: CheckpointLoadingRules(),
            }
        elif self.INIT_FROM is None and not self.HF_RANDOM_INIT:  # Weights or one line.
            task.train.init_from_checkpoint_rules = {self.HF_MODEL: CheckpointLoadingRules()}
        if self.RECORDS in (Records.PROMPT_COMPLETION, Records.CHAT):
            task = self.decode_with_every_eval(task)
        return self.with_generation_config(task)

    def with_generation_config(self, task: Any) -> Any:
        """``task`` decoding with HF_MODEL's generation_config.json's beam and control
        settings (transformers' rules and defaults, not praxis' length norm)."""
        task.decoder.length_norm_alpha = None
        path = epath.Path(self.HF_MODEL) / hf_checkpoint.GENERATION_CONFIG_FILE
        fields = json.loads(path.read_text()) if path.is_file() else {}
        for name, value in loading.hf_generation_settings(fields).items():
            setattr(task.decoder, name, value)
        return task

    def register_task(self) -> None:
        if self.RECORDS is Records.PROMPT_COMPLETION:
            self.register_pairs_task()
        elif self.RECORDS is Records.CHAT:
            register_chat_task(
                self.TEXT_TASK_NAME,
                train_path=self.TEXT_DATA_PATH,
                eval_path=self.TEXT_EVAL_DATA_PATH,
                messages_field=self.MESSAGES_FIELD,
                vocab_path=self.VOCAB_PATH,
            )
        else:
            super().register_task()

    def lm_input_fields(self) -> dict[str, Any]:
        if self.RECORDS in (Records.PROMPT_COMPLETION, Records.CHAT):
            return self.prompt_completion_input_fields()  # Prefix-LM rows, MAX_PROMPT_LEN.
        return super().lm_input_fields()

    def prompt_input_fields(self) -> dict[str, Any]:
        if self.RECORDS is Records.PROMPT_COMPLETION:
            return self.prompt_completion_prompt_fields()
        if self.RECORDS is Records.CHAT:  # Each held-out assistant turn after its context.
            self.register_task()
            return {
                "mixture_name": self.TEXT_TASK_NAME,
                "task_feature_lengths": self.feature_lengths(),
                "decode_form": DecodeForm.INPUTS_TARGETS,
            }
        return super().prompt_input_fields()
