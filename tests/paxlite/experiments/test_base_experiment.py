"""paxlite.experiments.base_experiment: knob declaration, class-creation checks, overrides."""

import collections.abc
import enum
from typing import Any, Literal

import pytest

from paxlite.experiments.base_experiment import (
    MISSING,
    BaseExperiment,
    KnobError,
    apply_knob_overrides,
    format_knobs,
    knobs,
    with_overrides,
)
from paxlite.experiments.knob_types import matches_type
from paxlite.experiments.registry import experiment_name
from praxis_lite.sharding import DEFAULT_RULES


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


class LmBase(BaseExperiment):
    """A family base declaring knobs of every supported kind."""

    NUM_LAYERS: int = 2
    LEARNING_RATE: float = 1e-3
    USE_BIAS: bool = False
    NAME: str = "lm"
    OPTIONAL_NAME: str | None = None
    MICROBATCH_SIZE: int | None = None
    ACTIVATION_CLS: Activation = Activation.RELU
    HIDDEN_DIMS: list[int] = [8, 8]  # noqa: RUF012 -- a knob value, never mutated
    DEPTH: "int | None" = None  # a string annotation, as with `from __future__ import annotations`
    PERCORE_BATCH_SIZE = 2

    def datasets(self) -> list[Any]:
        return []

    def task(self) -> Any:
        return {"num_layers": self.NUM_LAYERS}


class Lm(LmBase):
    """A leaf that sets a few knobs."""

    NUM_LAYERS = 4
    LEARNING_RATE = 1  # an int is a valid float


# Defaults and the abstract interface.


def test_base_defaults_follow_pax():
    assert BaseExperiment.ICI_MESH_SHAPE == (1, 1, 1)
    assert BaseExperiment.DCN_MESH_SHAPE is None
    assert BaseExperiment.MESH_AXIS_NAMES == ("replica", "data", "mdl")
    assert BaseExperiment.LOGICAL_AXIS_RULES == DEFAULT_RULES
    assert BaseExperiment.SEED == 1234
    assert knobs(BaseExperiment)["PERCORE_BATCH_SIZE"] == (float, MISSING)


def test_logical_axis_rules_returns_the_knob():
    rules = (("batch", "data"), ("mlp", None))

    class WithRules(Lm):
        LOGICAL_AXIS_RULES = rules

    assert WithRules().logical_axis_rules() == rules
    assert Lm().logical_axis_rules() == DEFAULT_RULES


def test_datasets_and_task_are_abstract():
    class NoTask(BaseExperiment):
        PERCORE_BATCH_SIZE = 1

        def datasets(self) -> list[Any]:
            return []

    with pytest.raises(TypeError, match="task"):
        NoTask()
    with pytest.raises(TypeError):
        BaseExperiment()


def test_required_knob_unset_fails_at_instantiation():
    class NoBatch(BaseExperiment):
        def datasets(self) -> list[Any]:
            return []

        def task(self) -> Any:
            return None

    with pytest.raises(KnobError, match=r"required knobs unset: PERCORE_BATCH_SIZE: float"):
        NoBatch()
    assert apply_knob_overrides(NoBatch, ["PERCORE_BATCH_SIZE=8"])().PERCORE_BATCH_SIZE == 8.0


def test_mesh_shape_must_match_axis_names():
    class TwoAxes(Lm):
        ICI_MESH_SHAPE = (2, 4)

    with pytest.raises(KnobError, match=r"ICI_MESH_SHAPE = \(2, 4\) has 2 entries.*has 3"):
        TwoAxes()
    two_axes_named = apply_knob_overrides(TwoAxes, ["MESH_AXIS_NAMES=data,mdl"])
    assert two_axes_named().MESH_AXIS_NAMES == ("data", "mdl")


# Checks at class creation.


def test_undeclared_knob_fails_at_class_creation_with_did_you_mean():
    with pytest.raises(KnobError, match=r"MICROBATCH_SIAZE.*did you mean MICROBATCH_SIZE"):

        class Typo(Lm):
            MICROBATCH_SIAZE = 8


def test_undeclared_knob_error_says_how_to_declare():
    with pytest.raises(KnobError, match=r"no base class declares.*`BRAND_NEW: <type> = 3`"):

        class Undeclared(Lm):
            BRAND_NEW = 3


