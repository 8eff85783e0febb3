"""A T5X call (what gin called ``train_script.train``, ``eval_script.evaluate`` or
``infer_script.infer`` with) -> a paxlite run's knobs.

Every argument T5X's runs use is honoured: the model (``EncoderDecoderModel`` of
``network.Transformer(T5Config)``), Adafactor, the learning-rate factors, the datasets, the
checkpoints, the partitioner (mesh and logical axis rules) and the loop's periods. A value
paxlite does not implement raises :class:`UnsupportedBinding` naming the binding and the
``file:line`` that set it; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from paxlite.formats.t5x.api import (
    adafactor,
    decoding,
    infer_script,
    models,
    network,
    partitioning,
    trainer,
    utils,
)
from paxlite.formats.t5x.api.eval_script import EvalCall
from paxlite.formats.t5x.api.infer_script import InferCall
from paxlite.formats.t5x.api.optimizers import OptaxChain
from paxlite.formats.t5x.api.train_script import TrainCall
from paxlite.formats.t5x.gin_sources import GinSources
from praxis_lite import sharding
from praxis_lite.optim import schedules

#: The registered experiment a T5X run becomes (its knobs are what this module sets).
EXPERIMENT = "T5xGin"

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
#: T5X's logical axis -> paxlite's (several: one rule each); absent: no paxlite counterpart.
_LOGICAL_AXES = {
    "batch": (sharding.BATCH,),
    "vocab": (sharding.VOCAB,),
    "embed": (sharding.EMBED, sharding.ACTIVATION_EMBED),
    "mlp": (sharding.MLP,),
    "heads": (sharding.HEADS, sharding.KV_HEADS),
    "kv": (sharding.HEAD_DIM,),
    "length": (sharding.LENGTH,),
    "layers": (sharding.LAYERS,),
}
#: T5X's logical axes paxlite's T5 has no array for (T5X keeps them replicated).
_NO_COUNTERPART = {"joined_kv", "relpos_buckets", "abspos_buckets", "stack", "mlp_activations"}
#: T5X's mesh axes -> paxlite's ('data' for the batch spans the replica axis too).
_MESH_AXES = {"data": "data", "model": "mdl", None: None}


class UnsupportedBinding(ValueError):
    """A bound value paxlite's T5X runs do not implement (the binding and where it is set)."""


@dataclasses.dataclass(frozen=True)
class _Checker:
    """Raises UnsupportedBinding for fields that differ from what paxlite implements."""

    sources: GinSources

    def only(
        self,
        configured: Any,
        configurable: str,
        allowed: dict[str, Callable[[Any], bool]],
        scope: str = "",
        why: str = "",
    ) -> None:
        """Each field of the dataclass ``configured`` is its default or passes ``allowed``."""
        for field in dataclasses.fields(configured):
            value = getattr(configured, field.name)
            check = allowed.get(field.name)
            if check is not None and check(value):
                continue
            if check is None and _is_default(field, value):
                continue
            self.refuse(configurable, field.name, value, scope, why)

    def refuse(self, configurable: str, parameter: str, value: Any, scope: str = "", why: str = ""):
        name = f"{scope + '/' if scope else ''}{configurable}.{parameter}"
        where = self.sources.where(configurable, parameter, scope)
        raise UnsupportedBinding(
            f"{name} = {_short(value)} ({where}) is not implemented by paxlite's T5X runs"
            f"{'; ' + why if why else ''}; remove the binding or use the default."
        )


def _is_default(field: dataclasses.Field, value: Any) -> bool:
    if field.default is not dataclasses.MISSING:
        return value == field.default or (value is None and field.default is None)
    return False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def knobs(
    call: TrainCall, sources: GinSources, config_text: str, latest_step: int | None = None
) -> dict[str, Any]:
    """The ``T5xGin`` knob values of a T5X train call (``latest_step``: MODEL_DIR's newest
    checkpoint, for T5X's ``relative_steps``).

    Raises:
      UnsupportedBinding: a value paxlite does not implement (which, and where it is set).
    """
    check = _Checker(sources)
    try:
        values = _all_knobs(call, check, latest_step)
    except (TypeError, ValueError) as e:
        if isinstance(e, UnsupportedBinding):
            raise
        raise UnsupportedBinding(
            f"a bound value is not of the type T5X takes ({e}); check the bindings of "
            f"{', '.join(sources.files[-1:]) or 'the gin files'}."
        ) from None
    _check_all_read(sources, check)
    return {"T5X_CONFIG_GIN": config_text} | values


