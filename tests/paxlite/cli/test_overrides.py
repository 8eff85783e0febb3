"""Property tests of the command-line overrides: any ``--set`` / ``--fdl_set`` text either
applies or fails with a documented error (KnobError, UsageError) that says why; no internal
TypeError / IndexError / KeyError escapes."""

from __future__ import annotations

import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paxlite.cli.flags import UsageError
from paxlite.cli.overrides import check_one_source, resolve_configs
from paxlite.experiments.base_experiment import (
    KnobError,
    apply_knob_overrides,
    knobs,
)
from paxlite.experiments.knob_types import matches_type, parse_knob_value
from tasks.lm.synthetic import LmSyntheticTiny
from tests import REPO

KNOB_TYPES = LmSyntheticTiny._knob_types
KNOB_NAMES = sorted(KNOB_TYPES)
# database=None: no example database in .hypothesis/ of the working directory, which later runs
# would replay (a test reads nothing outside its run's temporary directories).
FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)

# Text a user might type after KNOB=: literals, bare words, tuples, enum names, junk.
_ints = st.integers(min_value=-(10**6), max_value=10**6)
knob_values = st.one_of(
    _ints.map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "False", "None", "none", "null", "", " ", "1e400", "1" + "0" * 400]),
    st.sampled_from(["RELU", "Activation.GELU", "RMS_NORM", "SAVE_NOTHING", "bfloat16"]),
    st.lists(_ints, max_size=4).map(lambda xs: ",".join(map(str, xs))),
    st.lists(_ints, max_size=4).map(lambda xs: repr(tuple(xs))),
    st.lists(st.sampled_from(["data", "mdl", "replica", "x"]), max_size=4).map(",".join),
    st.sampled_from(["(('heads', 1),)", "(('mlp', ('data', 7)),)", "[[1]]", "{'a': 1}", "((),)"]),
    st.text(max_size=30),
)
knob_names = st.one_of(
    st.sampled_from(KNOB_NAMES),
    st.sampled_from(KNOB_NAMES).map(str.lower),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
    st.text(max_size=15),
)


def _assert_documented(error: Exception) -> None:
    assert isinstance(error, (KnobError, UsageError)), repr(error)
    assert str(error).strip(), repr(error)


@pytest.mark.slow
@FAST
@given(st.lists(st.tuples(knob_names, knob_values), max_size=4))
def test_any_knob_override_applies_or_fails_with_knob_error(pairs):
    assignments = [f"{name}={value}" for name, value in pairs]
    try:
        cls = apply_knob_overrides(LmSyntheticTiny, assignments)
        cls()  # validate(): cross-knob checks
    except Exception as e:  # noqa: BLE001 - the property is about which errors escape
        _assert_documented(e)
        return
    for name, value in pairs:
        assert matches_type(getattr(cls, name.strip()), KNOB_TYPES[name.strip()]), (name, value)


@FAST
@given(st.lists(st.text(max_size=25), max_size=4))
def test_malformed_assignments_fail_with_knob_error(assignments):
    try:
        apply_knob_overrides(LmSyntheticTiny, assignments)()
    except Exception as e:  # noqa: BLE001
        _assert_documented(e)


@FAST
@given(st.sampled_from(KNOB_NAMES), knob_values)
def test_parse_knob_value_raises_only_value_error(name, text):
    tp = KNOB_TYPES[name]
    try:
        value = parse_knob_value(text, tp)
    except ValueError:
        return
    assert matches_type(value, tp)


_INT_KNOBS = [n for n in KNOB_NAMES if KNOB_TYPES[n] is int]
_FLOAT_KNOBS = [n for n in KNOB_NAMES if KNOB_TYPES[n] is float]


@FAST
@given(
    st.sampled_from(_INT_KNOBS),
    st.integers(min_value=0, max_value=10**9),
    st.sampled_from(_FLOAT_KNOBS),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
)
def test_valid_overrides_apply_and_leave_the_class_unchanged(int_knob, n, float_knob, x):
    cls = apply_knob_overrides(LmSyntheticTiny, [f"{int_knob}={n}", f"{float_knob}= {x!r} "])
    assert getattr(cls, int_knob) == n and type(getattr(cls, int_knob)) is int
    assert getattr(cls, float_knob) == x and type(getattr(cls, float_knob)) is float
    assert knobs(LmSyntheticTiny)[int_knob][1] == getattr(LmSyntheticTiny, int_knob)
    assert cls.__qualname__ == LmSyntheticTiny.__qualname__


