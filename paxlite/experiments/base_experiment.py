"""BaseExperiment: typed UPPERCASE knobs, ``datasets()`` and ``task()``.

An experiment is a class. Its knobs are UPPERCASE class attributes declared
with a type annotation on some class of its MRO::

    class LmBase(BaseExperiment):
      NUM_LAYERS: int                       # declared, required (no fake default)
      MICROBATCH_SIZE: int | None = None    # declared, with a default

    class Lm1B(LmBase):
      NUM_LAYERS = 24                       # set; checked against `int`
      MICROBATCH_SIAZE = 8                  # KnobError at class creation:
                                            #   ... did you mean MICROBATCH_SIZE?

Checks run at class creation (``__init_subclass__``): an UPPERCASE attribute
that no class declares, or a value that contradicts its declared type, raises
:class:`KnobError`. Required knobs left unset raise when the experiment is
instantiated. :func:`apply_knob_overrides` turns ``KNOB=VALUE`` strings from the
command line into a new subclass, parsing each value to the declared type;
:func:`knobs` lists every knob with its type and resolved value.
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

from paxlite.experiments.knob_types import (
    enum_member_of,
    matches_type,
    parse_knob_value,
    type_name,
    value_hint,
)
from paxlite.runtime import batch_sizes
from praxis_lite.layers.attention_kernels import SplashBlockSizes
from praxis_lite.layers.attentions import AttentionImpl
from praxis_lite.sharding import DEFAULT_RULES

_KNOB_NAME = re.compile(r"[A-Z][A-Z0-9_]*")

#: Knob names of earlier paxlite versions -> what to write now (Pax's names, where Pax
#: has the knob). An old name is an error that says this, not a string-distance guess.
RENAMED_KNOBS = {
    "REMAT_POLICY": "CHECKPOINT_POLICY",
    "SAVE_INTERVAL_STEPS": "CHECKPOINT_EVERY_N_STEPS",
    "MAX_TO_KEEP": "CHECKPOINT_MAX_TO_KEEP",
    "SOFT_CAP_LOGITS": "SOFTMAX_CAP_LOGITS",
    "ACTIVATION": "ACTIVATION_CLS",
    "LR_WARMUP_STEPS": (
        "LR_COS_WARMUP (with LR_SCHEDULE=linear_rampup_cosine_decay) or LR_LRED_WARMUP "
        "(with LR_SCHEDULE=linear_rampup_exponential_decay)"
    ),
    "LR_DECAY_START": "LR_LRED_DECAY_START (or LR_COS_DECAY_START for a cosine LR_SCHEDULE)",
    "LR_DECAY_END": "LR_LRED_DECAY_END (or LR_COS_DECAY_END for a cosine LR_SCHEDULE)",
    "LR_DECAY_MIN_RATIO": "LR_LRED_MIN_RATIO (or LR_COS_MIN_RATIO for a cosine LR_SCHEDULE)",
    "LR_MIN_RATIO": "LR_LRED_MIN_RATIO",
    "C4_TASK_NAME": "TRAIN_MIXTURE",
}
_E = TypeVar("_E", bound="BaseExperiment")


class PipelineLayout(NamedTuple):
    """How a model's layers are pipelined: what a paxml checkpoint's parameter layout depends on.

    Attributes:
      num_stages: pipeline stages (1: not pipelined).
      circular_repeat: layer blocks per stage, run round-robin (1: not circular).
    """

    num_stages: int = 1
    circular_repeat: int = 1


@dataclasses.dataclass(frozen=True)
class InitSource:
    """Where a run's parameters start when its job dir holds no checkpoint (``INIT_FROM``).

    Attributes:
      path: a paxlite job, checkpoints or step dir, or a paxml checkpoint step.
      written_by: the experiment that wrote a paxml ``path`` (``INIT_FROM_EXP``), or None:
        the one asking.
      own_layout: the asking experiment's pipeline layout.
    """

    path: str
    written_by: str | None
    own_layout: PipelineLayout

    def layout(self) -> PipelineLayout:
        """The pipeline layout ``path`` was written with: ``written_by``'s (looked up in the
        registry only when asked: a resumed run never needs it), else the own one."""
        if not self.written_by:
            return self.own_layout
        from paxlite.experiments import registry

        writer = registry.get(self.written_by, registry.DEFAULT_SEARCH_PACKAGES)
        return writer.pipeline_layout()


@dataclasses.dataclass(frozen=True)
class AttentionSettings:
    """How the attention layers attend in training and eval.

    Attributes:
      impl: the implementation asked for; None: the platform's (see
        :mod:`paxlite.runtime.attention_choice`).
      splash_block_sizes: splash attention's tiles.
    """

    impl: AttentionImpl | None
    splash_block_sizes: SplashBlockSizes


class KnobError(ValueError):
    """An undeclared, mistyped, missing or unparsable experiment knob."""


class _Missing:
    """The value of a declared knob that no class sets (a required knob)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class BaseExperiment(abc.ABC):
    """An experiment: knobs (UPPERCASE class attributes), ``datasets()`` and ``task()``.

    Subclasses set the knobs declared here or by a base class, and may declare
    new ones by annotating them (``NUM_LAYERS: int = 4``). Register a concrete
    experiment with ``@experiment_registry.register``.

    Attributes:
      ICI_MESH_SHAPE: devices per mesh axis within a slice (over ICI), one entry
        per name in MESH_AXIS_NAMES.
      DCN_MESH_SHAPE: slices per mesh axis (over DCN) for multi-slice jobs; None
        for a single slice.
      MESH_AXIS_NAMES: names of the device mesh axes.
      LOGICAL_AXIS_RULES: maps the layers' logical axis names (``'embed'``,
        ``'mlp'``, ...) to mesh axis names, or None for replicated.
      PERCORE_BATCH_SIZE: training examples per device per step (may be < 1
        when some devices hold no batch, e.g. tensor parallelism).
      SEED: seed of the model init and training RNG.
      TPU_TARGET: the TPU slice the experiment is sized for, as a Cloud TPU name
        (``v4-128``; one slice per DCN_MESH_SHAPE slice), what
        ``--mode=compile --compile_topology=target`` compiles for; None: TPU v4 with
        one chip per mesh device (see :mod:`paxlite.runtime.tpu_topology`).
      INIT_FROM: a checkpoint whose parameters start this run when its job dir holds no
        checkpoint of its own (``--init_from``): a paxlite job, checkpoints or step dir, or
        a paxml checkpoint step (see :mod:`paxlite.checkpoints.init_from`); optimizer state and step
        start fresh. None: random initialisation.
      INIT_FROM_EXP: the experiment a paxml INIT_FROM was trained with (its pipeline
        layout); None: this one's.
      ATTENTION_IMPL: how every attention layer attends in training and eval: ``einsum``,
        ``xla``, ``cudnn`` or ``splash`` (``attentions.AttentionImpl``); None: by the
        platform of the mesh's devices (``paxlite.runtime.attention_choice``): ``splash`` on TPUs,
        ``cudnn`` on NVIDIA GPUs, else ``einsum``, each falling back to the einsums, with
        one line saying why, where a layer's settings rule the kernel out.
      SA_BLOCK_Q, SA_BLOCK_KV, SA_BLOCK_KV_COMPUTE, SA_BLOCK_Q_DKV, SA_BLOCK_KV_DKV,
        SA_BLOCK_KV_DKV_COMPUTE, SA_BLOCK_Q_DQ, SA_BLOCK_KV_DQ: splash attention's block
        sizes (MaxText's names and defaults, 512), capped at the sequence lengths.
    """

    ICI_MESH_SHAPE: tuple[int, ...] = (1, 1, 1)
    DCN_MESH_SHAPE: tuple[int, ...] | None = None
    MESH_AXIS_NAMES: tuple[str, ...] = ("replica", "data", "mdl")
    LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = DEFAULT_RULES
    PERCORE_BATCH_SIZE: float
    SEED: int = 1234
    TPU_TARGET: str | None = None
    INIT_FROM: str | None = None
    INIT_FROM_EXP: str | None = None
    ATTENTION_IMPL: AttentionImpl | None = None
    SA_BLOCK_Q: int = 512
    SA_BLOCK_KV: int = 512
    SA_BLOCK_KV_COMPUTE: int = 512
    SA_BLOCK_Q_DKV: int = 512
    SA_BLOCK_KV_DKV: int = 512
    SA_BLOCK_KV_DKV_COMPUTE: int = 512
    SA_BLOCK_Q_DQ: int = 512
    SA_BLOCK_KV_DQ: int = 512

    # Knob name -> declared type, over the whole MRO; set per class at creation.
    _knob_types: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._knob_types = _collect_knob_types(cls)
        _check_class_knobs(cls)

    def __init__(self) -> None:
        missing = [name for name, (_, value) in knobs(type(self)).items() if value is MISSING]
        if missing:
            listed = ", ".join(f"{n}: {type_name(self._knob_types[n])}" for n in missing)
            raise KnobError(
                f"{type(self).__qualname__} leaves required knobs unset: {listed}; set them "
                "in the class body or override them on the command line (KNOB=VALUE)."
            )
        self.validate()

    @classmethod
    def undeclared_knob_hint(cls, name: str) -> str:
        """Why ``name``, a knob this experiment does not declare, is not one (``"; ..."``),
        where a family knows; "" for the usual did-you-mean hint."""
        return ""

    def job_files(self) -> dict[str, str]:
        """Files the job directory keeps beside its config: ``{path in the job dir: source
        path}`` (copied when the run starts). None by default."""
        return {}

    def job_texts(self) -> dict[str, str]:
        """Files the job directory keeps that the experiment writes: ``{path in the job dir:
        text}`` (written when the run starts, after :meth:`job_files`). None by default."""
        return {}

    def validate(self) -> None:
        """Checks that knobs agree with each other; raises :class:`KnobError` if not.

        Subclasses that add cross-knob constraints extend this and call super().
        """
        axes = len(self.MESH_AXIS_NAMES)
        for name in ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE"):
            shape = getattr(self, name)
            if shape is not None and len(shape) != axes:
                raise KnobError(
                    f"{type(self).__qualname__}.{name} = {shape!r} has {len(shape)} entries but "
                    f"MESH_AXIS_NAMES = {self.MESH_AXIS_NAMES!r} has {axes}; give one entry per "
                    "mesh axis."
                )
            fills = 1 if name == "ICI_MESH_SHAPE" and list(shape or ()).count(-1) == 1 else 0
            if shape is not None and sum(size < 1 for size in shape) > fills:
                raise KnobError(
                    f"{type(self).__qualname__}.{name} = {shape!r}: every entry is a number of "
                    "devices (or slices) and must be at least 1 (ICI_MESH_SHAPE may have one "
                    "-1: the devices the other entries leave)."
                )
        for logical, mesh_axes in self.logical_axis_rules():
            names = (mesh_axes,) if isinstance(mesh_axes, str) else mesh_axes
            if names is not None and not (
                isinstance(names, (tuple, list)) and all(isinstance(n, str) for n in names)
            ):
                raise KnobError(
                    f"{type(self).__qualname__}: LOGICAL_AXIS_RULES maps {logical!r} to "
                    f"{mesh_axes!r}; map each logical axis to a mesh axis name, a tuple of "
                    "names, or None."
                )

    @abc.abstractmethod
    def datasets(self) -> list[Any]:
        """The input configs: the training input and the eval inputs."""

    @abc.abstractmethod
    def task(self) -> Any:
        """The Fiddle config of the task (model, optimizer, schedules)."""

    def decoder_datasets(self) -> list[Any]:
        """Input configs decoded by ``--mode=decode`` (and by train_and_eval when the
        task's ``decode_interval_steps`` is set): prompt/target batches, see BaseInput."""
        return []

    def stand_in_datasets(self, dataset_cfgs: list[Any]) -> list[Any]:
        """The inputs a compile-only run (``--mode=compile``) takes batch shapes from.

        A dry run must not need the data. The default keeps ``dataset_cfgs`` (the
        experiment's ``datasets()`` with overrides); families whose inputs read
        files return synthetic inputs of the same batch shapes.
        """
        return dataset_cfgs

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        """The logical-axis -> mesh-axis rules for this experiment's mesh."""
        return self.LOGICAL_AXIS_RULES

    @classmethod
    def pipeline_layout(cls) -> PipelineLayout:
        """How this experiment pipelines its layers; not pipelined by default. Experiments
        with pipeline knobs answer from them (a class method: it needs no data knobs)."""
        return PipelineLayout()

    def attention_settings(self) -> AttentionSettings:
        """ATTENTION_IMPL and splash's tiles: each SA_BLOCK_<NAME> knob is the field
        ``block_<name>`` of :class:`SplashBlockSizes`."""
        tiles = dataclasses.fields(SplashBlockSizes)
        sizes = {tile.name: getattr(self, f"SA_{tile.name.upper()}") for tile in tiles}
        return AttentionSettings(self.ATTENTION_IMPL, SplashBlockSizes(**sizes))

    def init_source(self) -> InitSource | None:
        """Where this run's parameters start when its job dir holds no checkpoint
        (INIT_FROM, written by INIT_FROM_EXP), or None (random init)."""
        if not self.INIT_FROM:
            return None
        return InitSource(self.INIT_FROM, self.INIT_FROM_EXP, self.pipeline_layout())

    def global_batch_size(self, num_devices: int, percore: float | None = None) -> int:
        """``percore`` (default PERCORE_BATCH_SIZE) x devices (Pax's rule); must come out whole
        (:func:`paxlite.runtime.batch_sizes.batch_sizes`)."""
        return self._batch_sizes(num_devices, 1, percore).global_batch

    def per_host_batch_size(
        self, num_devices: int, num_hosts: int, percore: float | None = None
    ) -> int:
        """The batch each host's input produces: the global batch split over hosts."""
        return self._batch_sizes(num_devices, num_hosts, percore).per_infeed_host

    def num_infeed_hosts(self) -> int:
        """How many processes read distinct parts of the input in this job
        (:func:`paxlite.runtime.partitioning.num_infeed_hosts` of this experiment's mesh)."""
        from paxlite.runtime import partitioning

        return partitioning.num_infeed_hosts(
            self.ICI_MESH_SHAPE,
            self.DCN_MESH_SHAPE,
            self.MESH_AXIS_NAMES,
            self.logical_axis_rules(),
        )

    def infeed_batch_size(self, percore: float | None = None) -> int:
        """The batch this process's input produces: the global batch (of ``percore``
        examples per device, default PERCORE_BATCH_SIZE) over the infeed hosts."""
        import jax

        return self.per_host_batch_size(jax.device_count(), self.num_infeed_hosts(), percore)

    def _batch_sizes(self, num_devices: int, num_hosts: int, percore: float | None) -> Any:
        """The batch arithmetic of ``percore`` (default PERCORE_BATCH_SIZE); its errors as
        KnobErrors (they are about this experiment's knobs)."""
        percore = self.PERCORE_BATCH_SIZE if percore is None else percore
        try:
            return batch_sizes.batch_sizes(percore, num_devices, num_hosts)
        except batch_sizes.BatchSizeError as e:
            raise KnobError(str(e)) from None


