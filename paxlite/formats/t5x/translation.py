"""A T5X train call (what gin called ``train_script.train`` with) -> a paxlite run's knobs.

Every argument T5X's runs use is honoured: the model (``EncoderDecoderModel`` of
``network.Transformer(T5Config)``), Adafactor, the learning-rate factors, the datasets, the
checkpoints, the partitioner (mesh and logical axis rules) and the loop's periods. A value
paxlite does not implement raises :class:`UnsupportedBinding` naming the binding and the
``file:line`` that set it; nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from paxlite.formats.t5x.api import (
    adafactor,
    decoding,
    models,
    network,
    partitioning,
    trainer,
    utils,
)
from paxlite.formats.t5x.api.optimizers import OptaxChain
from paxlite.formats.t5x.api.train_script import TrainCall
from paxlite.formats.t5x.gin_sources import GinSources
from praxis_lite import sharding

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
    values = {"T5X_CONFIG_GIN": config_text}
    values |= _model_knobs(call.model, check)
    values |= _learning_rate_knobs(call.trainer_cls, check)
    values |= _data_knobs(call, check)
    values |= _loop_knobs(call, check, latest_step or 0)
    values |= _checkpoint_knobs(call.checkpoint_cfg, check)
    values |= _partitioner_knobs(call.partitioner, check)
    return values


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
    settings = model.predict_batch_with_aux()
    check.only(
        model,
        "EncoderDecoderModel",
        {
            "module": lambda v: True,
            "input_vocabulary": lambda v: True,  # The task's vocabulary tokenizes the data.
            "output_vocabulary": lambda v: True,
            "optimizer_def": lambda v: True,
            "decode_fn": lambda v: v in (decoding.beam_search, decoding.temperature_sample),
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
        "LOSS_NORMALIZING_FACTOR": _loss_normalizing_factor(model.loss_normalizing_factor),
        "NUM_DECODES": settings.num_decodes or 1,
        "SAMPLED_DECODING": model.decode_fn is decoding.temperature_sample,
    }
    return values | _optimizer_knobs(model.optimizer_def, check)


def _loss_normalizing_factor(value: Any) -> float | str | None:
    if value is None or isinstance(value, str):
        return value
    name = getattr(value, "name", None)  # T5X's SpecialLossNormalizingFactor members.
    return name if name is not None else float(value)


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
    return {
        "LR_FACTORS": schedule.factors,
        "LEARNING_RATE": float(schedule.base_learning_rate),
        "LR_WARMUP_STEPS": int(schedule.warmup_steps),
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
        "MIXTURE_OR_TASK_MODULE": train.module,
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
        if infer.task_feature_lengths is not None:  # None: T5X's longest; paxlite's training's.
            same += ("task_feature_lengths",)
        _check_same_as_train(infer, train, "infer_eval", check, same)
        if infer.pack:
            check.refuse(
                "DatasetConfig", "pack", True, "infer_eval", why="decoding reads examples unpacked"
            )
        values |= {"DECODE_SPLIT": infer.split, "DECODE_BATCH_SIZE": int(infer.batch_size)}
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


def _loop_knobs(call: TrainCall, check: _Checker, latest_step: int) -> dict[str, Any]:
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
    if call.relative_steps is not None:  # T5X: this many steps past the latest checkpoint.
        total = latest_step + int(call.relative_steps)
    values = {
        "NUM_TRAIN_STEPS": total,
        "EVAL_INTERVAL_STEPS": int(call.eval_period),
        "SUMMARY_INTERVAL_STEPS": int(call.stats_period or call.eval_period),
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
    }


def _model_ways(partitioner: partitioning.PjitPartitioner) -> int:
    """Devices per model copy: the size of ``model_parallel_submesh`` (a TPU block of chips;
    on CPU and GPU the devices form a line) or ``num_partitions``. With both, the submesh
    wins, as in T5X (which logs that only one should be set)."""
    submesh = partitioner.model_parallel_submesh
    if submesh:
        ways = 1
        for size in submesh:
            ways *= int(size)
        return ways
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