def _all_knobs(call: TrainCall, check: _Checker, latest_step: int | None) -> dict[str, Any]:
    values = {}
    values |= _model_knobs(call.model, check)
    values |= _learning_rate_knobs(call.trainer_cls, check)
    values |= _data_knobs(call, check)
    start_step = _start_step(call, latest_step)
    values |= _loop_knobs(call, check, start_step)
    values |= _checkpoint_knobs(call.checkpoint_cfg, check)
    values |= _partitioner_knobs(call.partitioner, check)
    checkpoint_period = values.get("CHECKPOINT_EVERY_N_STEPS")
    if checkpoint_period is None:  # T5X's period None: the final one only.
        values["CHECKPOINT_EVERY_N_STEPS"] = max(1, values["NUM_TRAIN_STEPS"])
    if not call.stats_period:  # T5X: its "epoch", the shortest of the periods.
        evaluates = call.train_eval_dataset_cfg or call.infer_eval_dataset_cfg
        periods = [
            p for p in (evaluates and call.eval_period, checkpoint_period, call.gc_period) if p
        ]
        values["SUMMARY_INTERVAL_STEPS"] = int(min(periods, default=values["NUM_TRAIN_STEPS"]))
    values["PERIODS_FROM_STEP"] = start_step  # T5X counts its periods from there.
    if values["LABEL_SMOOTHING"] and values["DECODE_VALIDATION"]:
        _check_unsmoothed_scores(values["MIXTURE_OR_TASK_NAME"], check)
    # T5X's checkpoint_<step> in MODEL_DIR, but for state T5X's Adafactor has no slot for.
    values["T5X_CHECKPOINTS"] = not values.get("OPTAX_CHAIN") and (
        values.get("ADAFACTOR_BETA1") is None
    )
    return values


def _check_unsmoothed_scores(task_name: str, check: _Checker) -> None:
    """T5X's inference eval scores targets by their log-likelihood (``score_batch``: no
    label smoothing); paxlite's model scores with the loss it trains, so a task with score
    metrics and label smoothing is refused rather than scored otherwise."""
    import seqio

    try:
        tasks = seqio.get_subtasks(seqio.get_mixture_or_task(task_name))
    except ValueError:  # Not registered: the data's own check names it.
        return
    scored = [task.name for task in tasks if task.score_metric_fns]
    if scored:
        check.refuse(
            "EncoderDecoderModel",
            "label_smoothing",
            "> 0",
            why=f"the inference eval's score metrics of {', '.join(scored)} would be of "
            "smoothed targets; evaluate them with paxlite.t5x.eval (unsmoothed, as T5X) "
            "and set infer_eval_dataset_cfg = None here",
        )


def _start_step(call: TrainCall, latest_step: int | None) -> int:
    """The step a run starts from (T5X's ``host_step``, for ``relative_steps``): MODEL_DIR's
    latest checkpoint, else the restored checkpoint's (``checkpoint_<step>``, or a Mesh
    TensorFlow ``model.ckpt-<step>``), else 0."""
    if latest_step is not None:
        return latest_step
    restore = call.checkpoint_cfg.restore if call.checkpoint_cfg is not None else None
    if restore is not None and restore.path:
        path = restore.path if isinstance(restore.path, str) else restore.path[0]
        found = re.search(r"(?:checkpoint_|\.ckpt-)(\d+)/*$", str(path))  # T5X's, MTF's.
        if found:
            return int(found.group(1))
    return 0


#: Configurables whose every parameter the translation reads (or refuses).
_READ_WHOLE = {
    "DatasetConfig",
    "T5Config",
    "Transformer",
    "EncoderDecoderModel",
    "EncoderDecoderModel.predict_batch_with_aux",
    "Adafactor",
    "standard_logical_factor_rules",
    "PjitPartitioner",
    "standard_logical_axis_rules",
    "create_learning_rate_scheduler",
    "CheckpointConfig",
    "SaveCheckpointConfig",
    "RestoreCheckpointConfig",
    "train",
    "evaluate",
    "infer",
    "chain",
    "beam_search",
    "temperature_sample",
    "TerminateOnNanAction",
}


def _any(value: Any) -> bool:
    return True


#: The loggers of T5X's inference evaluator, which paxlite's training uses.
_T5X_LOGGERS = ["seqio.PyLoggingLogger", "seqio.TensorBoardLogger", "seqio.JSONLogger"]

