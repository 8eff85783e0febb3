"""Command-line overrides: knobs (``--set``), Fiddle paths (``--fdl_set``) and fiddlers.

Knob overrides make a subclass of the experiment with the new values, type-checked
(``paxlite.experiments.base_experiment``); path overrides go through Fiddle's own absl-flag
parser onto the task and dataset configs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import fiddle as fdl
from fiddle import daglish
from fiddle.absl_flags import utils as fdl_flag_utils

from paxlite.cli.flags import UsageError
from paxlite.experiments import base_experiment, registry
from praxis_lite.py_utils import NestedMap


def resolve_experiment(
    name: str, knob_overrides: Sequence[str], search_packages: Sequence[str] = ()
) -> Any:
    """The experiment instance for ``name`` with ``KNOB=VALUE`` overrides applied."""
    return resolve_experiment_class(name, knob_overrides, search_packages)()


def resolve_experiment_class(
    name: str, knob_overrides: Sequence[str], search_packages: Sequence[str] = ()
) -> type[base_experiment.BaseExperiment]:
    """The experiment class for ``name`` with ``KNOB=VALUE`` overrides applied (not yet
    instantiated: validating a mesh with a -1 entry asks JAX for the job's devices, so
    the devices must be set up first)."""
    cls = registry.get(name, search_packages)
    return base_experiment.apply_knob_overrides(cls, list(knob_overrides))


def resolve_configs(experiment: Any, fdl_sets: Sequence[str], fiddlers: Sequence[str]):
    """``(task_cfg, dataset_cfgs, decoder_dataset_cfgs)`` with fiddlers and path overrides."""
    root = NestedMap(
        task=experiment.task(),
        datasets=list(experiment.datasets()),
        decoder_datasets=list(experiment.decoder_datasets()),
    )
    for name in fiddlers:
        _find_fiddler(experiment, name)(root.task)
    for assignment in fdl_sets:
        check_fdl_set_syntax(assignment)
        try:
            fdl_flag_utils.set_value(root, assignment)
        except ValueError as e:
            cause = f" {e.__cause__}" if e.__cause__ else ""
            raise UsageError(f"--fdl_set {assignment}: {e}{cause}") from None
    return root.task, root.datasets, root.decoder_datasets


def check_fdl_set_syntax(assignment: str) -> str:
    """The path of an ``--fdl_set PATH=VALUE`` assignment; UsageError when it is not
    ``PATH=VALUE`` or the path does not start at a config (``task``, ``datasets[i]``,
    ``decoder_datasets[i]``). Whether the path exists is for the built config to say."""
    if "=" not in assignment:
        raise UsageError(f"--fdl_set expects PATH=VALUE, got {assignment!r}.")
    path = assignment.split("=", 1)[0]
    if not path.startswith(("task", "datasets", "decoder_datasets")):
        raise UsageError(
            f"--fdl_set path {path!r} must start with 'task.', 'datasets[i].' or "
            "'decoder_datasets[i].', e.g. task.learner.optimizer.learning_rate=0.01."
        )
    return path


def check_one_source(
    name: str,
    knob_overrides: Sequence[str],
    fdl_sets: Sequence[str],
    search_packages: Sequence[str] = (),
) -> None:
    """Raises UsageError when an ``--fdl_set`` path names a leaf that a ``--set`` knob changes.

    Each knob override is compared against the experiment with the other overrides only
    (the configs built with and without it), or, where those alone do not build (two knobs
    that must change together), with none; given both, one would silently win. A knob the
    experiment cannot be built without (HF_MODEL, a required data path) is not compared:
    every leaf depends on it.
    """
    if not knob_overrides or not fdl_sets:
        return
    cls = registry.get(name, search_packages)
    changed = _leaf_values(base_experiment.apply_knob_overrides(cls, list(knob_overrides))())
    paths = [assignment.split("=", 1)[0].strip() for assignment in fdl_sets]
    for index, knob in enumerate(knob_overrides):
        others = [*knob_overrides[:index], *knob_overrides[index + 1 :]]
        baseline = _built_leaves(cls, others)
        if baseline is None:
            baseline = _built_leaves(cls, [])
        if baseline is None:  # The experiment needs this knob to be built.
            continue
        for leaf, value in changed.items():
            if _differs(baseline.get(leaf, _ABSENT), value):
                for path in paths:
                    if leaf == path or leaf.startswith((path + ".", path + "[")):
                        raise UsageError(
                            f"--set {knob} and --fdl_set {path}=... both set {leaf}; pass only "
                            "one of them (the knob, or the path) so it is clear which value wins."
                        )


_ABSENT = object()


def _built_leaves(cls: type, knob_overrides: list[str]) -> dict[str, Any] | None:
    """:func:`_leaf_values` of ``cls`` with ``knob_overrides``; None where it does not build
    (a KnobError: a required knob unset, or knobs that do not fit together)."""
    try:
        return _leaf_values(base_experiment.apply_knob_overrides(cls, knob_overrides)())
    except ValueError:
        return None


def _leaf_values(experiment: Any) -> dict[str, Any]:
    """``{'task.learner.optimizer.learning_rate': 0.001, 'datasets[0].batch_size': 16, ...}``."""
    roots = {"task": experiment.task()}
    for group in ("datasets", "decoder_datasets"):
        for index, cfg in enumerate(getattr(experiment, group)()):
            roots[f"{group}[{index}]"] = cfg
    leaves = {}
    for prefix, root in roots.items():
        for value, path in daglish.iterate(root):
            if not isinstance(value, fdl.Buildable | list | tuple | dict):
                leaves[prefix + daglish.path_str(path)] = value
    return leaves


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # Values that do not compare (arrays): count them as changed.
        return a is not b


def _find_fiddler(experiment: Any, name: str):
    module = sys.modules[type(experiment).__module__]
    if hasattr(module, name):
        return getattr(module, name)
    if "." in name:
        mod_name, fn_name = name.rsplit(".", 1)
        try:
            return getattr(importlib.import_module(mod_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"--fiddler {name}: {e}") from None
    raise UsageError(
        f"--fiddler {name}: no function {name!r} in {module.__name__}; pass a dotted path."
    )


def unproxied(error: BaseException) -> BaseException:
    """The error itself, not Fiddle's proxy of it (which appends the config being built)."""
    while hasattr(error, "proxy_base_exception"):
        error = error.proxy_base_exception
    return error