def test_non_knob_attributes_are_not_checked():
    class Helpers(Lm):
        _PRIVATE_TABLE = {"a": 1}  # noqa: RUF012
        helper_value = "anything"
        Mixed_Case = 1

    assert Helpers.helper_value == "anything"


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("NUM_LAYERS", 2.5),
        ("NUM_LAYERS", True),
        ("NUM_LAYERS", "4"),
        ("LEARNING_RATE", "0.1"),
        ("USE_BIAS", 1),
        ("NAME", 3),
        ("MICROBATCH_SIZE", "8"),
        ("ACTIVATION_CLS", "swish"),
        ("HIDDEN_DIMS", (8, 8)),
        ("HIDDEN_DIMS", [8, "8"]),
        ("ICI_MESH_SHAPE", [1, "2", 1]),
        ("ICI_MESH_SHAPE", (1, "2", 1)),
        ("DEPTH", 1.5),
        ("SEED", None),
    ],
)
def test_wrong_type_fails_at_class_creation(knob: str, value: Any):
    with pytest.raises(KnobError, match=f"{knob} is declared .* but set to"):
        type("Bad", (Lm,), {knob: value})


def test_a_list_for_a_tuple_knob_is_paxs_spelling_and_becomes_the_tuple():
    class ListMesh(Lm):
        ICI_MESH_SHAPE = [1, 2, 1]  # noqa: RUF012  (Pax's files write mesh shapes as lists)

    assert ListMesh.ICI_MESH_SHAPE == (1, 2, 1)
    with pytest.raises(KnobError, match=r"tuple\[int, \.\.\.\].*\(a tuple: \(1, 2\)"):

        class BadListMesh(Lm):
            ICI_MESH_SHAPE = [1, "2", 1]  # noqa: RUF012


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("LEARNING_RATE", 3),
        ("MICROBATCH_SIZE", None),
        ("MICROBATCH_SIZE", 4),
        ("ACTIVATION_CLS", Activation.GELU),
        ("DCN_MESH_SHAPE", (2, 1, 1)),
        ("DEPTH", 3),
    ],
)
def test_right_type_is_accepted(knob: str, value: Any):
    assert getattr(type("Good", (Lm,), {knob: value}), knob) == value


@pytest.mark.parametrize("spelling", ["relu", "RELU", "Activation.RELU", "layers.ReLU"])
def test_pax_spelling_of_an_enum_knob_in_a_class_body_becomes_the_member(spelling):
    """A Pax file writes strings or classes for enum-like knobs; they become our members."""
    assert type("PaxStyle", (Lm,), {"ACTIVATION_CLS": spelling}).ACTIVATION_CLS is Activation.RELU


def test_the_class_an_enum_member_holds_becomes_the_member():
    from praxis_lite.layers import activations
    from tasks.lm.model_params import Activation as LayerActivation
    from tasks.lm.synthetic import LmSyntheticTiny

    cls = type("PaxStyle", (LmSyntheticTiny,), {"ACTIVATION_CLS": activations.ReLU})
    assert cls.ACTIVATION_CLS is LayerActivation.RELU


@pytest.mark.parametrize(
    ("old", "new"),
    [("REMAT_POLICY", "CHECKPOINT_POLICY"), ("SAVE_INTERVAL_STEPS", "CHECKPOINT_EVERY_N_STEPS")],
)
def test_an_old_knob_name_names_the_new_one(old, new):
    """Old names are too far from Pax's for a did-you-mean: a table names the new one."""
    with pytest.raises(KnobError, match=f"{old} = .*it was renamed: {new}"):
        type("Old", (Lm,), {old: 1})
    with pytest.raises(KnobError, match=f"no knob '{old}' .*it was renamed: {new}"):
        apply_knob_overrides(Lm, [f"{old}=1"])


def test_subclass_declares_new_knob():
    class WithDropout(Lm):
        DROPOUT: float = 0.1

    class Leaf(WithDropout):
        DROPOUT = 0.2

    assert knobs(Leaf)["DROPOUT"] == (float, 0.2)
    assert "DROPOUT" not in knobs(Lm)
    with pytest.raises(KnobError, match="DROPOUT"):
        type("Sibling", (Lm,), {"DROPOUT": 0.2})
    with pytest.raises(KnobError, match="DROPOUT is declared float"):
        type("BadLeaf", (WithDropout,), {"DROPOUT": "high"})


def test_redeclared_knob_rechecks_inherited_value():
    with pytest.raises(KnobError, match="NAME is declared int but set to 'lm'"):

        class Renamed(Lm):
            NAME: int


def test_unresolvable_string_annotation_fails_clearly():
    with pytest.raises(KnobError, match="cannot evaluate the type annotation 'NoSuchType'"):

        class BadAnnotation(Lm):
            WIDTH: "NoSuchType" = 3  # noqa: F821