#: Other configurables: parameter -> whether its value is one paxlite honours.
_READ_PARAMETERS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "Trainer": {"learning_rate_fn": _any, "num_microbatches": _any},
    # The model's vocabulary: the tasks' vocabularies tokenize and detokenize.
    "SentencePieceVocabulary": {"sentencepiece_model_file": _any, "extra_ids": _any},
    "ByteVocabulary": {"extra_ids": _any},
    # T5X's infer_eval evaluator: seqio's Evaluator with T5X's three loggers, over every
    # example (its memory cache changes no output).
    "Evaluator": {
        "logger_cls": lambda value: [getattr(v, "name", v) for v in value] == _T5X_LOGGERS,
        "num_examples": lambda value: value is None,
        "use_memory_cache": _any,
    },
    "JSONLogger": {"write_n_results": lambda value: value is None},
}


def _check_all_read(
    sources: GinSources, check: _Checker, called: frozenset[str] = frozenset()
) -> None:
    """Refuses a binding of a configurable (or parameter) no knob comes from, with its line:
    nothing bound is dropped. optax's are recorded and built by optax; ``called``:
    configurables called as gin binds them (seqio's own ``Evaluator``, in eval)."""
    for (scope, configurable, parameter), assignment in sources.bindings.items():
        if (
            configurable in _READ_WHOLE
            or configurable in called
            or assignment.selector.startswith("optax.")
        ):
            continue
        honoured = _READ_PARAMETERS.get(configurable, {}).get(parameter)
        if honoured is None or not honoured(sources.resolved(assignment.value)):
            check.refuse(
                configurable,
                parameter,
                sources.resolved(assignment.value),
                scope,
                why="no paxlite setting comes from it",
            )


def _model_knobs(model: Any, check: _Checker) -> dict[str, Any]:
    if not isinstance(model, models.EncoderDecoderModel):
        check.refuse("train", "model", model, why="paxlite's T5X runs train EncoderDecoderModel")
    if not isinstance(model.module, network.Transformer):
        check.refuse(
            "EncoderDecoderModel",
            "module",
            model.module,
            why="the network is t5x.examples.t5.network.Transformer",
        )
    check.only(
        model,
        "EncoderDecoderModel",
        {
            "module": lambda v: True,
            "input_vocabulary": lambda v: True,  # The task's vocabulary tokenizes the data.
            "output_vocabulary": lambda v: True,
            "optimizer_def": lambda v: True,
            "decode_fn": lambda v: True,  # _decode_knobs reads it.
            "z_loss": lambda v: True,
            "label_smoothing": lambda v: True,
            "loss_normalizing_factor": lambda v: True,
        },
        why="custom feature converters and default decoder parameters are not implemented",
    )
    values = _network_knobs(model.module.config, check)
    values |= {
        "Z_LOSS_WEIGHT": float(model.z_loss),
        "LABEL_SMOOTHING": float(model.label_smoothing),
        "LOSS_NORMALIZING_FACTOR": _loss_normalizing_factor(model.loss_normalizing_factor, check),
        # T5X's network.Transformer is unscanned: Adafactor factors each layer's kernel by
        # its own sizes (a scanned stack's would be factored whatever their sizes).
        "USE_REPEATED_LAYER": False,
    }
    return values | _decode_knobs(model, check) | _optimizer_knobs(model.optimizer_def, check)