def knobs(cls: type[BaseExperiment]) -> dict[str, tuple[Any, Any]]:
    """Every declared knob of ``cls``: name -> (declared type, resolved value).

    Base-class knobs come first. A required knob that no class sets has the
    value :data:`MISSING`.
    """
    return {name: (tp, getattr(cls, name, MISSING)) for name, tp in cls._knob_types.items()}


def format_knobs(cls: type[BaseExperiment], experiment: BaseExperiment | None = None) -> str:
    """``NAME: type = value`` lines for every knob of ``cls`` (``experiment``'s values, where
    it derived some, e.g. from a model's own config), for printing."""
    return "\n".join(
        f"{name}: {type_name(tp)} = {getattr(experiment, name, value)!r}"
        for name, (tp, value) in knobs(cls).items()
    )


def apply_knob_overrides(cls: type[_E], assignments: Sequence[str]) -> type[_E]:
    """Applies ``KNOB=VALUE`` strings (e.g. from the command line); see :func:`with_overrides`.

    Raises:
      KnobError: an assignment is not ``KNOB=VALUE``, a knob is given twice, or
        :func:`with_overrides` rejects it.
    """
    overrides: dict[str, str] = {}
    for assignment in assignments:
        name, sep, value = assignment.partition("=")
        name = name.strip()
        if not sep or not name:
            raise KnobError(
                f"malformed knob override {assignment!r}; write KNOB=VALUE, e.g. NUM_LAYERS=4."
            )
        if name in overrides:
            raise KnobError(f"knob {name} is overridden twice; pass each knob once.")
        overrides[name] = value
    return with_overrides(cls, overrides)


