"""What a job directory records about its run, read back without the trainer's flags:
its knobs (config.txt) and how it froze parameters (config.json, ``paxlite.trainable``).

``paxlite.job_config`` writes these files; readers (``paxlite.export``,
``paxlite.inference``, ``paxlite.init_from``) come here.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from etils import epath

from paxlite import trainable
from praxis_lite import config as config_lib


def read_knobs(job_log_dir: epath.Path) -> dict[str, Any]:
    """The knobs a job's config.txt records (``KNOB: type = value`` lines of its Knobs
    section), each value as a Python literal where it is one, else its text; {} without
    a config.txt."""
    path = epath.Path(job_log_dir) / "config.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    knobs: dict[str, Any] = {}
    for line in lines[lines.index("## Knobs") + 1 :] if "## Knobs" in lines else []:
        if line.startswith("## "):
            break
        name, _, rest = line.partition(": ")
        text = rest.partition(" = ")[2]
        try:
            knobs[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            knobs[name] = text
    return knobs


@dataclasses.dataclass(frozen=True)
class FrozenStart:
    """How a job that froze parameters holds them: its learner's regexes (praxis's
    ``bprop_variable_inclusion`` / ``_exclusion``) and where it started the frozen ones
    (its INIT_FROM, then its loading rules' checkpoints): its checkpoints hold only what it
    trained."""

    inclusion: tuple[str, ...]
    exclusion: tuple[str, ...]
    paths: tuple[str, ...]


def frozen_start(job_log_dir: epath.Path) -> FrozenStart | None:
    """The job's :class:`FrozenStart` from its config files; None for a job that froze
    nothing (or has no config.json)."""
    path = epath.Path(job_log_dir) / "config.json"
    if not path.is_file():
        return None
    task = config_lib.from_json(path.read_text())["task"]
    inclusion = trainable.patterns_of(task.learner.bprop_variable_inclusion)
    exclusion = trainable.patterns_of(task.learner.bprop_variable_exclusion)
    if not inclusion and not exclusion:
        return None
    init_from = read_knobs(job_log_dir).get("INIT_FROM")
    rules = dict(task.train.init_from_checkpoint_rules or {})
    paths = tuple(dict.fromkeys(([init_from] if init_from else []) + list(rules)))
    return FrozenStart(inclusion, exclusion, paths)
