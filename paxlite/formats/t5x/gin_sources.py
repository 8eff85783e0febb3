"""Where each binding of a T5X run's gin files comes from: files, includes, command line.

T5X resolves a gin file and each ``include`` against ``--gin_search_paths`` (the path as
given first). :func:`read_sources` follows the same order with gin-config's own parser,
checking each file's syntax and includes before gin runs anything, and indexes every binding
and macro by where its last assignment is (``file:line``, or the ``--gin.NAME`` flag), so a
value paxlite cannot honour is named with the line that set it.
"""

from __future__ import annotations

import dataclasses
import os
import tokenize
from collections.abc import Sequence
from typing import Any

from etils import epath
from gin import config_parser

from paxlite.formats.t5x.gin import Macro, Reference, ValueDelegate

#: The marker T5X's gin files give a macro the user must set.
REQUIRED = "gin.REQUIRED"


class GinFileError(ValueError):
    """A gin file that is missing or does not parse (one line: where and what)."""


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A binding's or macro's value as written (``Macro``/``Reference`` kept), where, and
    the selector as written (``optax.adamw``; '' for a macro)."""

    value: Any
    where: str
    selector: str = ""


@dataclasses.dataclass
class GinSources:
    """The run's bindings by ``(scope, configurable, parameter)`` (and as written,
    ``scope/selector.parameter``) and macros by name, each the last assignment (gin's
    override order: files in order, then the flags)."""

    search_paths: tuple[str, ...]
    files: list[str] = dataclasses.field(default_factory=list)
    bindings: dict[tuple[str, str, str], Assignment] = dataclasses.field(default_factory=dict)
    macros: dict[str, Assignment] = dataclasses.field(default_factory=dict)
    written: dict[str, Assignment] = dataclasses.field(default_factory=dict)

    def where(self, configurable: str, parameter: str, scope: str = "") -> str:
        """``file:line`` (or the flag) that set ``[scope/]configurable.parameter``, through
        the macro it names; 'its default' when nothing did."""
        found = self.bindings.get((scope, configurable, parameter))
        if found is None and scope:
            found = self.bindings.get(("", configurable, parameter))
        if found is None:
            return f"{configurable}.{parameter}'s default"
        if isinstance(found.value, Macro) and found.value.name in self.macros:
            macro = self.macros[found.value.name]
            return f"{macro.where} (%{found.value.name}, used at {found.where})"
        return found.where

    def resolved(self, value: Any) -> Any:
        """``value`` with its macros followed (a reference stays a ``Reference``)."""
        seen = set()
        while isinstance(value, Macro) and value.name in self.macros and value.name not in seen:
            seen.add(value.name)
            value = self.macros[value.name].value
        return value

    def used_macros(self) -> set[str]:
        """The macros some binding or macro names, anywhere in its value (``[%A, %B]``)."""
        used: set[str] = set()
        for assignment in (*self.bindings.values(), *self.macros.values()):
            used |= _macros_in(assignment.value)
        return used

    def unset_required(self) -> list[Assignment]:
        """The macros still ``%gin.REQUIRED`` that some binding uses, as ``Assignment(name,
        where it was marked required)``."""
        used = self.used_macros()
        return [
            Assignment(name, a.where)
            for name, a in self.macros.items()
            if isinstance(a.value, Macro) and a.value.name == REQUIRED and name in used
        ]


def _macros_in(value: Any) -> set[str]:
    """The macros named in ``value``, through lists, tuples and dicts."""
    if isinstance(value, Macro):
        return {value.name}
    if isinstance(value, dict):
        return set().union(*(_macros_in(v) for v in (*value.keys(), *value.values())))
    if isinstance(value, list | tuple):
        return set().union(*(_macros_in(v) for v in value))
    return set()


def resolved_bindings(sources: GinSources) -> dict[str, str]:
    """Each binding as written (``scope/selector.parameter``) -> its value with macros
    resolved, as text (``@name()`` for a reference): what a file binds, however it spells
    it through macros."""
    return {key: _text(sources.resolved(a.value)) for key, a in sources.written.items()}


def _text(value: Any) -> str:
    if isinstance(value, Reference):
        return f"@{value.name}{'()' if value.evaluate else ''}"
    if isinstance(value, Macro):
        return f"%{value.name}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        items = ", ".join(_text(v) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items})"
    return repr(value)


def resolve(path: str, search_paths: Sequence[str]) -> epath.Path | None:
    """``path`` as given, else under the first search path that has it (T5X's order)."""
    candidates = [path] + [os.path.join(prefix, path) for prefix in search_paths]
    for candidate in candidates:
        if epath.Path(candidate).is_file():
            return epath.Path(candidate)
    return None


def read_sources(
    gin_files: Sequence[str], bindings: Sequence[tuple[str, str]], search_paths: Sequence[str]
) -> GinSources:
    """Every file (includes followed) and flag binding, in gin's order.

    Args:
      gin_files: ``--gin_file`` values, in order.
      bindings: ``(flag, binding text)`` pairs, e.g. ``('--gin.MODEL_DIR', 'MODEL_DIR = "/x"')``.
      search_paths: ``--gin_search_paths``, in order.

    Raises:
      GinFileError: a file or include not found (the paths searched), or a syntax error
        (file:line).
    """
    sources = GinSources(tuple(search_paths))
    for gin_file in gin_files:
        found = resolve(gin_file, search_paths)
        if found is None:
            raise GinFileError(
                f"--gin_file={gin_file} not found (looked in: {_looked_in(search_paths)}); give "
                "its path, or the folder it is under in --gin_search_paths."
            )
        _read_file(found, sources, seen=())
    for flag, text in bindings:
        _read_text(text, flag, sources, seen=(), name=flag)
    return sources


def _looked_in(search_paths: Sequence[str]) -> str:
    return ", ".join(["the current directory", *search_paths])


def _read_file(path: epath.Path, sources: GinSources, seen: tuple[str, ...]) -> None:
    if str(path) in seen:
        raise GinFileError(f"{path} includes itself (through {' -> '.join(seen)}).")
    sources.files.append(str(path))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise GinFileError(f"{path} cannot be read as a gin file ({e}).") from None
    _read_text(text, str(path), sources, (*seen, str(path)), name=None)


def _read_text(
    text: str, source: str, sources: GinSources, seen: tuple[str, ...], name: str | None
) -> None:
    """Indexes ``text``'s statements; ``name`` is a flag's name (its bindings' ``where``)."""
    try:
        for statement in config_parser.ConfigParser(text, ValueDelegate()):
            where = name or f"{source}:{statement.location.line_num}"
            _index(statement, where, sources, seen)
    except SyntaxError as e:
        at = name or f"{source}:{e.lineno}"
        raise GinFileError(f"{at}: gin syntax error: {e.msg}; fix that line.") from None
    except tokenize.TokenError as e:
        raise GinFileError(f"{name or source}: gin syntax error: {e.args[0]}.") from None


def _index(statement: Any, where: str, sources: GinSources, seen: tuple[str, ...]) -> None:
    if isinstance(statement, config_parser.IncludeStatement):
        found = resolve(statement.filename, sources.search_paths)
        if found is None:
            raise GinFileError(
                f"{where}: include {statement.filename!r} not found (looked in: "
                f"{_looked_in(sources.search_paths)}); add the folder that holds "
                f"{statement.filename} to --gin_search_paths."
            )
        _read_file(found, sources, seen)
    elif isinstance(statement, config_parser.BindingStatement):
        selector = statement.selector if statement.arg_name else ""
        assignment = Assignment(statement.value, where, selector)
        if statement.arg_name:
            configurable = statement.selector.split(".")[-1]
            if "." in statement.selector and statement.selector.split(".")[-2][:1].isupper():
                configurable = ".".join(statement.selector.split(".")[-2:])  # A method.
            sources.bindings[(statement.scope, configurable, statement.arg_name)] = assignment
            scope = f"{statement.scope}/" if statement.scope else ""
            sources.written[f"{scope}{statement.selector}.{statement.arg_name}"] = assignment
        else:
            sources.macros[statement.selector] = assignment