def test_knobs_lists_types_and_resolved_values_base_first():
    listed = knobs(Lm)
    assert list(listed)[:6] == [
        "ICI_MESH_SHAPE",
        "DCN_MESH_SHAPE",
        "MESH_AXIS_NAMES",
        "LOGICAL_AXIS_RULES",
        "PERCORE_BATCH_SIZE",
        "SEED",
    ]
    assert listed["NUM_LAYERS"] == (int, 4)
    assert listed["DEPTH"] == (int | None, None)
    assert listed["PERCORE_BATCH_SIZE"] == (float, 2)
    text = format_knobs(Lm)
    assert "NUM_LAYERS: int = 4" in text
    assert "ICI_MESH_SHAPE: tuple[int, ...] = (1, 1, 1)" in text
    assert "ACTIVATION_CLS: Activation = <Activation.RELU: 'relu'>" in text


# Overrides from the command line.


@pytest.mark.parametrize(
    ("knob", "text", "expected"),
    [
        ("NUM_LAYERS", "4", 4),
        ("NUM_LAYERS", " 12 ", 12),
        ("LEARNING_RATE", "1e-4", 1e-4),
        ("LEARNING_RATE", "2", 2.0),
        ("USE_BIAS", "true", True),
        ("USE_BIAS", "False", False),
        ("NAME", "c4_1b", "c4_1b"),
        ("NAME", "'quoted'", "quoted"),
        ("NAME", "4", "4"),
        ("NAME", "true", "true"),
        ("OPTIONAL_NAME", "None", None),
        ("OPTIONAL_NAME", "x", "x"),
        ("MICROBATCH_SIZE", "None", None),
        ("MICROBATCH_SIZE", "none", None),
        ("MICROBATCH_SIZE", "8", 8),
        ("ACTIVATION_CLS", "GELU", Activation.GELU),
        ("ACTIVATION_CLS", "Activation.GELU", Activation.GELU),
        ("HIDDEN_DIMS", "[4, 4, 4]", [4, 4, 4]),
        ("HIDDEN_DIMS", "4,4", [4, 4]),
        ("ICI_MESH_SHAPE", "1,2,4", (1, 2, 4)),
        ("ICI_MESH_SHAPE", "(1, 2, 4)", (1, 2, 4)),
        ("ICI_MESH_SHAPE", "[1, 2, 4]", (1, 2, 4)),
        ("DCN_MESH_SHAPE", "None", None),
        ("DCN_MESH_SHAPE", "2,1,1", (2, 1, 1)),
        ("MESH_AXIS_NAMES", "('replica', 'data', 'mdl')", ("replica", "data", "mdl")),
        ("MESH_AXIS_NAMES", "replica, data, mdl", ("replica", "data", "mdl")),
        (
            "LOGICAL_AXIS_RULES",
            "[['batch', 'data'], ['mlp', None]]",
            (("batch", "data"), ("mlp", None)),
        ),
        ("DEPTH", "3", 3),
        ("SEED", "0", 0),
    ],
)
def test_override_parses_to_declared_type(knob: str, text: str, expected: Any):
    value = getattr(apply_knob_overrides(Lm, [f"{knob}={text}"]), knob)
    assert value == expected
    assert type(value) is type(expected)


def test_override_returns_readable_subclass_and_leaves_original_unchanged():
    before = knobs(Lm)
    overridden = apply_knob_overrides(Lm, ["NUM_LAYERS=8", "USE_BIAS=true", "ICI_MESH_SHAPE=1,2,1"])
    assert issubclass(overridden, Lm) and overridden is not Lm
    assert (overridden.__name__, overridden.__qualname__) == (Lm.__name__, Lm.__qualname__)
    assert experiment_name(overridden) == experiment_name(Lm)
    assert overridden().task() == {"num_layers": 8}
    assert knobs(overridden)["ICI_MESH_SHAPE"][1] == (1, 2, 1)
    assert knobs(Lm) == before
    assert Lm.NUM_LAYERS == 4 and Lm.USE_BIAS is False


def test_with_overrides_takes_typed_values_and_strings():
    overridden = with_overrides(Lm, {"NUM_LAYERS": "6", "ACTIVATION_CLS": Activation.GELU})
    assert (overridden.NUM_LAYERS, overridden.ACTIVATION_CLS) == (6, Activation.GELU)
    assert with_overrides(Lm, {}) is Lm
    with pytest.raises(KnobError, match=r"NUM_LAYERS is declared int but set to 2\.5"):
        with_overrides(Lm, {"NUM_LAYERS": 2.5})