# --fdl_set paths: real path segments mixed with made-up ones, indexes and keys.
_segments = st.one_of(
    st.sampled_from(
        ["learner", "optimizer", "learning_rate", "model", "lm_tpl", "num_train_steps", "seed"]
    ),
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
    st.integers(min_value=-3, max_value=5).map(lambda i: f"[{i}]"),
    st.sampled_from(["['a']", "[", "]", "..", "[x]", "", " "]),
    st.text(max_size=6),
)
_roots = st.one_of(
    st.sampled_from(["task", "datasets", "datasets[0]", "datasets[9]"]), st.text(max_size=8)
)
fdl_paths = st.builds(
    lambda root, segs: root + "".join(s if s.startswith("[") else "." + s for s in segs),
    _roots,
    st.lists(_segments, max_size=4),
)
fdl_values = st.one_of(
    knob_values,
    st.sampled_from(["'text'", "[1, 2]", "{'a': 1}", "abs(1)", "lambda: 1", "(", "1 +", "x=1"]),
)


@pytest.mark.slow
@FAST
@given(st.lists(st.tuples(fdl_paths, fdl_values), min_size=1, max_size=3), st.booleans())
def test_any_fdl_set_applies_or_fails_with_usage_error(pairs, drop_equals):
    experiment = LmSyntheticTiny()
    assignments = [f"{path}{'' if drop_equals else '='}{value}" for path, value in pairs]
    try:
        resolve_configs(experiment, assignments, [])
    except Exception as e:  # noqa: BLE001
        _assert_documented(e)


@FAST
@given(
    st.floats(min_value=1e-8, max_value=10.0),
    st.integers(min_value=1, max_value=10**6),
    st.integers(min_value=1, max_value=512),
)
def test_valid_fdl_sets_apply(lr, steps, batch):
    task, datasets, _ = resolve_configs(
        LmSyntheticTiny(),
        [
            f"task.learner.optimizer.learning_rate={lr!r}",
            f"task.num_train_steps={steps}",
            f"datasets[0].batch_size={batch}",
        ],
        [],
    )
    assert task.learner.optimizer.learning_rate == lr
    assert task.num_train_steps == steps
    assert datasets[0].batch_size == batch


def test_strategies_cover_every_declared_type():
    """Guard: the knob types the strategies above were written for are the ones declared."""
    kinds = {typing.get_origin(tp) or tp for tp in KNOB_TYPES.values()}
    assert {int, float, bool, tuple}.issubset(kinds)


_TINY = "tasks.lm.synthetic.LmSyntheticTiny"
_MODEL_DIMS = "task.model.lm_tpl.model_dims"


@pytest.mark.parametrize(
    "exp, knobs, fdl_set",
    [
        (_TINY, ["MODEL_DIMS=96"], f"{_MODEL_DIMS}=32"),
        # Each knob alone does not build (3 heads do not divide 64 dims): against the defaults.
        (_TINY, ["NUM_HEADS=3", "MODEL_DIMS=48"], f"{_MODEL_DIMS}=96"),
        # HF_MODEL is needed to build at all: the other knobs are compared with it set.
        (
            "tasks.lm.hf_synthetic.HfSyntheticLm",
            [f"HF_MODEL={REPO}/tests/fixtures/hf/llama3", "MAX_SEQ_LEN=64"],
            "datasets[0].seq_len=32",
        ),
    ],
    ids=["one_knob", "knobs_that_change_together", "a_required_knob"],
)
def test_a_knob_and_a_path_setting_one_leaf_are_refused(exp, knobs, fdl_set):
    with pytest.raises(UsageError, match=r"both set .*; pass only one of them"):
        check_one_source(exp, knobs, [fdl_set])


def test_a_knob_and_a_path_on_other_leaves_pass():
    hf = [f"HF_MODEL={REPO}/tests/fixtures/hf/llama3", "MAX_SEQ_LEN=64"]
    check_one_source("tasks.lm.hf_synthetic.HfSyntheticLm", hf, [f"{_MODEL_DIMS}=32"])
    check_one_source(_TINY, ["NUM_LAYERS=4"], ["task.learner.optimizer.learning_rate=0.1"])
