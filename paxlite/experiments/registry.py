"""The experiment registry: ``@register`` a class, ``get`` it back by name.

An experiment is registered under ``f"{cls.__module__}.{cls.__qualname__}"``,
e.g. ``tasks.lm.c4.C4Spmd1B``. :func:`get` accepts:

* the full dotted name; if it is not registered yet, the module it names is
  imported on demand (``tasks.lm.c4``), so any importable package works, not
  only ``tasks/``;
* a suffix of a registered name that is unique among registered experiments
  (``C4Spmd1B``, ``c4.C4Spmd1B``); to resolve one, the search packages' modules that
  define a class of that name (read from their source, not imported) are imported first,
  and every module only when none of them registers it, so ``LmSyntheticTiny`` does not
  import TensorFlow through ``tasks.lm.c4``'s SeqIO tasks;
* Pax's paths: as Pax's registry, a ``params`` component is dropped
  (``tasks.lm.params.c4.C4Spmd1B`` is ``tasks.lm.c4.C4Spmd1B``).

An unknown or ambiguous name raises :class:`ExperimentRegistryError` naming the
closest candidates; a module that fails to import surfaces its real error.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import pathlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import TypeVar

_T = TypeVar("_T", bound=type)

# Full experiment name -> experiment class.
_REGISTRY: dict[str, type] = {}


class ExperimentRegistryError(LookupError):
    """An experiment name that resolves to no class, or to more than one."""


def experiment_name(cls: type) -> str:
    """The name ``cls`` is registered under: ``module.QualName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def register(cls: _T) -> _T:
    """Class decorator: registers ``cls`` under :func:`experiment_name` and returns it.

    Raises:
      ExperimentRegistryError: a different class is already registered under the
        same name.
    """
    if not isinstance(cls, type):
        raise ExperimentRegistryError(
            f"@register applies to classes, got {cls!r}; decorate the experiment class."
        )
    name = experiment_name(cls)
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ExperimentRegistryError(
            f"experiment {name!r} is already registered by another class "
            f"(defined at {_where(existing)}); rename one of the two classes."
        )
    _REGISTRY[name] = cls
    return cls


#: The packages whose modules are imported to resolve a short name (``LmSyntheticTiny``) by
#: default: the command line's ``--exp_search_packages``, ``from_pretrained(exp=...)`` and
#: ``INIT_FROM_EXP``. The one place paxlite names the experiments' package.
DEFAULT_SEARCH_PACKAGES: tuple[str, ...] = ("tasks",)

#: The tiny experiment that trains on a CPU in about a minute: the example of help texts and
#: the benchmark sweep's default.
EXAMPLE_EXPERIMENT = "tasks.lm.synthetic.LmSyntheticTiny"


def get_all() -> dict[str, type]:
    """All registered experiments, full name -> class (a copy)."""
    return dict(_REGISTRY)


