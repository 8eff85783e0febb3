"""Runtime types of knobs: does a value match a declared type, and parsing command-line text.

Knobs are declared with ordinary annotations (``int``, ``float | None``,
``tuple[int, ...]``, an ``enum.Enum``); these functions check values against them
and turn ``--set KNOB=VALUE`` text into a value of the type.
"""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import enum
import types
import typing
import warnings
from typing import Any, ClassVar


def parse_knob_value(text: str, tp: Any) -> Any:
    """Parses command-line ``text`` to a value of type ``tp``.

    Accepts Python literals (``4``, ``0.5``, ``'x'``, ``(1, 2, 4)``, ``1,2,4``,
    ``[1, 2]`` for a tuple knob), ``true``/``false``, ``None``/``none``, enum
    members by name or Pax's spelling (see :func:`_enum_member`), bare text for ``str`` knobs
    and comma-separated bare words for tuples of str (``data,mdl``). Ints are
    converted to float for float knobs.

    Raises:
      ValueError: ``text`` does not denote a value of type ``tp``.
    """
    stripped = text.strip()
    lowered = stripped.lower()
    candidates: list[Any] = []
    member = _enum_member(stripped, tp)
    if member is not None:
        candidates.append(member)
    if lowered in ("true", "false"):
        candidates.append(lowered == "true")
    if lowered in ("none", "null"):
        candidates.append(None)
    with (
        contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # e.g. "invalid escape sequence" in arbitrary text
        candidates.append(ast.literal_eval(stripped))
    if "," in stripped:  # Bare words for a tuple of str: data,mdl or (data, mdl).
        parts = [part.strip() for part in stripped.strip("()[]").split(",")]
        candidates.append(tuple(parts[:-1] if parts[-1] == "" else parts))
    for candidate in candidates:
        try:
            value = _coerce(candidate, tp)
        except OverflowError:  # An int too large for a float knob: not a float.
            continue
        if matches_type(value, tp):
            return value
    if matches_type(text, tp):
        return text
    raise ValueError(f"{text!r} is not a {type_name(tp)}")


def matches_type(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of the annotated type ``tp``.

    Checks ``int``/``float``/``bool``/``str``, ``None``, enums and other classes,
    unions, ``Literal``, ``tuple[...]``, ``list[...]``, ``set``, ``dict``,
    ``Sequence``, ``Mapping``, ``type[...]`` and ``Callable``. An int is a valid
    float; a bool is not an int. Types it cannot check (TypeVars, ...) accept.
    """
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return any(matches_type(value, arg) for arg in args)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if origin is ClassVar:
        return matches_type(value, args[0])
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(matches_type(item, args[0]) for item in value)
        return not args or (len(value) == len(args) and all(map(matches_type, value, args)))
    if origin in (list, set, frozenset, collections.abc.Sequence, collections.abc.Set):
        return (
            isinstance(value, origin)
            and not isinstance(value, str)
            and all(matches_type(item, args[0]) for item in value)
        )
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, origin) and all(
            matches_type(k, args[0]) and matches_type(v, args[1]) for k, v in value.items()
        )
    if origin is type:
        return isinstance(value, type) and (
            args[0] is Any or not isinstance(args[0], type) or issubclass(value, args[0])
        )
    if origin is collections.abc.Callable:
        return callable(value)
    if isinstance(origin, type):
        return isinstance(value, origin)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def type_name(tp: Any) -> str:
    """A readable name for an annotated type: ``int``, ``tuple[int, ...] | None``,
    ``AttentionImpl | None`` (classes by their own names)."""
    if tp is None or tp is type(None):
        return "None"
    if typing.get_origin(tp) is None and isinstance(tp, type):
        return tp.__qualname__
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(tp))
    return repr(tp).replace("typing.", "")


def value_hint(tp: Any) -> str:
    """How to write a value of type ``tp``, for error messages."""
    members = [m for arg in _union_args(tp) if _is_enum(arg) for m in arg.__members__]
    if members:
        return f"one of {', '.join(members)}"
    if tp is bool:
        return "true or false"
    if any(typing.get_origin(arg) is tuple for arg in _union_args(tp)):
        return (
            f"a value of type {type_name(tp)} (a tuple: (1, 2) in Python, 1,2 on the command line)"
        )
    return f"a value of type {type_name(tp)}"


def _union_args(tp: Any) -> tuple[Any, ...]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def _enum_member(text: str, tp: Any) -> enum.Enum | None:
    """The member of an enum in ``tp`` that ``text`` spells.

    By name, in any case and after any dotted prefix (``GELU``, ``gelu``,
    ``Activation.GELU``, Pax's ``layers.AutodiffCheckpointType.SAVE_NOTHING``), or
    by a string value (Pax's ``linear_rampup_cosine_decay``).
    """
    name = text.rsplit(".", 1)[-1].upper()
    for arg in _union_args(tp):
        if _is_enum(arg):
            if name in arg.__members__:
                return arg.__members__[name]
            for member in arg:
                if isinstance(member.value, str) and member.value == text:
                    return member
    return None


def enum_member_of(value: Any, tp: Any) -> enum.Enum | None:
    """The member of an enum in ``tp`` that a class-body ``value`` stands for, if any.

    A Pax experiment file sets enum-like knobs to strings (``LR_SCHEDULE =
    'linear_rampup_cosine_decay'``) or to the class an enum member holds
    (``ACTIVATION_CLS = activations.GELU``); both become the member.
    """
    if isinstance(value, enum.Enum):
        return None
    if isinstance(value, str):
        return _enum_member(value, tp)
    for arg in _union_args(tp):
        if _is_enum(arg):
            for member in arg:
                if member.value is value:
                    return member
    return None


def _coerce(value: Any, tp: Any) -> Any:
    """Converts lists/tuples to the container type ``tp`` asks for and ints to float."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        for arg in args:
            converted = _coerce(value, arg)
            if matches_type(converted, arg):
                return converted
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (tuple, list) and isinstance(value, (tuple, list)):
        return tp(value)
    if origin in (tuple, list) and isinstance(value, (tuple, list)):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) != len(value):
                return value
            return tuple(map(_coerce, value, args))
        return origin(_coerce(item, args[0]) if args else item for item in value)
    return value