def _decode_knobs(model: models.EncoderDecoderModel, check: _Checker) -> dict[str, Any]:
    """How the model decodes: ``predict_batch_with_aux``'s beams and ``decode_fn``'s own
    settings (beam search's ``alpha``; sampling's temperature, top-k, top-p)."""
    predict = model.predict_batch_with_aux()
    for name, value in (
        ("return_all_decodes", predict.return_all_decodes),
        ("decoder_params", predict.decoder_params),
        ("prompt_with_targets", predict.prompt_with_targets),
    ):
        if value not in (None, False):
            check.refuse(
                "EncoderDecoderModel.predict_batch_with_aux",
                name,
                value,
                why="paxlite decodes the top beam of each input",
            )
    function = inspect.unwrap(model.decode_fn)
    if function not in (decoding.beam_search, decoding.temperature_sample):
        check.refuse(
            "EncoderDecoderModel",
            "decode_fn",
            model.decode_fn,
            why="use decoding.beam_search or decoding.temperature_sample",
        )
    settings = model.decode_fn()  # gin's bindings applied when gin passed the function.
    if model.decode_fn is function:  # The default, not through gin: T5X uses no binding.
        for (scope, configurable, parameter), _ in check.sources.bindings.items():
            if configurable in ("beam_search", "temperature_sample"):
                check.refuse(
                    configurable,
                    parameter,
                    "...",
                    scope,
                    why=f"decode_fn is not bound to @decoding.{configurable}, so T5X would not "
                    f"use it either; add models.EncoderDecoderModel.decode_fn = "
                    f"@decoding.{configurable}",
                )
    sampled = function is decoding.temperature_sample
    read = decoding.SAMPLE_SETTINGS if sampled else decoding.BEAM_SEARCH_SETTINGS
    defaults = inspect.signature(function).parameters
    for name, value in settings.items():
        if name not in read and value != defaults[name].default:
            check.refuse(
                function.__name__, name, value, why="paxlite's decoder has no such setting"
            )
    if settings["num_decodes"] != defaults["num_decodes"].default:
        check.refuse(
            function.__name__,
            "num_decodes",
            settings["num_decodes"],
            why="predict_batch_with_aux.num_decodes sets it, as in T5X",
        )
    values = {"NUM_DECODES": predict.num_decodes or 1, "SAMPLED_DECODING": sampled}
    if sampled:
        values |= {
            "SAMPLE_TEMPERATURE": float(settings["temperature"]),
            "SAMPLE_TOP_K": int(settings["topk"]),
            "SAMPLE_TOP_P": float(settings["topp"]),
        }
    else:
        values["BEAM_ALPHA"] = float(settings["alpha"])
    return values


def _loss_normalizing_factor(value: Any, check: _Checker) -> float | str | None:
    """None (T5X: the summed loss), a number, or 'NUM_REAL_TARGET_TOKENS' (the mean)."""
    if value is None or value == "NUM_REAL_TARGET_TOKENS":
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    check.refuse(
        "EncoderDecoderModel",
        "loss_normalizing_factor",
        value,
        why="give None, a number > 0 or 'NUM_REAL_TARGET_TOKENS'",
    )


def _network_knobs(config: network.T5Config, check: _Checker) -> dict[str, Any]:
    dtype = _DTYPES.get(str(getattr(config.dtype, "__name__", config.dtype)))
    if dtype is None:
        check.refuse("T5Config", "dtype", config.dtype, why="give 'float32' or 'bfloat16'")
    if config.float32_attention_logits and dtype is not jnp.float32:
        check.refuse(
            "T5Config",
            "float32_attention_logits",
            True,
            why="paxlite's attention computes its logits in the activations' dtype",
        )
    return {
        "NUM_ENCODER_LAYERS": config.num_encoder_layers,
        "NUM_DECODER_LAYERS": config.num_decoder_layers,
        "MODEL_DIMS": config.emb_dim,
        "HIDDEN_DIMS": config.mlp_dim,
        "NUM_HEADS": config.num_heads,
        "DIMS_PER_HEAD": config.head_dim,
        "VOCAB_SIZE": config.vocab_size,
        "MLP_ACTIVATIONS": tuple(config.mlp_activations),
        "LOGITS_VIA_EMBEDDING": bool(config.logits_via_embedding),
        "DROPOUT_PROB": float(config.dropout_rate),
        "FPROP_DTYPE": dtype,
    }


