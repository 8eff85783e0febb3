"""T5X's training setup as knob groups: its optimizer and schedules, its loss normalization,
and its datasets (``MIXTURE_OR_TASK_NAME``, ``MIXTURE_OR_TASK_MODULE``,
``TASK_FEATURE_LENGTHS``: T5X's gin macros under their own names).

``T5xTrainKnobs`` is ``t5_1_1/base.gin`` + ``runs/{pretrain,finetune}.gin``'s learner:
Adafactor as T5X runs it (decay 0.8, factored by logical axes, parameter scale, update
clipping 1.0, no momentum), T5X's ``create_learning_rate_scheduler`` factors (``constant *
rsqrt_decay`` or ``constant``) and ``LOSS_NORMALIZING_FACTOR``. ``T5xDataKnobs`` reads a
registered SeqIO task or mixture, importing the user's module that registers it, as T5X's
``utils.DatasetConfig`` does: training packed and shuffled, ``EVAL_STEPS`` batches of
'validation' per eval, and the 'validation' inputs decoded and scored by the task's
metrics when ``DECODE_VALIDATION`` is on (T5X's ``infer_eval``).
"""

from __future__ import annotations

import enum
import importlib
from typing import Any

from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from paxlite.experiments.tasks_lib import Learner
from praxis_lite import config as config_lib
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from praxis_lite.inputs.synthetic_input import SyntheticSeq2SeqInput
from praxis_lite.optim import optimizers, schedules
from tasks.lm.knob_groups import check_at_least, knob_group

#: How a user names the data (in input errors).
_DATA_FLAG = (
    "--set=MIXTURE_OR_TASK_NAME=NAME (a registered SeqIO task or mixture; "
    "MIXTURE_OR_TASK_MODULE=your.module registers it; --tfds_data_dir=DIR for TFDS data)"
)

#: Packages T5X users' modules import that cannot be installed beside our seqio.
_UNINSTALLABLE = {"t5": "the `t5` package (t5.data) pins an older seqio and TensorFlow"}


class T5xLrSchedule(enum.Enum):
    """T5X's ``create_learning_rate_scheduler.factors`` that its T5 runs use."""

    RSQRT_DECAY = "constant * rsqrt_decay"  # runs/pretrain.gin
    CONSTANT = "constant"  # runs/finetune.gin


@knob_group
class T5xTrainKnobs(BaseExperiment):
    """T5X's learner: Adafactor, its learning-rate factors and loss normalization.

    LEARNING_RATE: T5X's ``base_learning_rate`` (pretraining 1.0, fine-tuning 1e-3).
    LR_SCHEDULE: ``constant * rsqrt_decay`` (``LEARNING_RATE / sqrt(max(step,
    LR_WARMUP_STEPS))``) or ``constant``. LR_WARMUP_STEPS: T5X's ``warmup_steps`` (the
    rsqrt's flat start; ``constant`` ignores it, as T5X does).
    LOSS_NORMALIZING_FACTOR: T5X's: None sums the loss over the target tokens (T5X's
    default), a number divides that sum by it (233472 = 2048 x 114 for models pretrained
    with Mesh TensorFlow), ``'NUM_REAL_TARGET_TOKENS'`` takes the per-token mean.
    ADAFACTOR_DECAY_RATE, ADAFACTOR_CLIPPING_THRESHOLD: T5X's ``decay_rate`` and
    ``clipping_threshold`` (None: no update clipping).
    """

    LEARNING_RATE: float = 1.0
    LR_SCHEDULE: T5xLrSchedule = T5xLrSchedule.RSQRT_DECAY
    LR_WARMUP_STEPS: int = 10_000
    LOSS_NORMALIZING_FACTOR: float | str | None = None
    ADAFACTOR_DECAY_RATE: float = 0.8
    ADAFACTOR_CLIPPING_THRESHOLD: float | None = 1.0

    def validate(self) -> None:
        super().validate()
        check_at_least(self, 1, "LR_WARMUP_STEPS")
        self.loss_normalizing_factor()

    def loss_normalizing_factor(self) -> float | None:
        """The learner's factor: None for the per-token mean, else ``F`` (sum / F)."""
        factor = self.LOSS_NORMALIZING_FACTOR
        if factor == "NUM_REAL_TARGET_TOKENS":
            return None
        if factor is None:
            return 1.0
        if isinstance(factor, str) or not factor > 0:
            raise KnobError(
                f"{type(self).__qualname__}.LOSS_NORMALIZING_FACTOR = {factor!r}; give a number "
                "> 0, None (the summed loss, T5X's default) or 'NUM_REAL_TARGET_TOKENS' (the "
                "per-token mean)."
            )
        return float(factor)

    def t5x_lr_schedule(self) -> config_lib.Config:
        if self.LR_SCHEDULE is T5xLrSchedule.CONSTANT:
            return config_lib.Config(schedules.Constant)
        return config_lib.Config(schedules.RsqrtDecay, warmup_steps=self.LR_WARMUP_STEPS)

    def learner(self) -> config_lib.Config:
        """The ``Learner`` config: T5X's Adafactor (factored by logical axes) and schedule."""
        optimizer = config_lib.Config(
            optimizers.Adafactor,
            learning_rate=self.LEARNING_RATE,
            lr_schedule=self.t5x_lr_schedule(),
            decay_rate=self.ADAFACTOR_DECAY_RATE,
            clipping_threshold=self.ADAFACTOR_CLIPPING_THRESHOLD,
            factor_rules=optimizers.T5X_FACTOR_RULES,
        )
        return config_lib.Config(
            Learner, optimizer=optimizer, loss_normalizing_factor=self.loss_normalizing_factor()
        )