@pytest.mark.parametrize(
    ("assignment", "hint"),
    [
        ("NUM_LAYRS=4", "NUM_LAYERS"),
        ("num_layers=4", "NUM_LAYERS"),
        ("MICROBATCH_SIAZE=8", "MICROBATCH_SIZE"),
    ],
)
def test_override_unknown_knob_suggests_closest(assignment: str, hint: str):
    name = assignment.split("=")[0]
    with pytest.raises(KnobError, match=f"no knob '{name}' \\(did you mean {hint}"):
        apply_knob_overrides(Lm, [assignment])


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("NUM_LAYERS=four", "NUM_LAYERS to 'four': the knob is declared int"),
        ("NUM_LAYERS=2.5", "NUM_LAYERS to '2.5': the knob is declared int"),
        ("USE_BIAS=1", "USE_BIAS to '1': the knob is declared bool; pass true or false"),
        (
            "ICI_MESH_SHAPE=a,b",
            r"ICI_MESH_SHAPE to 'a,b': the knob is declared tuple\[int, \.\.\.\]",
        ),
        ("ACTIVATION_CLS=swish", "ACTIVATION_CLS to 'swish'.*one of RELU, GELU"),
        ("DEPTH=deep", r"DEPTH to 'deep': the knob is declared int \| None"),
    ],
)
def test_override_wrong_type_names_knob_type_and_value(assignment: str, message: str):
    with pytest.raises(KnobError, match=message):
        apply_knob_overrides(Lm, [assignment])


@pytest.mark.parametrize("assignment", ["NUM_LAYERS", "=4", " =4"])
def test_malformed_override_fails(assignment: str):
    with pytest.raises(KnobError, match=r"malformed knob override.*KNOB=VALUE"):
        apply_knob_overrides(Lm, [assignment])


def test_override_given_twice_fails():
    with pytest.raises(KnobError, match="NUM_LAYERS is overridden twice"):
        apply_knob_overrides(Lm, ["NUM_LAYERS=4", "NUM_LAYERS=5"])


# The type checker on its own.


@pytest.mark.parametrize(
    ("value", "tp", "expected"),
    [
        ({"a": 1}, dict[str, int], True),
        ({"a": "1"}, dict[str, int], False),
        ("b", Literal["a", "b"], True),
        ("c", Literal["a", "b"], False),
        (Lm, type[BaseExperiment], True),
        (int, type[BaseExperiment], False),
        ((1, "a"), tuple[int, str], True),
        ((1, "a", 2), tuple[int, str], False),
        (len, collections.abc.Callable, True),
        (object(), Any, True),
    ],
)
def test_matches_type(value: Any, tp: Any, expected: bool):
    assert matches_type(value, tp) is expected


def test_batch_sizes_follow_percore_rule():
    class Exp(BaseExperiment):
        PERCORE_BATCH_SIZE = 0.5

        def datasets(self):
            return []

        def task(self):
            return None

    exp = Exp()
    assert exp.global_batch_size(8) == 4
    assert exp.per_host_batch_size(8, 2) == 2
    with pytest.raises(KnobError, match="not a positive whole batch"):
        exp.global_batch_size(3)
    with pytest.raises(KnobError, match="does not split over 3 hosts"):
        exp.per_host_batch_size(8, 3)


def test_init_source_says_where_parameters_start_and_in_which_pipeline_layout():
    """INIT_FROM (None or empty: random init) and the layout its checkpoint was written with:
    INIT_FROM_EXP's pipeline (looked up in the registry), else this experiment's."""
    from paxlite.experiments.base_experiment import InitSource, PipelineLayout, with_overrides
    from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyPipeline

    assert LmSyntheticTiny().init_source() is None
    assert with_overrides(LmSyntheticTiny, {"INIT_FROM": ""})().init_source() is None
    assert LmSyntheticTinyPipeline.pipeline_layout() == PipelineLayout(2, 1)
    own = with_overrides(LmSyntheticTinyPipeline, {"INIT_FROM": "/ckpt"})().init_source()
    assert own == InitSource("/ckpt", None, PipelineLayout(2, 1))
    assert own.layout() == PipelineLayout(2, 1)
    knobs = {"INIT_FROM": "/ckpt", "INIT_FROM_EXP": "LmCloudSpmdPipelineMultislice2BCircular"}
    source = with_overrides(LmSyntheticTiny, knobs)().init_source()
    assert source.path == "/ckpt" and source.own_layout == PipelineLayout(1, 1)
    assert source.layout() == PipelineLayout(2, 3)  # Pipeline2BOnTwoSlices' stages, circular x3.