def _optimizer_knobs(optimizer: Any, check: _Checker) -> dict[str, Any]:
    if isinstance(optimizer, OptaxChain):
        return {"OPTAX_CHAIN": tuple(_plain(call) for call in optimizer.transformations)}
    if not isinstance(optimizer, adafactor.Adafactor):
        check.refuse(
            "EncoderDecoderModel",
            "optimizer_def",
            optimizer,
            why="use adafactor.Adafactor or an optimizers.chain of optax transformations",
        )
    standard = adafactor.standard_logical_factor_rules()
    check.only(
        optimizer,
        "Adafactor",
        {
            "learning_rate": lambda v: True,  # The trainer's learning_rate_fn sets it.
            "factored": lambda v: True,
            "multiply_by_parameter_scale": lambda v: isinstance(v, bool),
            "beta1": lambda v: True,
            "decay_rate": lambda v: True,
            "clipping_threshold": lambda v: True,
            "min_dim_size_to_factor": lambda v: True,
            "epsilon1": lambda v: True,
            "epsilon2": lambda v: True,
            "dtype_momentum": lambda v: str(getattr(v, "__name__", v)) == "float32",
            "logical_factor_rules": lambda v: v is None or dict(v) == standard,
            "global_norm_clip_threshold": lambda v: True,
        },
        why="paxlite's Adafactor has T5X's other fields at their defaults, and its standard "
        "factor rules",
    )
    return {
        "ADAFACTOR_DECAY_RATE": float(optimizer.decay_rate),
        "ADAFACTOR_CLIPPING_THRESHOLD": optimizer.clipping_threshold,
        "ADAFACTOR_FACTORED": bool(optimizer.factored),
        "ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE": optimizer.multiply_by_parameter_scale,
        "ADAFACTOR_BETA1": optimizer.beta1,
        "ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR": int(optimizer.min_dim_size_to_factor),
        "ADAFACTOR_EPSILON1": float(optimizer.epsilon1),
        "ADAFACTOR_EPSILON2": float(optimizer.epsilon2),
        "ADAFACTOR_GLOBAL_NORM_CLIP": optimizer.global_norm_clip_threshold,
    }


def _plain(value: Any) -> Any:
    """A recorded optax call as Python literals (lists as tuples), for the OPTAX_CHAIN knob."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return tuple(_plain(item) for item in value)
    return value


def _learning_rate_knobs(trainer_cls: Any, check: _Checker) -> dict[str, Any]:
    built = _constructed(trainer_cls)
    schedule = built.learning_rate_fn
    if not isinstance(schedule, utils.LearningRateSchedule):
        check.refuse(
            "Trainer", "learning_rate_fn", schedule, why="use utils.create_learning_rate_scheduler"
        )
    try:
        schedules.T5xFactors(**dataclasses.asdict(schedule))
    except ValueError as e:
        check.refuse("create_learning_rate_scheduler", "factors", schedule.factors, why=str(e))
    return {
        "LR_FACTORS": schedule.factors,
        "LEARNING_RATE": float(schedule.base_learning_rate),
        "LR_WARMUP_STEPS": max(1, int(schedule.warmup_steps)),  # Unused when < 1 (checked).
        "LR_DECAY_FACTOR": float(schedule.decay_factor),
        "LR_STEPS_PER_DECAY": int(schedule.steps_per_decay),
        "LR_STEPS_PER_CYCLE": int(schedule.steps_per_cycle),
        "LR_STEP_OFFSET": int(schedule.step_offset),
        "LR_MIN": float(schedule.min_learning_rate),
        "GRAD_ACCUM_STEPS": built.num_microbatches or 1,
    }


def _constructed(trainer_cls: Any) -> Any:
    """The Trainer with gin's bindings (T5X's train script passes the rest)."""
    return trainer_cls() if callable(trainer_cls) else trainer_cls


def _data_knobs(call: TrainCall, check: _Checker) -> dict[str, Any]:
    """The train, train_eval and infer_eval datasets: one task or mixture, T5X's fields."""
    train = call.train_dataset_cfg
    _check_dataset(train, "train", check)
    values = {
        "MIXTURE_OR_TASK_NAME": _task_name(train.mixture_or_task_name),
        # Imported while gin read the files (gin_run), under T5X's module names.
        "MIXTURE_OR_TASK_MODULE": None,
        "TASK_FEATURE_LENGTHS": dict(train.task_feature_lengths or {}),
        "BATCH_SIZE": int(train.batch_size),
        "SHUFFLE_TRAIN_EXAMPLES": bool(train.shuffle),
        "PACKED_INPUT": bool(train.pack),
        "USE_CACHED_TASKS": bool(train.use_cached),
        "DATA_SEED": train.seed,
        "TRAIN_SPLIT": train.split,
        "EVAL_STEPS": int(call.eval_steps),
        "EVAL_SPLIT": None,
        "DECODE_VALIDATION": call.infer_eval_dataset_cfg is not None,
    }
    train_eval = call.train_eval_dataset_cfg
    if train_eval is not None:
        _check_dataset(train_eval, "train_eval", check)
        same = (
            "mixture_or_task_name",
            "module",
            "batch_size",
            "task_feature_lengths",
            "use_cached",
        )
        _check_same_as_train(train_eval, train, "train_eval", check, same)
        values |= {
            "EVAL_SPLIT": train_eval.split,
            "EVAL_DATA_SEED": train_eval.seed,
            "EVAL_PACKED": bool(train_eval.pack),
        }
    infer = call.infer_eval_dataset_cfg
    if infer is not None:
        _check_dataset(infer, "infer_eval", check)
        same = ("mixture_or_task_name", "module", "use_cached")
        _check_same_as_train(infer, train, "infer_eval", check, same)
        if infer.pack:
            check.refuse(
                "DatasetConfig", "pack", True, "infer_eval", why="decoding reads examples unpacked"
            )
        values |= {
            "DECODE_SPLIT": infer.split,
            "DECODE_BATCH_SIZE": int(infer.batch_size),
            "DECODE_DATA_SEED": infer.seed,
            "DECODE_FEATURE_LENGTHS": (
                None if infer.task_feature_lengths is None else dict(infer.task_feature_lengths)
            ),
        }
    return values


