"""Every registered experiment of tasks/ is shallow: a family base, an intermediate, the leaf.

Depth counts the classes along the primary bases (the first base that is an
experiment and not a knob group or preset, see ``tasks.lm.knob_groups``) down
to BaseExperiment. Users' own subclasses are not limited.
"""

import importlib
import pkgutil

import tasks
from paxlite.experiments import registry
from paxlite.experiments.base_experiment import BaseExperiment
from tasks.lm.knob_groups import is_knob_group

MAX_DEPTH = 3


def primary_chain(cls: type) -> list[str]:
    """The class names from ``cls`` up its primary bases, BaseExperiment excluded."""
    chain = []
    while cls is not BaseExperiment:
        if not is_knob_group(cls):
            chain.append(cls.__qualname__)
        bases = [b for b in cls.__bases__ if issubclass(b, BaseExperiment)]
        primary = [b for b in bases if not is_knob_group(b)]
        cls = (primary or bases or [BaseExperiment])[0]
    return chain


def _registered_in_tasks() -> set[type]:
    for info in pkgutil.walk_packages(tasks.__path__, prefix="tasks."):
        importlib.import_module(info.name)
    return {cls for name, cls in registry.get_all().items() if name.startswith("tasks.")}


def test_registered_experiments_are_at_most_three_classes_deep():
    registered = _registered_in_tasks()
    assert len(registered) > 25  # the catalogue is here
    deep = {
        cls.__qualname__: " <- ".join(primary_chain(cls))
        for cls in registered
        if len(primary_chain(cls)) > MAX_DEPTH
    }
    assert deep == {}


def test_the_depth_count_sees_through_knob_groups_only():
    from tasks.lm.c4 import C4Spmd1BAdam4Replicas, C4SpmdPipelineGpt3SmallAdam8Replicas

    assert primary_chain(C4Spmd1BAdam4Replicas) == ["C4Spmd1BAdam4Replicas", "C4SpmdLmBase"]
    assert primary_chain(C4SpmdPipelineGpt3SmallAdam8Replicas) == [
        "C4SpmdPipelineGpt3SmallAdam8Replicas",
        "C4SpmdGpt3AdamOrgHP",
        "C4SpmdLmBase",
    ]