def with_overrides(cls: type[_E], overrides: Mapping[str, Any]) -> type[_E]:
    """Returns a subclass of ``cls`` with the given knob values; ``cls`` is unchanged.

    A ``str`` value is command-line text, parsed to the knob's declared type by
    :func:`parse_knob_value`; any other value is used as is. The subclass keeps
    the name and module of ``cls`` (so printouts stay readable) and is
    registered nowhere. With no overrides, returns ``cls`` itself.

    Raises:
      KnobError: an unknown knob (with a did-you-mean hint), or a value that is
        not of the knob's declared type.
    """
    if not overrides:
        return cls
    declared = cls._knob_types
    values: dict[str, Any] = {}
    for name, raw in overrides.items():
        if name not in declared:
            hint = cls.undeclared_knob_hint(name) or _did_you_mean(name.upper(), declared)
            listed = "" if hint else f": {', '.join(declared)}"
            raise KnobError(
                f"{cls.__qualname__} has no knob {name!r}{hint}; paxlite --help_knobs "
                f"--exp={cls.__module__}.{cls.__qualname__} lists its {len(declared)} knobs"
                f"{listed}."
            )
        tp = declared[name]
        if isinstance(raw, str):
            try:
                values[name] = parse_knob_value(raw, tp)
            except ValueError:
                raise KnobError(
                    f"cannot set {cls.__qualname__}.{name} to {raw!r}: the knob is declared "
                    f"{type_name(tp)}; pass {value_hint(tp)}."
                ) from None
        elif matches_type(raw, tp):
            values[name] = raw
        else:
            raise KnobError(_type_mismatch(cls, name, raw, tp))
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        **values,
    }
    return type(cls)(cls.__name__, (cls,), namespace)