def _task_name(name: Any) -> str:
    """A registered name (T5X also takes a Task or Mixture object: its name)."""
    return name if isinstance(name, str) else str(getattr(name, "name", name))


def _check_dataset(config: utils.DatasetConfig, scope: str, check: _Checker) -> None:
    check.only(
        config,
        "DatasetConfig",
        {
            name: (lambda v: True)
            for name in (
                "mixture_or_task_name",
                "task_feature_lengths",
                "split",
                "batch_size",
                "shuffle",
                "seed",
                "use_cached",
                "pack",
                "module",
                "use_memory_cache",
                "num_prefetch_threads",
                "num_workers",
            )
        },
        scope=scope,
    )


def _check_same_as_train(
    config: utils.DatasetConfig,
    train: utils.DatasetConfig,
    scope: str,
    check: _Checker,
    fields: Sequence[str],
) -> None:
    """paxlite evaluates the training task in its order: an eval dataset of another task,
    size or length, or shuffled, is refused."""
    if config.shuffle:
        check.refuse(
            "DatasetConfig", "shuffle", True, scope, why="paxlite's evals read in a fixed order"
        )
    for name in fields:
        if getattr(config, name) != getattr(train, name):
            check.refuse(
                "DatasetConfig",
                name,
                getattr(config, name),
                scope,
                why=f"paxlite evaluates the train dataset's task with its {name}",
            )


def _loop_knobs(call: TrainCall, check: _Checker, start_step: int) -> dict[str, Any]:
    check.only(
        call,
        "train",
        {
            name: (lambda v: True)
            for name in (
                "model",
                "train_dataset_cfg",
                "train_eval_dataset_cfg",
                "infer_eval_dataset_cfg",
                "checkpoint_cfg",
                "partitioner",
                "trainer_cls",
                "model_dir",
                "total_steps",
                "eval_steps",
                "eval_period",
                "relative_steps",
                "stats_period",
                "random_seed",
                "use_hardware_rng",
                "summarize_config_fn",
                "inference_evaluator_cls",
                "concurrent_metrics",
                "use_orbax",
                "gc_period",
            )
        }
        | {"actions": _only_nan_checks},
        why="custom actions, dataset functions and initializers are T5X code paxlite does not run",
    )
    total = int(call.total_steps)
    if call.relative_steps:  # T5X: this many steps past the step the run starts from.
        total = start_step + int(call.relative_steps)
    values = {
        "NUM_TRAIN_STEPS": total,
        "EVAL_INTERVAL_STEPS": int(call.eval_period),
        "SUMMARY_INTERVAL_STEPS": int(call.stats_period or 0),
    }
    if call.random_seed is not None:
        values["SEED"] = int(call.random_seed)
    return values


def _only_nan_checks(actions: Any) -> bool:
    """T5X's ``TerminateOnNanAction`` is what paxlite's loop always does (exit code 3)."""
    return actions is None or all(
        isinstance(action, trainer.TerminateOnNanAction)
        for group in dict(actions).values()
        for action in group
    )


