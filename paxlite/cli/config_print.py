"""``--print_config``: an experiment's resolved configuration, even before its required
knobs are set (a newcomer discovers the knobs with it).

Required text knobs (data paths, task names) left unset print as ``<required>``: the
task and datasets configs are built around that text. An experiment that cannot be built
without them (a Hugging Face model's directory, say) prints its knobs and why the rest
waits.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from paxlite.cli import overrides
from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import MISSING, KnobError
from paxlite.runtime import job_config

REQUIRED = "<required>"


def config_text(
    cls: type[Any], knob_settings: Sequence[str], fdl_set: Sequence[str], fiddlers: Sequence[str]
) -> str:
    """The text --print_config prints for experiment class ``cls`` (with the overrides:
    ``knob_settings``, ``KNOB=VALUE``, are the knobs the user set).

    Raises:
      KnobError: the experiment refuses a knob the user set (not one left unset).
    """
    unset = {
        name: REQUIRED
        for name, (tp, value) in base_experiment.knobs(cls).items()
        if value is MISSING and _takes_text(tp)
    }
    try:
        experiment = base_experiment.with_overrides(cls, unset)()
    except KnobError as e:
        given = {setting.partition("=")[0].strip() for setting in knob_settings}
        if any(re.search(rf"\b{re.escape(name)}\b", str(e)) for name in given):
            raise  # About a value the user gave: as without --print_config.
        return _knobs_only(cls, str(e))
    configs = overrides.resolve_configs(experiment, fdl_set, fiddlers)
    return job_config.format_config(experiment, *configs)


def _takes_text(tp: Any) -> bool:
    """``str``, or ``str | None`` (a path or name), not a container of text."""
    if tp is str:
        return True
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return union and str in typing.get_args(tp)


def _knobs_only(cls: type[Any], reason: str) -> str:
    lines = [f"# Experiment {cls.__module__}.{cls.__qualname__}", "", "## Knobs"]
    for name, (tp, value) in base_experiment.knobs(cls).items():
        shown = REQUIRED if value is MISSING else repr(value)
        lines.append(f"{name}: {base_experiment.type_name(tp)} = {shown}")
    lines += ["", f"## Task and datasets: printed once the experiment can be built ({reason})"]
    return "\n".join(lines) + "\n"
