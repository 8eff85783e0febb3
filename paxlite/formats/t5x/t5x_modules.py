"""T5X's module names, served by paxlite's stand-ins while a T5X command reads gin files.

Gin imports the modules a gin file names (``from t5x import utils``, ``import __main__ as
train_script``, ``import t5.data.mixtures``). Inside :func:`t5x_names`, an import hook
answers ``t5x.*`` with ``paxlite.formats.t5x.api`` (T5X's example network
``t5x.examples.t5.network`` included), ``optax`` with calls recorded for paxlite to build,
``__main__`` with the stand-in of the script being run (train, eval or infer; also under
pytest), and, only when the real
``t5`` package is not installed, ``t5.*`` with the subset in
``paxlite.formats.t5x.t5_subset``. Any other ``t5x`` or ``t5`` module is a ``MissingModule``
error naming it and what exists.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pathlib
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

_API = "paxlite.formats.t5x.api"
_SUBSET = "paxlite.formats.t5x.t5_subset"

#: T5X's module -> ours (None: an empty package on the way to one).
T5X_MODULES: dict[str, str | None] = {
    "t5x": _API,
    **{
        f"t5x.{name}": f"{_API}.{name}"
        for name in (
            "utils",
            "models",
            "adafactor",
            "optimizers",
            "partitioning",
            "trainer",
            "gin_utils",
            "decoding",
        )
    },
    "t5x.examples": None,
    "t5x.examples.t5": None,
    "t5x.examples.t5.network": f"{_API}.network",
    "optax": f"{_API}.optax_calls",  # Recorded calls, built by paxlite with optax itself.
}

#: T5's modules that T5X's gin files and users' task modules import -> ours.
T5_MODULES: dict[str, str | None] = {
    "t5": _SUBSET,
    "t5.data": f"{_SUBSET}.data",
    "t5.data.mixtures": f"{_SUBSET}.mixtures",
    "t5.data.tasks": f"{_SUBSET}.tasks",
    "t5.data.preprocessors": f"{_SUBSET}.preprocessors",
    "t5.data.utils": f"{_SUBSET}.data",
    "t5.evaluation": None,
    "t5.evaluation.metrics": f"{_SUBSET}.metrics",
}


class MissingModule(ModuleNotFoundError):
    """A ``t5x`` or ``t5`` module paxlite does not provide (its name and what exists)."""


_MISSING = object()


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as our module itself; remembers what importlib changes on it
    (``__spec__``, an added ``__path__``) so :func:`t5x_names` puts it back."""

    def __init__(self, target: str | None, changed: dict[types.ModuleType, dict[str, Any]]):
        self._target, self._changed = target, changed

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self._target is None:
            return types.ModuleType(spec.name)
        module = importlib.import_module(self._target)
        if module not in self._changed:
            self._changed[module] = {
                name: getattr(module, name, _MISSING) for name in ("__spec__", "__path__")
            }
        if not hasattr(module, "__path__"):  # Submodules may be imported under it.
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module is ours, already imported."""


def _put_back(changed: dict[types.ModuleType, dict[str, Any]]) -> None:
    for module, attributes in changed.items():
        for name, value in attributes.items():
            if value is _MISSING:
                vars(module).pop(name, None)
            else:
                setattr(module, name, value)


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Answers the names in ``aliases``; refuses other modules under their roots."""

    def __init__(self, aliases: dict[str, str | None]):
        self._aliases = aliases
        self._roots = {name.split(".")[0] for name in aliases}
        self.changed: dict[types.ModuleType, dict[str, Any]] = {}

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's)
        if fullname in self._aliases:
            loader = _AliasLoader(self._aliases[fullname], self.changed)
            return importlib.util.spec_from_loader(fullname, loader, is_package=True)
        root = fullname.split(".")[0]
        if root in self._roots:
            known = sorted(n for n in self._aliases if n == root or n.startswith(root + "."))
            raise MissingModule(
                f"{fullname} is not part of what paxlite runs of {root} (it has: "
                f"{', '.join(known)})",
                name=fullname,
            )
        return None


def real_t5_installed() -> bool:
    """Whether the ``t5`` package itself is importable (then it is used, not our subset)."""
    return importlib.util.find_spec("t5") is not None


class _UsersFirstFinder(importlib.abc.MetaPathFinder):
    """Finds a user's top-level module that has the name of one of paxlite's packages
    (T5X's README names its user module ``tasks``) anywhere on sys.path but where paxlite's
    is; one the user does not have is an error, not paxlite's package imported twice."""

    def __init__(self, names: dict[str, pathlib.Path]):
        self._names = names  # name -> the folder that holds paxlite's package of that name

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 (importlib's)
        ours = self._names.get(fullname)
        if ours is None:
            return None
        elsewhere = [p for p in sys.path if pathlib.Path(p or ".").resolve() != ours]
        spec = importlib.machinery.PathFinder.find_spec(fullname, elsewhere)
        if spec is None:
            raise ModuleNotFoundError(
                f"no module named {fullname!r} on PYTHONPATH (paxlite's own package of that "
                "name is not a task module): put your directory on it, PYTHONPATH=DIR",
                name=fullname,
            )
        return spec


#: Users' modules named as paxlite's packages, kept between runs of one process (a second
#: run finds them imported, as a T5X process would: their tasks are registered once).
_USERS_MODULES: dict[str, types.ModuleType] = {}


def import_own_packages(names: Sequence[str], root: pathlib.Path) -> None:
    """Imports paxlite's top-level packages ``names`` from ``root`` (where paxlite is
    installed), even where a user's module of the same name comes first on sys.path."""
    for name in names:
        module = sys.modules.get(name)
        if module is not None and pathlib.Path(module.__file__).resolve().parents[1] == root:
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, [str(root)])
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


@contextlib.contextmanager
def t5x_names(own_packages: Sequence[str] = (), script: str = "train_script") -> Iterator[None]:
    """T5X's (and, without the real ``t5``, T5's) module names answered by paxlite's, and
    ``__main__`` by the stand-in of T5X's ``script`` (``train_script``, ``eval_script``,
    ``infer_script``), until the block ends.

    ``own_packages``: paxlite's top-level packages whose names a user's module may also have
    (imported already): inside the block the user's module answers the name; after it,
    paxlite's again (the user's module has run: its SeqIO tasks are registered).
    """
    aliases = dict(T5X_MODULES)
    if not real_t5_installed():
        aliases.update(T5_MODULES)
    for target in T5X_MODULES.values():  # Before the finders: optax_calls imports optax.
        if target is not None:
            importlib.import_module(target)
    main_before = sys.modules.get("__main__")
    shadowed = {name: sys.modules.pop(name) for name in aliases if name in sys.modules}
    own = {name: sys.modules.pop(name) for name in own_packages if name in sys.modules}
    sys.modules.update({name: _USERS_MODULES[name] for name in own if name in _USERS_MODULES})
    roots = {
        name: pathlib.Path(module.__file__).resolve().parents[1] for name, module in own.items()
    }
    alias_finder = _AliasFinder(aliases)
    finders = [alias_finder, _UsersFirstFinder(roots)]
    sys.meta_path[:0] = finders
    sys.modules["__main__"] = importlib.import_module(f"{_API}.{script}")
    try:
        yield
    finally:
        for finder in finders:
            sys.meta_path.remove(finder)
        sys.modules["__main__"] = main_before
        for name in aliases:
            sys.modules.pop(name, None)
        _put_back(alias_finder.changed)
        for name in own:
            if name in sys.modules:
                _USERS_MODULES[name] = sys.modules.pop(name)
        sys.modules.update(shadowed)
        sys.modules.update(own)