def _checkpoint_knobs(config: utils.CheckpointConfig | None, check: _Checker) -> dict[str, Any]:
    values: dict[str, Any] = {}
    save = config.save if config is not None else None
    if save is not None:
        check.only(
            save,
            "SaveCheckpointConfig",
            {"period": lambda v: True, "keep": lambda v: True, "save_dataset": lambda v: True},
            why="checkpoints are saved in float32 every period steps",
        )
        if save.period:
            values["CHECKPOINT_EVERY_N_STEPS"] = int(save.period)
        values["CHECKPOINT_MAX_TO_KEEP"] = save.keep
        values["RESUME_INPUT"] = bool(save.save_dataset)  # T5X: False restarts the data.
        values["SAVE_AT_START"] = bool(save.period)  # T5X saves its start with a period.
    restore = config.restore if config is not None else None
    if restore is not None and restore.path:
        check.only(
            restore,
            "RestoreCheckpointConfig",
            {
                "path": lambda v: isinstance(v, str) or len(v) == 1,
                "mode": lambda v: v in ("specific", "latest"),
                "dtype": lambda v: v in (None, "float32"),
                "restore_dataset": lambda v: True,
            },
            why="a run starts from one T5X checkpoint, in float32",
        )
        path = restore.path if isinstance(restore.path, str) else restore.path[0]
        values["INIT_FROM"] = path
    return values


def _partitioner_knobs(partitioner: Any, check: _Checker) -> dict[str, Any]:
    if not isinstance(partitioner, partitioning.PjitPartitioner):
        check.refuse("train", "partitioner", partitioner, why="use partitioning.PjitPartitioner")
    check.only(
        partitioner,
        "PjitPartitioner",
        {
            "num_partitions": lambda v: True,
            "model_parallel_submesh": lambda v: True,
            "params_on_devices": lambda v: v is True,
            "backend": lambda v: True,
            "logical_axis_rules": lambda v: True,
        },
        why="give num_partitions or model_parallel_submesh",
    )
    model_ways = _model_ways(partitioner)
    rules = partitioner.logical_axis_rules
    if rules is None:
        rules = partitioning.standard_logical_axis_rules()
    return {
        "ICI_MESH_SHAPE": (1, -1, model_ways),
        "LOGICAL_AXIS_RULES": paxlite_rules(rules, check),
        "T5X_AXIS_RULES": tuple((str(name), axis) for name, axis in rules),
    }


def _model_ways(partitioner: partitioning.PjitPartitioner) -> int:
    """Devices per model copy: the size of ``model_parallel_submesh`` (a TPU block of chips;
    on CPU and GPU the devices form a line) or ``num_partitions``. With both, the submesh
    wins, as in T5X (which logs that only one should be set)."""
    submesh = partitioner.model_parallel_submesh
    if submesh:
        return math.prod(int(size) for size in submesh)
    return int(partitioner.num_partitions or 1)


def paxlite_rules(
    rules: Sequence[tuple[str, str | None]], check: _Checker | None = None
) -> tuple[tuple[str, Any], ...]:
    """T5X's ``(logical axis, 'data' | 'model' | None)`` rules in paxlite's names: the batch
    over ('replica', 'data'), 'model' as 'mdl', T5X's 'embed' for weights and activations."""
    out = []
    for logical, mesh_axis in rules:
        if logical in _NO_COUNTERPART:
            continue
        if logical not in _LOGICAL_AXES or mesh_axis not in _MESH_AXES:
            if check is None:
                raise UnsupportedBinding(f"logical axis rule {(logical, mesh_axis)!r}")
            check.refuse(
                "PjitPartitioner",
                "logical_axis_rules",
                (logical, mesh_axis),
                why=f"paxlite's T5 has the logical axes {sorted(_LOGICAL_AXES)} and the mesh "
                "axes 'data' and 'model'",
            )
        target = _MESH_AXES[mesh_axis]
        if logical == "batch" and target == "data":
            target = ("replica", "data")
        out.extend((ours, target) for ours in _LOGICAL_AXES[logical])
    return tuple(out)


def knob_text(value: Any) -> str:
    """``value`` as ``--set`` text: a Python literal; a dtype by its name."""
    if value in (jnp.float32, jnp.bfloat16):
        return jnp.dtype(value).name
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Restore:
    """The checkpoints an eval or infer run reads (T5X's ``RestoreCheckpointConfig``).

    Attributes:
      paths: CHECKPOINT_PATH (T5X also takes several).
      mode: 'specific' (each path is the checkpoint), 'latest' (each path's newest step),
        'all' (every step of each path; eval only).
      dtype: the parameters' dtype once read ('float32' or 'bfloat16'; None: the model's,
        float32).
    """

    paths: tuple[str, ...]
    mode: str
    dtype: str | None


