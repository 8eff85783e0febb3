"""Fiddle glue: layer configs with typo checks, sub-layer templates, and building.

A layer's fields are its hyperparameters. ``Linear.HParams.config(input_dims=8)``
returns a :class:`Config` (a ``fdl.Config`` subclass) that:

* raises at once on an unknown field, naming the valid ones and the closest match
  (or, for an old name declared with :func:`renamed_fields`, the new one);
* pre-fills every template field (``template_field(Linear)``) with a fresh config
  of its default class, so ``ff.linear_tpl.input_dims = 4`` works with no setup.

Templates stay configs until the owning layer's ``setup()`` turns them into
children (``BaseLayer.create_child``), so a parent can stamp many children from
one template. :func:`instantiate` builds the top of a config tree while keeping
its templates as templates.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import fiddle as fdl
from fiddle import daglish
from fiddle.experimental import serialization

from praxis_lite import moved

_TEMPLATE_METADATA_KEY = "praxis_lite_template"
_RENAMED_FIELDS_ATTR = "__renamed_fields__"


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _public_param_names(fn_or_cls: Any) -> list[str]:
    names = list(fdl.Config(fn_or_cls).__signature_info__.parameters)
    return [n for n in names if n not in ("parent", "name")] + ["name"]


def _unknown_field_error(fn_or_cls: Any, name: str) -> AttributeError:
    renamed = _renamed_field_message(fn_or_cls, name)
    if renamed:
        return AttributeError(renamed)
    valid = _public_param_names(fn_or_cls)
    qualname = getattr(fn_or_cls, "__qualname__", repr(fn_or_cls))
    return AttributeError(
        f"{qualname} has no field {name!r}.{_did_you_mean(name, valid)} "
        f"Valid fields: {', '.join(valid)}."
    )


def renamed_fields(renames: Mapping[str, str], why: str) -> Callable[[type], type]:
    """Class decorator: old field names (``{old: new}``) that fail naming the new one.

    ``Cls(old=...)`` raises TypeError, and setting, reading or passing ``old`` on a
    :class:`Config` of ``Cls`` AttributeError, both with the one line
    ``"Cls: old is now new (why)."``.
    """

    def decorate(cls: type) -> type:
        init = cls.__init__

        @functools.wraps(init)  # Keeps the signature that Fiddle reads.
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            for name in kwargs:
                if name in renames:
                    raise TypeError(_renamed_field_message(cls, name))
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        setattr(cls, _RENAMED_FIELDS_ATTR, {old: f"{new} ({why})" for old, new in renames.items()})
        return cls

    return decorate


def _renamed_field_message(fn_or_cls: Any, name: str) -> str | None:
    new = getattr(fn_or_cls, _RENAMED_FIELDS_ATTR, {}).get(name)
    qualname = getattr(fn_or_cls, "__qualname__", repr(fn_or_cls))
    return f"{qualname}: {name} is now {new}." if new else None


def template_fields(fn_or_cls: Any) -> list[dataclasses.Field]:
    """The dataclass fields of ``fn_or_cls`` declared with :func:`template_field`."""
    if not (isinstance(fn_or_cls, type) and dataclasses.is_dataclass(fn_or_cls)):
        return []
    return [f for f in dataclasses.fields(fn_or_cls) if f.metadata.get(_TEMPLATE_METADATA_KEY)]


class _TypoCheckingMixin:
    """Adds did-you-mean errors to fiddle's unknown-parameter checks."""

    def __init__(self, fn_or_cls, /, *args, **kwargs):
        params = fdl.Config(fn_or_cls).__signature_info__
        if not params.has_var_keyword:
            for key in kwargs:
                if key not in params.parameters:
                    raise _unknown_field_error(fn_or_cls, key)
        super().__init__(fn_or_cls, *args, **kwargs)
        for field in template_fields(fn_or_cls):
            if field.name not in self.__arguments__:
                setattr(self, field.name, field.metadata[_TEMPLATE_METADATA_KEY]())

    def __setattr__(self, name: str, value: Any) -> None:
        info = self.__signature_info__
        if not info.has_var_keyword and name not in info.parameters:
            raise _unknown_field_error(self.__fn_or_cls__, name)
        super().__setattr__(name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            return super().__getattr__(name)
        info = self.__signature_info__
        if not info.has_var_keyword and name not in info.parameters:
            raise _unknown_field_error(self.__fn_or_cls__, name)
        return super().__getattr__(name)


class Config(_TypoCheckingMixin, fdl.Config):
    """A ``fdl.Config`` that names the closest valid field on a typo."""


class Partial(_TypoCheckingMixin, fdl.Partial):
    """A ``fdl.Partial`` that names the closest valid field on a typo."""


class Template:
    """A frozen holder for a sub-layer template inside a built layer.

    Layers are flax dataclasses, hashed and compared by their fields; a mutable
    ``fdl.Config`` is neither hashable nor meant to be built by fiddle there, so
    built layers hold their templates in this wrapper. Identity semantics: two
    holders of the same config object are equal.

    Attributes:
      value: the template: a layer config (or, if fiddle built it, a layer).
      shared: whether the same config object appears in more than one place of
        the config tree that was instantiated (then it is built once).
      shared_ids: ids of every shared config of that tree, passed down so the
        children built from this template know which of their templates are shared.
    """

    __slots__ = ("value", "shared", "shared_ids")

    def __init__(self, value: Any, shared: bool = False, shared_ids: frozenset[int] = frozenset()):
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "shared", shared)
        object.__setattr__(self, "shared_ids", shared_ids)

    def __setattr__(self, name, value):
        raise AttributeError("Template is read-only; edit the config before building.")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Template) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        return f"Template({self.value!r})"