def _collect_knob_types(cls: type) -> dict[str, Any]:
    """Knob name -> declared type over the MRO of ``cls``, base classes first."""
    declared: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if _KNOB_NAME.fullmatch(name):
                declared[name] = _resolve_annotation(klass, name, annotation)
    return declared


def _resolve_annotation(klass: type, name: str, annotation: Any) -> Any:
    """Evaluates a string annotation (``from __future__ import annotations``); drops ClassVar."""
    if isinstance(annotation, str):
        module = sys.modules.get(klass.__module__)
        module_globals = vars(module) if module is not None else {}
        try:
            # The class's own annotation text, evaluated as typing.get_type_hints would.
            annotation = eval(annotation, module_globals, dict(vars(klass)))  # noqa: S307
        except Exception as e:
            raise KnobError(
                f"{klass.__qualname__}.{name}: cannot evaluate the type annotation "
                f"{annotation!r} ({type(e).__name__}: {e}); import the names it uses at "
                "module level."
            ) from e
    if typing.get_origin(annotation) is ClassVar:
        args = typing.get_args(annotation)
        annotation = args[0] if args else Any
    return annotation


def _check_class_knobs(cls: type[BaseExperiment]) -> None:
    """Raises :class:`KnobError` on an undeclared or mistyped knob set by ``cls`` itself."""
    declared = cls._knob_types
    own = vars(cls)
    for name, value in own.items():
        if _KNOB_NAME.fullmatch(name) and name not in declared:
            why = cls.undeclared_knob_hint(name)
            fix = (
                "."
                if why
                else f"{_did_you_mean(name, declared)}. Fix the name, or declare a new "
                f"knob with a type annotation: `{name}: <type> = {value!r}`."
            )
            raise KnobError(
                f"{cls.__qualname__}.{name} = {value!r} sets a knob that no base class "
                f"declares{why}{fix}"
            )
    annotated_here = own.get("__annotations__", {})
    for name, tp in declared.items():
        if name in own or name in annotated_here:
            value = getattr(cls, name, MISSING)
            member = enum_member_of(value, tp) if name in own else None
            if member is not None:  # Pax's spelling of an enum knob: stored as the member.
                setattr(cls, name, value := member)
            if isinstance(value, list) and matches_type(tuple(value), tp):
                setattr(cls, name, value := tuple(value))  # Pax's lists for tuple knobs.
            if value is not MISSING and not matches_type(value, tp):
                raise KnobError(_type_mismatch(cls, name, value, tp))


def _type_mismatch(cls: type, name: str, value: Any, tp: Any) -> str:
    return (
        f"{cls.__qualname__}.{name} is declared {type_name(tp)} but set to {value!r} "
        f"({type(value).__name__}); use {value_hint(tp)}."
    )


def _did_you_mean(name: str, candidates: Mapping[str, Any]) -> str:
    if name in RENAMED_KNOBS:
        return f" (it was renamed: {RENAMED_KNOBS[name]}; see CHANGELOG.md)"
    close = difflib.get_close_matches(name, list(candidates), n=5, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# __init_subclass__ covers subclasses only; BaseExperiment's own knobs are set here, once the
# helpers above exist.
BaseExperiment._knob_types = _collect_knob_types(BaseExperiment)
_check_class_knobs(BaseExperiment)
