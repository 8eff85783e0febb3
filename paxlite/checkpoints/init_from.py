"""A run's starting parameters from other checkpoints, by Pax's loading rules.

``--init_from=PATH`` (the knob ``INIT_FROM``) is ``{PATH: CheckpointLoadingRules()}``: every
parameter loaded under its own name, the optimizer state and step fresh (MaxText's
``load_parameters_path``). The full form is Pax's ``task.train.init_from_checkpoint_rules``
(``paxlite.experiments.tasks_lib.CheckpointLoadingRules``). Each path is opened through
``checkpoint_sources`` (any registered kind); a run that already has checkpoints of
its own resumes from them instead (``paxlite.train.train_setup``).

Everything is checked before any array is read: a load rule that matches no variable, a
variable mapped to a name the checkpoint lacks, or of another shape (or a float loaded
from an integer) is one :class:`InitFromError` listing them all. Arrays are read straight
onto the run's shardings and cast to its dtypes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from paxlite.checkpoints import checkpoint_sources, train_checkpoints
from paxlite.checkpoints.train_checkpoints import CheckpointMismatchError
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.mtf import checkpoint as mtf_checkpoint
from paxlite.formats.pax import checkpoint as pax_checkpoint
from paxlite.formats.pax import layout as pax_layout
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.formats.t5x import checkpoint as t5x_checkpoint
from paxlite.runtime import job_record
from paxlite.train import summaries
from paxlite.train.train_state import TrainState

# Imported to register their checkpoint kinds.
del hf_checkpoint, mtf_checkpoint, pax_checkpoint, peft_adapter, t5x_checkpoint
_MAX_LISTED = 20  # Problems listed in an InitFromError.
_MAX_NAMED = 6  # Fresh variables named on the console.


class InitFromError(CheckpointMismatchError):
    """The loading rules do not fit the checkpoints they name (each problem listed)."""


@dataclasses.dataclass
class Entry:
    """One checkpoint of the rules, opened and matched against the run's variables.

    Attributes:
      path: as the rules name it; rules: its CheckpointLoadingRules; source: the opened
      checkpoint; assigned: run variable -> checkpoint variable, for the variables this
      entry loads; rule_counts: how many variables each load rule loaded.
    """

    path: str
    rules: CheckpointLoadingRules
    source: checkpoint_sources.Source
    assigned: dict[str, str] = dataclasses.field(default_factory=dict)
    rule_counts: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


def rules_of(task: Any, init_from: str | None) -> dict[str, CheckpointLoadingRules]:
    """The run's rules: ``task.train.init_from_checkpoint_rules``, or INIT_FROM's (when
    the experiment's rules name INIT_FROM themselves, they say how it combines).

    Raises:
      InitFromError: both are given.
    """
    rules = dict(task.train_params().init_from_checkpoint_rules)
    if init_from in rules:  # The experiment placed INIT_FROM among its rules (an adapter).
        return rules
    if init_from and rules:
        raise InitFromError(
            "INIT_FROM (--init_from) and task.train.init_from_checkpoint_rules are both set; "
            "give one (add INIT_FROM's path to the rules, with LOAD_ALL, to use both)."
        )
    return _init_from_rules(init_from) if init_from else rules


def _init_from_rules(init_from: str) -> dict[str, CheckpointLoadingRules]:
    """INIT_FROM's rules: every parameter from it; from a paxlite job that froze some (its
    checkpoints hold what it trained), what it trained from it, the rest as it began."""
    job_dir = checkpoint_sources.job_dir_of(init_from)
    start = job_record.frozen_start(job_dir) if job_dir is not None else None
    if start is None:
        return {init_from: CheckpointLoadingRules()}
    return {init_from: start.trained_rules(), **start.rules}


def initialise(
    state: TrainState,
    rules: Mapping[str, CheckpointLoadingRules],
    layouts: Mapping[str, tuple[int, int]],
    observer: checkpoint_sources.ReadObserver | None = None,
) -> TrainState:
    """``state`` (fresh, on the run's shardings) with what ``rules`` load into it; logs
    what came from where and what stayed fresh.

    ``layouts``: the pipeline ``(S, R)`` each paxml checkpoint was saved with.

    Raises:
      InitFromError: the rules do not fit (nothing has been read then).
      checkpoint_sources.CheckpointSourceError: a path holds no readable checkpoint.
    """

    return initialise_around(
        lambda loaded: overlaid(state, loaded), abstract_of(state), rules, layouts, observer
    )


def overlaid(state: TrainState, loaded: Mapping[str, Any]) -> TrainState:
    """``state`` with the ``loaded`` parameters (``{paxlite path: array}``) in place of its own."""
    params = {**traverse_util.flatten_dict(state.params, sep="/"), **loaded}
    return state.replace(params=traverse_util.unflatten_dict(params, sep="/"))


def initialise_around(
    fresh_state: Callable[[dict[str, Any]], TrainState],
    abstract: TrainState,
    rules: Mapping[str, CheckpointLoadingRules],
    layouts: Mapping[str, tuple[int, int]],
    observer: checkpoint_sources.ReadObserver | None = None,
) -> TrainState:
    """:func:`initialise` for a state not made yet: ``fresh_state(loaded)`` makes it
    around what the rules load (``{paxlite path: array}``, on the run's shardings), so a
    run whose rules load every parameter draws none from its seed.

    ``abstract``: the state's ShapeDtypeStructs, with shardings.

    Raises:
      InitFromError: the rules do not fit (nothing has been read then).
      checkpoint_sources.CheckpointSourceError: a path holds no readable checkpoint.
    """
    run_params = traverse_util.flatten_dict(abstract.params, sep="/")
    with opened(rules, layouts, observer) as entries:
        state = fresh_state(read_params(entries, run_params))
        fields = _train_state_fields(entries, state, abstract)
        state = state.replace(**fields)
        _report(entries, run_params, int(state.step))
    return state


@contextlib.contextmanager
def opened(
    rules: Mapping[str, CheckpointLoadingRules],
    layouts: Mapping[str, tuple[int, int]],
    observer: checkpoint_sources.ReadObserver | None = None,
    kinds: Mapping[str, checkpoint_sources.Kind] | None = None,
) -> Iterator[list[Entry]]:
    """The rules' checkpoints, opened (closed on exit); ``kinds``: the paths already
    identified (the others are identified here)."""
    entries: list[Entry] = []
    try:
        for path, rule in rules.items():
            kind = (kinds or {}).get(path)
            entries.append(_open(path, rule, layouts[path], observer, kind))
        yield entries
    finally:
        for entry in entries:
            entry.source.close()


def read_params(entries: list[Entry], run_params: Mapping[str, Any]) -> dict[str, Any]:
    """``{paxlite path: array}`` of what the entries' rules load, on ``run_params``'
    shardings and dtypes (flat paths -> ShapeDtypeStruct), after checking them all.

    Raises:
      InitFromError: the rules do not fit (nothing has been read then).
    """
    _check(entries, run_params)
    loaded: dict[str, Any] = {}
    for entry in entries:  # The first entry to load a leaf wins (sources name leaves apart).
        for path, value in entry.source.read(entry.assigned, run_params).items():
            loaded.setdefault(path, value)
    return loaded


def fresh_params(entries: list[Entry], run_params: Mapping[str, Any]) -> list[str]:
    """The run's parameters (``params/<path>``) that no entry loads, sorted."""
    fresh = set(run_params)
    for entry in entries:
        fresh -= entry.source.loaded_leaves(entry.assigned, run_params)
    return sorted(checkpoint_sources.PARAMS + p for p in fresh)


def abstract_of(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of ``tree``'s arrays."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
    )


def _open(
    path: str, rule: CheckpointLoadingRules, layout: tuple[int, int], observer: Any, kind: Any
) -> Entry:
    if rule.task_p is not None and hasattr(rule.task_p, "model"):
        layout = pax_layout.pipeline_layout(rule.task_p.model)
    source = checkpoint_sources.open_source(path, rule.step, layout, observer, kind)
    return Entry(path, rule, source)


def _check(entries: list[Entry], run_params: Mapping[str, Any]) -> None:
    """Matches each entry's rules to the run's variables; raises InitFromError listing every
    problem (a rule matching nothing, a name the checkpoint lacks, a shape or kind differing)."""
    problems: list[str] = []
    taken: set[str] = set()
    for entry in entries:
        problems += _match(entry, run_params, taken)
        taken |= entry.assigned.keys()
        problems += entry.source.unreadable(entry.assigned, run_params)
    if not problems:
        return
    shown = problems[:_MAX_LISTED]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more")
    shapes_only = all(": shape " in p for p in problems)
    fix = (
        "The checkpoint holds another model: give the sizes it was trained with (the knobs, "
        "or the gin files' network config), or another checkpoint."
        if shapes_only
        else "Fix the rules (names are the run's as Pax or paxlite writes them: --print_config "
        "shows the rules; a paxml checkpoint's names are its state/mdl_vars.params.* files)."
    )
    raise InitFromError(
        f"the checkpoint loading rules do not fit: {len(problems)} problems:\n  "
        + "\n  ".join(shown)
        + "\n"
        + fix
    )


def _match(entry: Entry, run_params: Mapping[str, Any], taken: set[str]) -> list[str]:
    """Fills ``entry.assigned`` by Pax's rules (first rule wins; ignore rules first)."""
    rule, source = entry.rules, entry.source
    stored, names = source.variables(), source.run_names(run_params)
    load_rules = [tuple(r) for r in rule.load_rules]
    entry.rule_counts = dict.fromkeys(load_rules, 0)
    problems = []
    for name, want in names.items():
        if name in taken or any(re.match(p, name) for p in rule.ignore_rules or ()):
            continue
        for pattern, template in load_rules:
            found = re.match(pattern, name)
            if found is None:
                continue
            entry.rule_counts[(pattern, template)] += 1
            source_name = template.format(*found.groups()).replace(".", "/")
            problem = _mismatch(name, source_name, want, stored.get(source_name))
            if problem:
                problems.append(f"{problem} in {entry.path}")
            else:
                entry.assigned[name] = source_name
            break
    unused = [
        f"load rule ({p!r}, {t!r}) of {entry.path} matches no variable of this run"
        for (p, t), count in entry.rule_counts.items()
        if count == 0
    ]
    return unused + problems


def _mismatch(name: str, source_name: str, want: Any, have: Any) -> str | None:
    if have is None:
        return f"{name} <- {source_name}: no such array"
    if have.shape != want.shape:
        return f"{name} <- {source_name}: shape {have.shape}, this run's is {want.shape}"
    if (have.dtype.kind in "fV") != (want.dtype.kind in "fV"):  # V: bfloat16 as numpy sees it.
        return f"{name} <- {source_name}: dtype {have.dtype}, this run's is {want.dtype}"
    return None


def _train_state_fields(entries: list[Entry], state: TrainState, abstract: Any) -> dict[str, Any]:
    """``step`` / ``opt_state`` from the first entry that loads each (Pax's rule)."""
    fields: dict[str, Any] = {}
    for entry in entries:
        rule = entry.rules
        wants_opt = (rule.load_opt_states or rule.partial_load_opt_states) and (
            "opt_state" not in fields
        )
        wants_step = rule.load_step and "step" not in fields
        if not (wants_opt or wants_step):
            continue
        read = entry.source.read_train_state(abstract, opt_state=wants_opt)
        if wants_step:
            fields["step"] = jax.device_put(np.int32(read["step"]), state.step.sharding)
        if wants_opt and rule.load_opt_states:
            fields["opt_state"] = read["opt_state"]
        elif wants_opt:
            run_params = traverse_util.flatten_dict(abstract.params, sep="/")
            renamed = entry.source.opt_state_names(entry.assigned, run_params)
            fields["opt_state"] = _partial_opt_state(state.opt_state, read["opt_state"], renamed)
    return fields


def _partial_opt_state(fresh: Any, saved: Any, renamed: Mapping[str, str]) -> Any:
    """``fresh`` with the slots of the loaded variables taken from ``saved`` (the
    checkpoint's optimizer state, read in the run's structure): a slot ``<prefix>/<run
    path>[/<field>]`` comes from ``saved``'s ``<prefix>/<renamed[run path]>[/<field>]``."""
    saved_by_path = {
        train_checkpoints.path_name(path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(saved)[0]
    }

    def pick(path: Any, fresh_leaf: Any) -> Any:
        name = train_checkpoints.path_name(path)
        for run, source in renamed.items():  # The run path, maybe then a slot (v_row).
            at = f"/{name}/".find(f"/{run}/")
            if at >= 0:
                saved_name = name[:at] + source + name[at + len(run) :]
                return saved_by_path.get(saved_name, fresh_leaf)
        return fresh_leaf

    return jax.tree_util.tree_map_with_path(pick, fresh)


def _report(entries: list[Entry], run_params: Mapping[str, Any], step: int) -> None:
    """Console lines: what came from where (by rule) and what was left fresh."""
    for entry in entries:
        rules = ", ".join(f"{p!r} -> {t!r}: {n}" for (p, t), n in entry.rule_counts.items())
        extra = [
            what
            for what, on in (
                ("the step", entry.rules.load_step),
                ("the optimizer state", entry.rules.load_opt_states),
                ("the loaded variables' optimizer state", entry.rules.partial_load_opt_states),
            )
            if on
        ]
        also = f"; also {' and '.join(extra)}" if extra else ""
        summaries.log(
            f"Initialised {len(entry.assigned)} variables from {entry.source.describe()} by "
            f"rule ({rules}){also}"
        )
    fresh_names = fresh_params(entries, run_params)
    if fresh_names:
        shown = ", ".join(fresh_names[:_MAX_NAMED])
        more = f" and {len(fresh_names) - _MAX_NAMED} more" if len(fresh_names) > _MAX_NAMED else ""
        summaries.log(f"Freshly initialised (no rule loads them): {shown}{more}")
    summaries.log(f"The run starts at step {step} from these parameters.")
