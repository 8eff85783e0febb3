"""The experiment a T5X run becomes: ``python -m paxlite.t5x.train --gin_file=...``.

``paxlite.formats.t5x.translation`` sets these knobs from what T5X's gin files bind (the
model, Adafactor, the learning-rate factors, the datasets, checkpoints and partitioner);
the same run is ``paxlite --exp=T5xGin --set KNOB=VALUE ...``. The model directory gets
T5X's ``config.gin`` (the gin config, as T5X writes it) with the job's other files.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.t5x import inference_eval as t5x_inference_eval
from paxlite.formats.t5x import model_dir as t5x_model_dir
from paxlite.formats.t5x import summaries as t5x_summaries
from paxlite.formats.t5x.api import partitioning
from praxis_lite import config as config_lib
from praxis_lite.inputs.seqio_input import DecodeForm
from praxis_lite.optim import optimizers, schedules
from tasks.lm.knob_groups import LoopKnobs, check_at_least, knob_group
from tasks.t5.t5_base import T5Knobs, check_t5_mesh, with_t5x_beam_rules
from tasks.t5.t5x_setup import T5xDataKnobs, T5xTrainKnobs

#: T5's SentencePiece EOS id.
_EOS = 1
#: Adafactor's min_dim_size_to_factor that no dimension reaches (T5X's ``factored=False``).
_NEVER_FACTOR = 2**62
#: T5X's ``config.gin``, written into the model directory.
CONFIG_GIN = "config.gin"


@knob_group
class T5xGinKnobs(T5Knobs, T5xTrainKnobs, T5xDataKnobs, LoopKnobs):
    """T5X's settings that paxlite's T5 experiments have no knob for.

    BATCH_SIZE: T5X's global batch (examples per step over all devices; PERCORE_BATCH_SIZE
    follows from it). LR_FACTORS and LR_DECAY_FACTOR, LR_STEPS_PER_DECAY,
    LR_STEPS_PER_CYCLE, LR_STEP_OFFSET, LR_MIN: ``create_learning_rate_scheduler``'s
    ``factors`` and arguments (LEARNING_RATE is its ``base_learning_rate``, LR_WARMUP_STEPS
    its ``warmup_steps``). USE_CACHED_TASKS: read the tasks' offline caches. DATA_SEED:
    the training data's shuffle seed (None: SEED). TRAIN_SPLIT, EVAL_SPLIT (None: no
    eval), EVAL_DATA_SEED, EVAL_PACKED (None: as training), DECODE_SPLIT,
    DECODE_BATCH_SIZE, DECODE_DATA_SEED: the datasets'; DECODE_FEATURE_LENGTHS: the decoded
    examples' lengths (None: the longest example's, T5X's infer_eval default). NUM_DECODES:
    beams per decoded input; BEAM_ALPHA: T5X's length normalization. SAMPLED_DECODING:
    T5X's ``temperature_sample`` instead, with SAMPLE_TEMPERATURE, SAMPLE_TOP_K (T5X's
    ``topk``: 1, its default, is greedy; 0: all) and SAMPLE_TOP_P (``topp``; 0: off).
    T5X_CONFIG_GIN: the text
    written as the model directory's config.gin. PERIODS_FROM_STEP: the step the checkpoint,
    eval and summary periods count from (T5X's: the step the run starts at). RESUME_INPUT:
    a resumed run continues the training data where it stopped (T5X's ``save_dataset``;
    False: from the first batch again, with a warning). T5X_CHECKPOINTS: write T5X's
    ``checkpoint_<step>/`` (and model-info.txt) in the job directory instead of paxlite's
    ``checkpoints/<step>/`` (Adafactor without momentum only), with T5X_AXIS_RULES (T5X's
    logical axis rules; None: T5X's standard ones) in model-info.txt. SAVE_AT_START: save
    the state the run starts from first (T5X's, with a checkpoint period).
    LABEL_SMOOTHING: T5X's ``label_smoothing``
    (the label keeps ``1 - a``, every other class ``a / (V - 1)``; see
    :func:`smoothing_over_all_classes`).

    Adafactor's other fields, T5X's names: ADAFACTOR_FACTORED, _MULTIPLY_BY_PARAMETER_SCALE,
    _BETA1 (momentum; None: none), _MIN_DIM_SIZE_TO_FACTOR, _EPSILON1, _EPSILON2,
    _GLOBAL_NORM_CLIP (clip the gradients' global norm first; None: off). OPTAX_CHAIN:
    optax transformations instead of Adafactor (T5X's ``optimizers.chain``), each a dict
    ``{"name": "adamw", "learning_rate": {"name": "warmup_cosine_decay_schedule", ...}}``.
    """

    BATCH_SIZE: int = 128
    LR_FACTORS: str = "constant * rsqrt_decay"
    LR_DECAY_FACTOR: float = 0.5
    LR_STEPS_PER_DECAY: int = 20000
    LR_STEPS_PER_CYCLE: int = 100000
    LR_STEP_OFFSET: int = 0
    LR_MIN: float = 1e-8
    USE_CACHED_TASKS: bool = False
    DATA_SEED: int | None = None
    TRAIN_SPLIT: str = "train"
    EVAL_SPLIT: str | None = "validation"
    EVAL_PACKED: bool | None = None
    EVAL_DATA_SEED: int | None = 42
    DECODE_SPLIT: str = "validation"
    DECODE_BATCH_SIZE: int | None = None
    DECODE_DATA_SEED: int | None = None
    DECODE_FEATURE_LENGTHS: dict[str, int] | None = None
    NUM_DECODES: int = 1
    SAMPLED_DECODING: bool = False
    BEAM_ALPHA: float = 0.6
    SAMPLE_TEMPERATURE: float = 1.0
    SAMPLE_TOP_K: int = 1
    SAMPLE_TOP_P: float = 0.0
    T5X_CONFIG_GIN: str | None = None
    LABEL_SMOOTHING: float = 0.0
    ADAFACTOR_FACTORED: bool = True
    ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE: bool = True
    ADAFACTOR_BETA1: float | None = None
    ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR: int = 128
    ADAFACTOR_EPSILON1: float = 1e-30
    ADAFACTOR_EPSILON2: float = 1e-3
    ADAFACTOR_GLOBAL_NORM_CLIP: float | None = None
    OPTAX_CHAIN: tuple[dict[str, Any], ...] | None = None
    PERIODS_FROM_STEP: int = 0
    RESUME_INPUT: bool = True
    T5X_CHECKPOINTS: bool = False
    SAVE_AT_START: bool = False
    T5X_AXIS_RULES: tuple[tuple[str, str | None], ...] | None = None


@registry.register
class T5xGin(T5xGinKnobs):
    """A T5X run's model, learner, data and loop (set by ``python -m paxlite.t5x.train``)."""

    NUM_ENCODER_LAYERS = 2
    NUM_DECODER_LAYERS = 2
    MODEL_DIMS = 8
    HIDDEN_DIMS = 16
    NUM_HEADS = 4
    DIMS_PER_HEAD = 3
    VOCAB_SIZE = 32128
    PERCORE_BATCH_SIZE = 0  # Unused: BATCH_SIZE is the global batch.
    ICI_MESH_SHAPE = (1, -1, 1)
    NUM_TRAIN_STEPS = 1000

    def validate(self) -> None:
        super().validate()
        check_at_least(self, 1, "BATCH_SIZE", "NUM_DECODES")
        check_t5_mesh(self)
        if self.SAMPLED_DECODING and self.NUM_DECODES > 1:
            raise KnobError(
                f"{type(self).__qualname__}: NUM_DECODES={self.NUM_DECODES} with SAMPLED_DECODING: "
                "paxlite samples one decode per input; set NUM_DECODES=1 (or decode by beams)."
            )
        if self.T5X_CHECKPOINTS and (self.OPTAX_CHAIN or self.ADAFACTOR_BETA1 is not None):
            raise KnobError(
                f"{type(self).__qualname__}: T5X_CHECKPOINTS writes T5X's Adafactor state, "
                "which has no place for momentum (ADAFACTOR_BETA1) or OPTAX_CHAIN's state; "
                "set T5X_CHECKPOINTS=False (paxlite's checkpoints)."
            )
        if not 0.0 <= self.LABEL_SMOOTHING < 1.0:
            raise KnobError(
                f"{type(self).__qualname__}.LABEL_SMOOTHING = {self.LABEL_SMOOTHING}; it must be "
                "in [0, 1)."
            )
        try:
            self.t5x_lr_schedule()
        except ValueError as e:
            raise KnobError(f"{type(self).__qualname__}.LR_FACTORS: {e}") from None

    def model(self) -> config_lib.Config:
        """T5's model; T5X's label smoothing as the softmax's (same targets, same gradients)."""
        model = super().model()
        if self.LABEL_SMOOTHING:
            softmax = model.encoder_decoder_tpl.softmax_tpl
            softmax.label_smoothing = smoothing_over_all_classes(
                self.LABEL_SMOOTHING, self.VOCAB_SIZE
            )
        return model

    def _batch_sizes(self, num_devices: int, num_hosts: int, percore: float | None) -> Any:
        """T5X's global batch BATCH_SIZE over the devices (or ``percore`` where asked)."""
        if percore is None or percore == self.PERCORE_BATCH_SIZE:
            percore = Fraction(self.BATCH_SIZE, num_devices)
        return super()._batch_sizes(num_devices, num_hosts, percore)

    def t5x_lr_schedule(self) -> config_lib.Config:
        """T5X's whole learning rate (the optimizer's LEARNING_RATE factor is 1)."""
        schedule = config_lib.Config(
            schedules.T5xFactors,
            factors=self.LR_FACTORS,
            base_learning_rate=self.LEARNING_RATE,
            warmup_steps=self.LR_WARMUP_STEPS,
            decay_factor=self.LR_DECAY_FACTOR,
            steps_per_decay=self.LR_STEPS_PER_DECAY,
            steps_per_cycle=self.LR_STEPS_PER_CYCLE,
            step_offset=self.LR_STEP_OFFSET,
            min_learning_rate=self.LR_MIN,
        )
        config_lib.instantiate(schedule)  # Checks the factors.
        return schedule

    def learner(self) -> config_lib.Config:
        """T5X's Adafactor with every field, or OPTAX_CHAIN; the schedule is the whole rate."""
        learner = super().learner()
        if self.OPTAX_CHAIN is not None:
            learner.optimizer = config_lib.Config(
                optimizers.OptaxChain, transformations=tuple(self.OPTAX_CHAIN)
            )
            return learner
        optimizer = learner.optimizer
        optimizer.learning_rate = 1.0
        optimizer.multiply_by_parameter_scale = self.ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE
        optimizer.momentum = self.ADAFACTOR_BETA1
        optimizer.min_dim_size_to_factor = (
            self.ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR if self.ADAFACTOR_FACTORED else _NEVER_FACTOR
        )
        optimizer.epsilon = self.ADAFACTOR_EPSILON1
        optimizer.min_param_scale = self.ADAFACTOR_EPSILON2
        optimizer.clip_gradient_norm_to_value = self.ADAFACTOR_GLOBAL_NORM_CLIP or 0.0
        return learner

    def task(self) -> Any:
        task = self.single_task(self.model(), self.learner())
        task = with_t5x_beam_rules(task)
        task.decoder.eos_token_id = _EOS
        task.decoder.do_sample = self.SAMPLED_DECODING
        task.decoder.num_beams = 1 if self.SAMPLED_DECODING else self.NUM_DECODES
        task.decoder.length_norm_alpha = self.BEAM_ALPHA
        task.decoder.one_beam_search = True  # T5X's beam_search, even with one decode.
        if self.SAMPLED_DECODING:
            task.decoder.temperature = self.SAMPLE_TEMPERATURE
            task.decoder.top_k = self.SAMPLE_TOP_K
            task.decoder.top_p = self.SAMPLE_TOP_P or 1.0  # T5X's 0: no nucleus.
            task.decoder.rescale_log_probs = True  # T5X's scores: under what it samples from.
        task.decode_interval_steps = self.EVAL_INTERVAL_STEPS if self.DECODE_VALIDATION else 0
        if self.DECODE_VALIDATION:  # T5X's infer_eval: seqio's evaluator, T5X's outputs.
            task.inference_evaluator = config_lib.Config(
                t5x_inference_eval.T5xInferenceEval,
                mixture_or_task_name=self.MIXTURE_OR_TASK_NAME or "",
                split=self.DECODE_SPLIT,
                batch_size=self.DECODE_BATCH_SIZE or self.BATCH_SIZE,
                seed=self.DECODE_DATA_SEED,
                use_cached=self.USE_CACHED_TASKS,
                task_feature_lengths=self.DECODE_FEATURE_LENGTHS,
            )
        task.periods_from_step = self.PERIODS_FROM_STEP
        task.summary_layout = self._t5x_summaries()
        task.resume_input = self.RESUME_INPUT
        task.save_at_start = self.SAVE_AT_START
        if self.T5X_CHECKPOINTS:
            task.checkpoint_format = config_lib.Config(
                t5x_model_dir.T5xCheckpoints,
                gated=len(self.MLP_ACTIVATIONS) > 1,
                logical_axis_rules=tuple(
                    self.T5X_AXIS_RULES or partitioning.standard_logical_axis_rules()
                ),
                factored=self.ADAFACTOR_FACTORED,
                min_dim_size_to_factor=self.ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR,
            )
        if self.INIT_FROM:  # T5X restores the whole train state: parameters, Adafactor, step.
            task.train.init_from_checkpoint_rules = {
                self.INIT_FROM: CheckpointLoadingRules(load_step=True, load_opt_states=True)
            }
        return task

    def _t5x_summaries(self) -> config_lib.Config:
        """T5X's TensorBoard runs (``train/``, ``training_eval/<task>/``) and names."""
        import jax

        return config_lib.Config(
            t5x_summaries.T5xSummaries,
            task_name=self.MIXTURE_OR_TASK_NAME or "",
            batch_size=self.BATCH_SIZE,
            eval_batch_size=self.BATCH_SIZE,
            target_length=self.TASK_FEATURE_LENGTHS["targets"],
            num_devices=jax.device_count(),
        )

    def job_texts(self) -> dict[str, str]:
        texts = super().job_texts()
        if self.T5X_CONFIG_GIN is not None:
            texts[CONFIG_GIN] = self.T5X_CONFIG_GIN
        return texts

    def _seqio(self, **fields: Any) -> config_lib.Config:
        config = super()._seqio(**fields)
        config.use_cached = self.USE_CACHED_TASKS
        return config

    def datasets(self) -> list[Any]:
        """T5X's train dataset and, with EVAL_SPLIT, EVAL_STEPS batches of train_eval."""
        train = self._seqio(
            split_name=self.TRAIN_SPLIT,
            feature_converter_pack=self.PACKED_INPUT,
            shuffle=self.SHUFFLE_TRAIN_EXAMPLES,
            seed=self.SEED if self.DATA_SEED is None else self.DATA_SEED,
        )
        if self.EVAL_SPLIT is None:
            return [train]
        evaluation = self._seqio(
            name="validation",
            split_name=self.EVAL_SPLIT,
            is_training=False,
            feature_converter_pack=(
                self.PACKED_INPUT if self.EVAL_PACKED is None else self.EVAL_PACKED
            ),
            eval_loop_num_batches=self.EVAL_STEPS,
            repeat=True,
            reset_for_eval=True,  # T5X's training eval: the same EVAL_STEPS batches each time.
            seed=self.SEED if self.EVAL_DATA_SEED is None else self.EVAL_DATA_SEED,
        )
        return [train, evaluation]

    def decoder_datasets(self) -> list[Any]:
        """With DECODE_VALIDATION: DECODE_SPLIT decoded (one epoch), DECODE_BATCH_SIZE a step."""
        if not self.DECODE_VALIDATION:
            return []
        import jax

        batch = self.DECODE_BATCH_SIZE or self.BATCH_SIZE
        decode = self._seqio(
            name="validation_decode",
            split_name=self.DECODE_SPLIT,
            is_training=False,
            reset_for_eval=True,
            decode_form=DecodeForm.INPUTS_TARGETS,
        )
        decode.batch_size = self.infeed_batch_size(Fraction(batch, jax.device_count()))
        return [decode]


def smoothing_over_all_classes(t5x_smoothing: float, vocab_size: int) -> float:
    """The softmax's ``label_smoothing`` (mass spread over all ``V`` classes, the label's
    included) that gives T5X's targets: T5X keeps ``1 - a`` on the label and gives each other
    class ``a / (V - 1)``, which is ``b = a * V / (V - 1)`` spread over all ``V``. The
    gradients are T5X's; T5X's reported loss is lower by the targets' entropy (its
    ``normalizing_constant``), which this loss keeps."""
    return t5x_smoothing * vocab_size / (vocab_size - 1)
