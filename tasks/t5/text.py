"""T5 on your inputs -> targets pairs (JSONL), no SeqIO task to write.

Each line of TEXT_DATA_PATH / TEXT_EVAL_DATA_PATH is a JSON object such as ``{"inputs":
"translate: chat", "targets": "cat"}`` (fields PROMPT_FIELD and COMPLETION_FIELD). The
SeqIO task made of them has T5's features: 'inputs' and 'targets', each with an EOS, in
bytes or the SentencePiece model VOCAB_PATH names; training rows are seqio's
encoder-decoder rows (packed with PACKED_INPUT), TASK_FEATURE_LENGTHS tokens a side.
With held-out pairs, train_and_eval decodes their inputs with every eval and scores the
decoded text against the targets (``exact_match``, ``char_accuracy``)::

    python -m tasks.lm.prompt_completion --write_examples=/tmp/pc_data
    paxlite --exp=tasks.t5.text.T5TextTiny --job_log_dir=/tmp/t5_text --mode=train_and_eval \\
        --set TEXT_DATA_PATH=/tmp/pc_data/train.jsonl \\
        --set TEXT_EVAL_DATA_PATH=/tmp/pc_data/eval.jsonl \\
        --set PROMPT_FIELD=prompt --set COMPLETION_FIELD=completion
"""

from __future__ import annotations

from typing import Any

from etils import epath

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from paxlite.formats.hf import checkpoint as hf_checkpoint
from praxis_lite import config as config_lib
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from praxis_lite.tokenizers.hf_tokenizer import SENTENCEPIECE_MODELS, TOKENIZER_JSON
from tasks.lm.prompt_completion import PairFieldKnobs
from tasks.t5.t5x_setup import FeatureLengthsKnob
from tasks.t5.tiny import T5Tiny

_TRAIN_DATA_FLAG = "--set=TEXT_DATA_PATH=PATH"
_EVAL_DATA_FLAG = "--set=TEXT_EVAL_DATA_PATH=PATH"


@registry.register
class T5TextTiny(PairFieldKnobs, FeatureLengthsKnob, T5Tiny):
    """T5Tiny's model (VOCAB_SIZE for bytes) on JSONL inputs/targets pairs: a laptop CPU.

    Knobs beyond T5Tiny's: PairFieldKnobs' (the files, PROMPT_FIELD / COMPLETION_FIELD each
    record's input and target fields, VOCAB_PATH a SentencePiece model or bytes) and
    TASK_FEATURE_LENGTHS (``FeatureLengthsKnob``).
    """

    TASK_FEATURE_LENGTHS = {"inputs": 32, "targets": 16}  # noqa: RUF012
    PROMPT_FIELD = "inputs"
    COMPLETION_FIELD = "targets"
    TEXT_TASK_NAME = "text_seq2seq"
    VOCAB_SIZE = 384  # Bytes: 256 + pad, EOS, UNK, rounded up to a multiple of 128.
    PERCORE_BATCH_SIZE = 16

    def validate(self) -> None:
        super().validate()
        self.check_pair_fields()
        self._check_vocab_is_init_froms()

    def _check_vocab_is_init_froms(self) -> None:
        """KnobError when INIT_FROM is a Hugging Face directory with a tokenizer and
        VOCAB_PATH is not in it: the data would be other ids than the model's, and the job
        would keep (for ``from_pretrained`` and ``paxlite-export``) a tokenizer it never
        trained with."""
        if not self.INIT_FROM or not hf_checkpoint.is_hf_model_dir(epath.Path(self.INIT_FROM)):
            return
        directory = epath.Path(self.INIT_FROM)
        models = [name for name in SENTENCEPIECE_MODELS if (directory / name).exists()]
        if not models and not (directory / TOKENIZER_JSON).exists():
            return
        vocab = epath.Path(self.VOCAB_PATH) if self.VOCAB_PATH else None
        if vocab is not None and directory.resolve() in (vocab.resolve(), vocab.resolve().parent):
            return
        raise KnobError(
            f"{type(self).__qualname__}: INIT_FROM={self.INIT_FROM} has its own tokenizer but "
            f"VOCAB_PATH is {self.VOCAB_PATH or 'unset (bytes)'}; set "
            f"--set VOCAB_PATH={directory / models[0] if models else directory} (the ids its "
            "embeddings were trained on)."
        )

    def task(self) -> Any:
        """T5Tiny's task; train_and_eval decodes with every eval (with held-out pairs)."""
        task = super().task()
        task.decode_interval_steps = (
            self.EVAL_INTERVAL_STEPS or self.NUM_TRAIN_STEPS if self.TEXT_EVAL_DATA_PATH else 0
        )
        return task

    def _seqio(self, **fields: Any) -> config_lib.Config:
        self.register_pairs_task(inputs_eos=True)
        return config_lib.Config(
            SeqIOInput,
            mixture_name=self.TEXT_TASK_NAME,
            task_feature_lengths=dict(self.TASK_FEATURE_LENGTHS),
            encoder_decoder=True,
            batch_size=self.infeed_batch_size(),
            model_vocab_size=self.VOCAB_SIZE,
            seed=self.SEED,
            **fields,
        )

    def _held_out(self, **fields: Any) -> config_lib.Config:
        return self._seqio(
            split_name="validation",
            is_training=False,
            reset_for_eval=True,
            data_flag=_EVAL_DATA_FLAG,
            **fields,
        )

    def datasets(self) -> list[Any]:
        """The training pairs (packed) and, with TEXT_EVAL_DATA_PATH, the held-out ones."""
        train = self._seqio(
            split_name="train", feature_converter_pack=self.PACKED_INPUT, data_flag=_TRAIN_DATA_FLAG
        )
        if self.TEXT_EVAL_DATA_PATH is None:
            return [train]
        return [train, self._held_out(name="validation")]

    def decoder_datasets(self) -> list[Any]:
        """The held-out inputs, decoded and scored against their targets; none without them."""
        if self.TEXT_EVAL_DATA_PATH is None:
            return []
        return [self._held_out(name="pairs", decode_form=DecodeForm.INPUTS_TARGETS)]