#: The type of a sub-layer template field: a layer config (``X.HParams.config(...)``)
#: while configuring, a :class:`Template` holding it in a built layer, or None for an
#: absent optional sub-layer.
LayerTpl = fdl.Config | Template | None


def template_field(default_cls: type | None = None) -> Any:
    """Declares a sub-layer template field whose default configures ``default_cls``.

    ``None`` declares an optional sub-layer that is absent unless a user sets it.
    """
    if default_cls is None:
        factory = lambda: None  # noqa: E731
    else:
        factory = lambda: Config(default_cls)  # noqa: E731
    return dataclasses.field(
        default_factory=lambda: None if default_cls is None else Template(Config(default_cls)),
        metadata={_TEMPLATE_METADATA_KEY: factory},
        hash=False,
    )


def wrap_template(value: Any, shared_ids: frozenset[int] = frozenset()) -> Any:
    """Wraps a template field's value (a config or a built module) for a built layer."""
    if value is None or isinstance(value, Template):
        return value
    return Template(value, shared=id(value) in shared_ids, shared_ids=shared_ids)


def instantiate(cfg: Any, *, _shared_ids: frozenset[int] | None = None, **overrides: Any) -> Any:
    """Builds ``cfg`` (a Config/Partial or a structure of them) into objects.

    Template fields of layer configs are not built: the layer receives them as
    :class:`Template`s and makes its own children from them. A config object that
    appears in several places is built once (one layer, one set of weights).
    ``overrides`` set top-level fields on a copy of ``cfg`` first.
    """
    if overrides:
        cfg = copy.copy(cfg)
        for key, value in overrides.items():
            setattr(cfg, key, value)
    if _shared_ids is None:
        _shared_ids = shared_config_ids(cfg)
    return fdl.build(_freeze_templates(cfg, _shared_ids))


def unbound_layer(template: Any) -> Any:
    """The layer of a template or config, built unbound: its fields and methods, no weights.

    Built with ``parent=None``, so calling this inside a layer's method does not
    make the result that layer's child.
    """
    value = template.value if isinstance(template, Template) else template
    if not isinstance(value, fdl.Buildable):
        return value
    return instantiate(value, parent=None)


def shared_config_ids(cfg: Any) -> frozenset[int]:
    """Ids of the Buildables reachable from ``cfg`` along more than one path."""
    shared = set()
    for paths in daglish.collect_paths_by_id(cfg, memoizable_only=True).values():
        if len(paths) > 1:
            value = daglish.follow_path(cfg, paths[0])
            if isinstance(value, fdl.Buildable):
                shared.add(id(value))
    return frozenset(shared)