def get(name: str, search_packages: Sequence[str] = ()) -> type:
    """Returns the experiment class registered as ``name`` or as a unique suffix of it.

    A dotted ``name`` whose module is not imported yet is imported first, e.g.
    ``get("tasks.lm.c4.C4Spmd1B")`` imports ``tasks.lm.c4``. A short name that
    matches nothing registered yet is looked for again after importing every
    module of ``search_packages`` (e.g. ``("tasks",)`` from the command line).

    Raises:
      ExperimentRegistryError: ``name`` is unknown, ambiguous, or its module
        failed to import (the import error is chained and quoted).
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    without_params = _drop_params_component(name)
    if without_params != name:
        return get(without_params, search_packages)
    module_name = _import_module_of(name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    matches = sorted(key for key in _REGISTRY if key.endswith("." + name))
    if not matches and search_packages:
        failures = _import_modules_defining(name, search_packages)
        matches = sorted(key for key in _REGISTRY if key.endswith("." + name))
    if not matches and search_packages:
        failures = [f for package in search_packages for f in _import_package_modules(package)]
        matches = sorted(key for key in _REGISTRY if key.endswith("." + name))
        if not matches and failures:
            listed = "\n  ".join(failures)
            raise ExperimentRegistryError(
                f"unknown experiment {name!r}; these modules failed to import and may define "
                f"it:\n  {listed}\nFix the import error or pass the full dotted name."
            )
    if len(matches) == 1:
        return _REGISTRY[matches[0]]
    if matches:
        listed = "\n  ".join(matches)
        raise ExperimentRegistryError(
            f"experiment name {name!r} is ambiguous; it matches:\n  {listed}\n"
            "Pass a longer suffix or the full name."
        )
    raise ExperimentRegistryError(_unknown_message(name, module_name))


def _drop_params_component(name: str) -> str:
    """``tasks.lm.params.c4.X`` -> ``tasks.lm.c4.X``; ``params.c4.X`` -> ``c4.X`` (Pax's paths)."""
    parts = name.split(".")
    kept = [part for part in parts[:-1] if part != "params"] + parts[-1:]
    return ".".join(kept)


def _import_package_modules(package_name: str) -> list[str]:
    """Imports ``package_name`` and its submodules; returns "module: error" per failure."""
    try:
        package = importlib.import_module(package_name)
    except ModuleNotFoundError:
        return []
    failures = []
    for info in pkgutil.walk_packages(package.__path__, prefix=package_name + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            failures.append(f"{info.name}: {e}")
    return failures


def _import_modules_defining(name: str, search_packages: Sequence[str]) -> list[str]:
    """Imports the modules of ``search_packages`` whose source defines a class named as
    ``name``'s last part, in a module whose dotted name ends with ``name``'s other parts;
    returns "module: error" per failure. Reads the sources, imports nothing else."""
    *module_suffix, class_name = name.split(".")
    failures = []
    for module_name, path in _package_sources(search_packages):
        if module_suffix and not module_name.endswith("." + ".".join(module_suffix)):
            continue
        if not _defines_class(path, class_name):
            continue
        try:
            importlib.import_module(module_name)
        except ImportError as e:
            failures.append(f"{module_name}: {e}")
    return failures


def _package_sources(search_packages: Sequence[str]) -> list[tuple[str, pathlib.Path]]:
    """``(module name, source path)`` of every ``.py`` module under the search packages,
    found without importing them (a package's ``__init__`` is not run)."""
    found = []
    for package_name in search_packages:
        try:
            spec = importlib.util.find_spec(package_name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        for root in map(pathlib.Path, spec.submodule_search_locations):
            for path in sorted(root.rglob("*.py")):
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found.append((".".join((package_name, *parts)), path))
    return found


def _defines_class(path: pathlib.Path, class_name: str) -> bool:
    """Whether the Python source at ``path`` has a ``class class_name`` statement."""
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if f"class {class_name}" not in source:
        return False
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError:
        return True  # Importing it reports the error as every other import does.
    return any(
        isinstance(node, ast.ClassDef) and node.name == class_name for node in ast.walk(tree)
    )


def _import_module_of(name: str) -> str | None:
    """Imports the longest dotted prefix of ``name`` that is a module; returns it.

    Returns None when no prefix names an existing module (``name`` may be a
    suffix such as ``c4.C4Spmd1B``). A module that exists but fails to import
    raises :class:`ExperimentRegistryError` quoting the real error.
    """
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:end])
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is not None and (
                module_name == e.name or module_name.startswith(e.name + ".")
            ):
                continue  # This prefix is not a module; try a shorter one.
            raise _import_failed(name, module_name, e) from e
        except ImportError as e:
            raise _import_failed(name, module_name, e) from e
        return module_name
    return None


def _import_failed(name: str, module_name: str, error: ImportError) -> ExperimentRegistryError:
    return ExperimentRegistryError(
        f"experiment {name!r}: importing module {module_name!r} failed with "
        f"{type(error).__name__}: {error}\n"
        f"Fix that import (a missing dependency or a broken import in {module_name!r})."
    )


def _unknown_message(name: str, module_name: str | None) -> str:
    """The error text for a name that matches nothing, with the closest candidates."""
    lines = [f"unknown experiment {name!r}."]
    if module_name is not None:
        attribute = name[len(module_name) + 1 :].split(".")[0]
        if hasattr(sys.modules[module_name], attribute):
            lines.append(
                f"Module {module_name!r} defines {attribute!r} but does not register it; "
                "decorate the class with @experiment_registry.register."
            )
        else:
            lines.append(
                f"Module {module_name!r} was imported but has no submodule or class "
                f"{attribute!r}; check the spelling."
            )
    close = _closest(name)
    if close:
        lines.append("Closest registered experiments:\n  " + "\n  ".join(close))
    elif module_name is None:
        lines.append(
            "Pass the full dotted name (e.g. 'tasks.lm.c4.C4Spmd1B') so its module is "
            "imported, or import the module that defines it first."
        )
    return "\n".join(lines)


def _closest(name: str, n: int = 5) -> list[str]:
    """Registered full names whose class name is closest to the last part of ``name``.

    Class names first: those that start with it (any case: ``C4Spmd1b`` finds
    ``C4Spmd1B`` and ``C4Spmd1BAdam4Replicas``), shortest first; then by string
    distance.
    """
    by_class: dict[str, list[str]] = {}
    for key in _REGISTRY:
        by_class.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    wanted = name.rsplit(".", 1)[-1]
    starting = sorted((c for c in by_class if c.lower().startswith(wanted.lower())), key=len)
    similar = difflib.get_close_matches(wanted, list(by_class), n=n, cutoff=0.6)
    ordered = list(dict.fromkeys([*starting, *similar]))[:n]
    return [key for class_name in ordered for key in sorted(by_class[class_name])][:n]


def _where(cls: type) -> str:
    """``module:QualName`` plus the source file when known, for error messages."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return f"{cls.__module__}:{cls.__qualname__}" + (f" ({path})" if path else "")