@dataclasses.dataclass(frozen=True)
class Inference:
    """An eval or infer call as paxlite runs it: the ``T5xGin`` knobs of its model and
    dataset, the checkpoints to read, and the dataset T5X reads."""

    knobs: dict[str, Any]
    restore: Restore
    dataset: utils.DatasetConfig


#: T5X's restore modes each command takes.
_RESTORE_MODES = {"evaluate": ("specific", "latest", "all"), "infer": ("specific", "latest")}


def inference_knobs(call: EvalCall | InferCall, sources: GinSources, config_text: str) -> Inference:
    """The knobs of an eval or infer call's model (its dataset's task, lengths and batch),
    and what it restores.

    Raises:
      UnsupportedBinding: a value paxlite does not implement (which, and where it is set).
    """
    check = _Checker(sources)
    command = "infer" if isinstance(call, InferCall) else "evaluate"
    try:
        _check_call(call, command, check)
        values = _model_knobs(call.model, check) | _partitioner_knobs(call.partitioner, check)
        dataset = call.dataset_cfg
        _check_dataset(dataset, "", check)
        restore = _restore(call.restore_checkpoint_cfg, command, check)
    except (TypeError, ValueError) as e:
        if isinstance(e, UnsupportedBinding):
            raise
        raise UnsupportedBinding(f"a bound value is not of the type T5X takes ({e}).") from None
    _check_all_read(sources, check, frozenset({"Evaluator"} if command == "evaluate" else ()))
    values |= {
        "T5X_CONFIG_GIN": config_text,
        "MIXTURE_OR_TASK_NAME": _task_name(dataset.mixture_or_task_name),
        "MIXTURE_OR_TASK_MODULE": None,
        "TASK_FEATURE_LENGTHS": dict(dataset.task_feature_lengths or {}),
        "BATCH_SIZE": int(dataset.batch_size),
        "DECODE_BATCH_SIZE": int(dataset.batch_size),
        "TRAIN_SPLIT": dataset.split,  # Read for one batch's shapes only.
        "DECODE_SPLIT": dataset.split,
        "SHUFFLE_TRAIN_EXAMPLES": False,
        "PACKED_INPUT": False,
        "USE_CACHED_TASKS": bool(dataset.use_cached),
        "EVAL_SPLIT": None,
        "DECODE_VALIDATION": False,
        "T5X_CHECKPOINTS": True,  # For T5X's model-info.txt.
        # T5X's score_batch: the targets' log-likelihood, never of smoothed targets (the
        # training loss's smoothing changes nothing else here).
        "LABEL_SMOOTHING": 0.0,
    }
    return Inference(values, restore, dataset)


def _check_call(call: EvalCall | InferCall, command: str, check: _Checker) -> None:
    """The call's own arguments: what T5X's commands bind by default, and infer's modes."""
    read = {
        name: (lambda v: True)
        for name in (
            "model",
            "dataset_cfg",
            "restore_checkpoint_cfg",
            "partitioner",
            "output_dir",
            "inference_evaluator_cls",  # seqio's Evaluator, called with its gin bindings.
            "summarize_config_fn",
            "use_orbax",
            "checkpoint_period",
            "shard_id",
            "num_shards",
            "checkpoint_ds_iter",
            "verify_matching_vocabs_fn",
            "keep_aux_as_numpy",
            "file_extension",
        )
    }
    if isinstance(call, InferCall) and call.mode not in infer_script.MODES:
        check.refuse(
            command,
            "mode",
            call.mode,
            why=f"T5X's infer modes are {', '.join(map(repr, infer_script.MODES))}",
        )
    check.only(
        call,
        command,
        read | {"mode": lambda v: True},
        why="custom train-state initializers, write and merge functions and training "
        "evaluators are T5X code paxlite does not run",
    )


def _restore(config: utils.RestoreCheckpointConfig, command: str, check: _Checker) -> Restore:
    modes = _RESTORE_MODES[command]
    check.only(
        config,
        "RestoreCheckpointConfig",
        {
            "path": lambda v: bool(v),
            "mode": lambda v: v in modes,
            "dtype": lambda v: v in (None, "float32", "bfloat16"),
            "strict": lambda v: True,  # T5X's eval and infer restore without strictness.
            "restore_dataset": lambda v: True,
        },
        why=f"{command} restores modes {', '.join(map(repr, modes))}, in float32 or bfloat16",
    )
    paths = (config.path,) if isinstance(config.path, str) else tuple(config.path)
    return Restore(tuple(str(p) for p in paths), config.mode, config.dtype)