@knob_group
class FeatureLengthsKnob(BaseExperiment):
    """TASK_FEATURE_LENGTHS (T5X's name): an encoder-decoder's tokens per side,
    ``{'inputs': S, 'targets': T}``; longer texts lose their ends (the EOS kept)."""

    TASK_FEATURE_LENGTHS: dict[str, int] = {"inputs": 512, "targets": 114}  # noqa: RUF012

    def validate(self) -> None:
        super().validate()
        lengths = self.TASK_FEATURE_LENGTHS
        if set(lengths) != {"inputs", "targets"} or min(lengths.values()) < 2:
            raise KnobError(
                f"{type(self).__qualname__}.TASK_FEATURE_LENGTHS = {lengths}; give both sides' "
                "tokens, at least 2 each, e.g. --set \"TASK_FEATURE_LENGTHS={'inputs': 512, "
                "'targets': 114}\"."
            )


@knob_group
class T5xDataKnobs(FeatureLengthsKnob):
    """T5X's dataset macros: a registered SeqIO task or mixture, trained on and evaluated.

    MIXTURE_OR_TASK_NAME: the task or mixture ('train' and 'validation' splits).
    MIXTURE_OR_TASK_MODULE: the Python module imported first, to register it (the
    user's own, unchanged; T5X's ``--gin.MIXTURE_OR_TASK_MODULE``). TASK_FEATURE_LENGTHS
    (``FeatureLengthsKnob``). SHUFFLE_TRAIN_EXAMPLES and
    PACKED_INPUT: the training rows (T5X: both on). EVAL_STEPS: batches of 'validation'
    per eval (T5X's ``eval_steps``; each eval reads the next ones, where T5X re-reads the
    first). DECODE_VALIDATION: decode the 'validation' inputs
    (unpacked) and score them with the task's metrics at each eval (T5X's
    ``infer_eval``).
    """

    MIXTURE_OR_TASK_NAME: str | None = None
    MIXTURE_OR_TASK_MODULE: str | None = None
    SHUFFLE_TRAIN_EXAMPLES: bool = True
    PACKED_INPUT: bool = True
    EVAL_STEPS: int = 20
    DECODE_VALIDATION: bool = False

    def validate(self) -> None:
        super().validate()
        check_at_least(self, 1, "EVAL_STEPS")

    def register_default_task(self) -> None:
        """Registers the experiment's own task when it has one (e.g. C4 span corruption)."""

    def mixture_or_task_name(self) -> str:
        """MIXTURE_OR_TASK_NAME ('' when unset: the inputs then say so when built, so a
        compile needs none), its module imported (or the experiment's task registered)."""
        if self.MIXTURE_OR_TASK_MODULE:
            import_task_module(self.MIXTURE_OR_TASK_MODULE)
        else:
            self.register_default_task()
        return self.MIXTURE_OR_TASK_NAME or ""

    def _seqio(self, **fields: Any) -> config_lib.Config:
        return config_lib.Config(
            SeqIOInput,
            mixture_name=self.mixture_or_task_name(),
            task_feature_lengths=dict(self.TASK_FEATURE_LENGTHS),
            encoder_decoder=True,
            batch_size=self.infeed_batch_size(),
            model_vocab_size=self.VOCAB_SIZE,
            data_flag=_DATA_FLAG,
            **fields,
        )

    def datasets(self) -> list[Any]:
        """'train' (packed, shuffled) and EVAL_STEPS batches of 'validation' (packed)."""
        train = self._seqio(
            split_name="train",
            feature_converter_pack=self.PACKED_INPUT,
            shuffle=self.SHUFFLE_TRAIN_EXAMPLES,
            seed=self.SEED,
        )
        evaluation = self._seqio(
            name="validation",
            split_name="validation",
            is_training=False,
            feature_converter_pack=self.PACKED_INPUT,
            eval_loop_num_batches=self.EVAL_STEPS,
            repeat=True,
            seed=42,  # T5X's train_eval seed.
        )
        return [train, evaluation]

    def decoder_datasets(self) -> list[Any]:
        """With DECODE_VALIDATION: 'validation' decoded (one epoch) and scored by the task."""
        if not self.DECODE_VALIDATION:
            return []
        decode = self._seqio(
            name="validation_decode",
            split_name="validation",
            is_training=False,
            reset_for_eval=True,
            decode_form=DecodeForm.INPUTS_TARGETS,
        )
        return [decode]

    def stand_in_datasets(self, dataset_cfgs: list[Any]) -> list[Any]:
        """Random tokens in the training rows' shapes: a compile reads no data."""
        lengths = self.TASK_FEATURE_LENGTHS
        return [
            config_lib.Config(
                SyntheticSeq2SeqInput,
                batch_size=cfg.batch_size,
                vocab_size=self.VOCAB_SIZE,
                max_len=min(lengths.values()) - 1,
                feature_lengths=(lengths["inputs"], lengths["targets"]),
            )
            for cfg in dataset_cfgs
            if getattr(cfg, "is_training", True)
        ]


