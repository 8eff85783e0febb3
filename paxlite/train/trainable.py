"""Which parameters a run trains: praxis's ``bprop_variable_inclusion`` / ``_exclusion``.

The learner's regexes are matched (``re.match``, as praxis does) against the run's
variable names in the loading rules' form, ``params/<path>`` with ``/`` between keys
(``params/lm/transformer/x_layers_0/self_attention/w_q``; a scanned stack's
``params/lm/transformer/repeat/block/...``). With inclusion, only the matched parameters
train; with exclusion, all but them. The others are frozen: no gradient is taken for them,
they get no optimizer state, the train step returns them untouched (bit for bit), and
checkpoints leave them out (:func:`saved`: a LoRA run's checkpoints hold its adapters and
their optimizer state; a run re-reads its frozen weights from where it started)::

    --fdl_set "task.learner.bprop_variable_exclusion=['.*/embedding/.*', '.*/softmax/.*']"

Parameter trees here are the model's ``params`` collection (nested dicts, leaves arrays or
flax's logical-axis boxes); :func:`split` and :func:`merge` take it apart and back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from flax import traverse_util

#: What the loading rules and these regexes see before each parameter's path.
PARAMS_PREFIX = "params/"
Patterns = str | Sequence[str]


class FreezeError(ValueError):
    """The learner's inclusion/exclusion regexes do not fit the run's parameters."""


def patterns_of(value: Patterns | None) -> tuple[str, ...]:
    """Praxis's field value (a regex, or a list of them) as a tuple of regexes."""
    if not value:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def check_fields(inclusion: Patterns | None, exclusion: Patterns | None) -> None:
    """FreezeError when both fields are set (praxis refuses that too) or a regex is invalid."""
    if patterns_of(inclusion) and patterns_of(exclusion):
        raise FreezeError(
            "task.learner sets both bprop_variable_inclusion and bprop_variable_exclusion; "
            "set one (inclusion: only what matches trains; exclusion: all but what matches)."
        )
    for pattern in (*patterns_of(inclusion), *patterns_of(exclusion)):
        try:
            re.compile(pattern)
        except re.error as e:
            raise FreezeError(f"task.learner: {pattern!r} is no regex ({e}).") from None


def trainable_names(names: Sequence[str], inclusion: Patterns, exclusion: Patterns) -> set[str]:
    """The names (``params/<path>``) that train, of all ``names``.

    Raises:
      FreezeError: a regex matches no name, or every name (nothing would be frozen, or
        nothing would train).
    """
    check_fields(inclusion, exclusion)
    including = bool(patterns_of(inclusion))
    patterns = patterns_of(inclusion) or patterns_of(exclusion)
    if not patterns:
        return set(names)
    field = "bprop_variable_inclusion" if including else "bprop_variable_exclusion"
    matched: set[str] = set()
    for pattern in patterns:
        hits = {name for name in names if re.match(pattern, name)}
        _check_hits(field, pattern, hits, names)
        matched |= hits
    trainable = matched if including else set(names) - matched
    if not trainable:
        raise FreezeError(
            f"task.learner.{field} {list(patterns)} freezes every parameter: nothing would "
            "train; match fewer names."
        )
    return trainable


def _check_hits(field: str, pattern: str, hits: set[str], names: Sequence[str]) -> None:
    example = sorted(names)[0] if names else ""
    if not hits:
        raise FreezeError(
            f"task.learner.{field} regex {pattern!r} matches no parameter of this model; "
            f"names look like {example!r} (--print_config lists the model)."
        )
    if len(hits) == len(names):
        raise FreezeError(
            f"task.learner.{field} regex {pattern!r} matches every parameter of this model "
            f"(e.g. {example!r}); it must single out a part of it."
        )


def frozen_rules(names: Sequence[str], learner: Any) -> list[str]:
    """Loading-rule regexes (``ignore_rules``) naming exactly the frozen ones of ``names``
    (``params/<path>``): a run's own checkpoints do not hold them. [] when none is frozen."""
    inclusion = learner.bprop_variable_inclusion
    exclusion = learner.bprop_variable_exclusion
    if not patterns_of(inclusion) and not patterns_of(exclusion):
        return []
    frozen = set(names) - trainable_names(names, inclusion, exclusion)
    return [re.escape(name) + "$" for name in sorted(frozen)]


def trainable_keys(params: Any, learner: Any) -> frozenset[tuple[str, ...]] | None:
    """The key paths of ``params`` (the ``params`` collection) that train; None when all do."""
    inclusion = learner.bprop_variable_inclusion
    exclusion = learner.bprop_variable_exclusion
    if not patterns_of(inclusion) and not patterns_of(exclusion):
        return None
    flat = traverse_util.flatten_dict(params)
    by_name = {PARAMS_PREFIX + "/".join(key): key for key in flat}
    chosen = trainable_names(list(by_name), inclusion, exclusion)
    return frozenset(by_name[name] for name in chosen)


def split(params: Any, keys: frozenset[tuple[str, ...]] | None) -> tuple[Any, Any]:
    """``(trainable, frozen)`` subtrees of ``params`` (``keys``: :func:`trainable_keys`'s;
    None: everything trains, ``params`` itself is returned with an empty frozen tree)."""
    if keys is None:
        return params, {}
    flat = traverse_util.flatten_dict(params)
    trainable = {k: v for k, v in flat.items() if k in keys}
    frozen = {k: v for k, v in flat.items() if k not in keys}
    return traverse_util.unflatten_dict(trainable), traverse_util.unflatten_dict(frozen)


def saved(state: Any, learner: Any) -> Any:
    """The part of a TrainState a checkpoint holds: every field, the params only the
    trained ones (the frozen ones are the run's starting values: re-read, never saved)."""
    trained, _ = split(state.params, trainable_keys(state.params, learner))
    return state.replace(params=trained)


def freezes(params: Any, learner: Any) -> bool:
    """Whether the learner leaves some of ``params`` frozen."""
    return trainable_keys(params, learner) is not None


def merge(trainable: Any, frozen: Any) -> Any:
    """The whole parameter tree again (inverse of :func:`split`)."""
    if not frozen:
        return trainable
    flat = {**traverse_util.flatten_dict(frozen), **traverse_util.flatten_dict(trainable)}
    return traverse_util.unflatten_dict(flat)