def _freeze_templates(cfg: Any, shared_ids: frozenset[int]) -> Any:
    """A copy of ``cfg`` whose layer-template arguments are Template holders."""

    def traverse(value, state):
        if isinstance(value, fdl.Buildable):
            names = {f.name for f in template_fields(value.__fn_or_cls__)}
            names &= set(value.__arguments__)
            if names:
                value = copy.copy(value)
                for name in names:
                    wrapped = wrap_template(value.__arguments__[name], shared_ids)
                    fdl.Buildable.__setattr__(value, name, wrapped)
        return state.map_children(value)

    return daglish.MemoizedTraversal.run(traverse, cfg)


def set_dtypes(cfg: Any, *, dtype: Any = None, fprop_dtype: Any = None) -> Any:
    """Sets ``dtype`` / ``fprop_dtype`` on every layer config in ``cfg``, in place.

    Layers never copy dtypes into their children; this is the explicit way to
    say "fp32 weights, bf16 compute" for a whole model. Returns ``cfg``.
    """
    for value, _ in daglish.iterate(cfg):
        if isinstance(value, fdl.Buildable):
            params = value.__signature_info__.parameters
            if dtype is not None and "dtype" in params:
                fdl.Buildable.__setattr__(value, "dtype", dtype)
            if fprop_dtype is not None and "fprop_dtype" in params:
                fdl.Buildable.__setattr__(value, "fprop_dtype", fprop_dtype)
    return cfg


def to_json(cfg: Any) -> str:
    """Serializes a config tree to JSON with fiddle's serializer."""
    return serialization.dump_json(cfg, indent=2)


def from_json(text: str) -> Any:
    """Inverse of :func:`to_json`; also reads what earlier versions wrote (their module paths
    and layer fields mapped to today's by :mod:`praxis_lite.moved`)."""
    tree = json.loads(text)
    _current_pyrefs(tree)
    cfg = serialization.load_json(json.dumps(tree))
    for value in [v for v, _ in daglish.iterate(cfg) if isinstance(v, fdl.Buildable)]:
        _current_fields(value)
    return cfg


def _current_fields(cfg: fdl.Buildable) -> None:
    """Rewrites, in place, the arguments of ``cfg`` that name a field as an earlier version
    did (:data:`praxis_lite.moved.MOVED_FIELDS`): each is left out, and its replacement set
    once all are (an old flag may set a field that an old default leaves out)."""
    classes = [
        f"{c.__module__}.{c.__qualname__}" for c in getattr(cfg.__fn_or_cls__, "__mro__", ())
    ]
    replacements = {}
    for name, value in list(cfg.__arguments__.items()):
        rules = next(
            (moved.MOVED_FIELDS[c, name] for c in classes if (c, name) in moved.MOVED_FIELDS), {}
        )
        matches = [
            now for then, now in rules.items() if type(then) is type(value) and then == value
        ]
        if matches:
            fdl.Buildable.__delattr__(cfg, name)
            if matches[0] is not None:
                replacements[matches[0][0]] = _enum_member(matches[0][1])
    for name, value in replacements.items():
        fdl.Buildable.__setattr__(cfg, name, value)


def _enum_member(path: str) -> Any:
    """The member ``module:Enum.MEMBER`` names."""
    module, _, name = path.partition(":")
    return functools.reduce(getattr, name.split("."), importlib.import_module(module))


def _current_pyrefs(node: Any) -> None:
    """Rewrites, in place, each Fiddle JSON reference (``{"type": "pyref", "module": ...,
    "name": ...}``) to a module that moved."""
    if isinstance(node, dict):
        if node.get("type") == "pyref" and {"module", "name"} <= node.keys():
            node["module"] = moved.current_module(node["module"], node["name"])
        for value in node.values():
            _current_pyrefs(value)
    elif isinstance(node, list):
        for value in node:
            _current_pyrefs(value)