def import_task_module(module: str) -> None:
    """Imports the user's module registering SeqIO tasks (T5X's MIXTURE_OR_TASK_MODULE).

    Raises:
      KnobError: the module, or a package it imports, cannot be found (one line naming
        both, and the way out for T5's own ``t5.data``).
    """
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise _missing_module_error(module, e) from None
    except Exception as e:  # The user's module failed: say where, in one line.
        first_line = (str(e).splitlines() or [""])[0]
        raise KnobError(
            f"MIXTURE_OR_TASK_MODULE {module!r} failed while importing: {type(e).__name__}: "
            f"{first_line}; fix the module (`python -c 'import {module}'` shows where)."
        ) from None


def _missing_module_error(module: str, e: ModuleNotFoundError) -> KnobError:
    """The one-line error of a task module that, or whose import, is not installed."""
    missing = (e.name or "").split(".")[0]
    why = _UNINSTALLABLE.get(missing)
    if why is not None:
        return KnobError(
            f"MIXTURE_OR_TASK_MODULE {module!r} imports {e.name!r}, which paxlite cannot "
            f"install ({why}); register the task with seqio directly (seqio.TaskRegistry.add"
            " with seqio's preprocessors; T5's span corruption is "
            "praxis_lite.inputs.span_corruption), or use a task paxlite registers."
        )
    where = "is not importable" if e.name == module else f"imports {e.name!r}, not installed"
    return KnobError(
        f"MIXTURE_OR_TASK_MODULE {module!r} {where}; put the module on PYTHONPATH (or "
        "install its package) and give its dotted name."
    )
