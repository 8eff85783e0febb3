"""T5X's ``config.gin``, read for the model it describes.

A T5X run writes its operative gin config into its model directory (``config.gin`` beside the
``checkpoint_<step>`` directories). The architecture is in ``network.T5Config``'s bindings
(``emb_dim``, ``num_heads``, ``head_dim``, ``mlp_dim``, ``num_encoder_layers``,
``num_decoder_layers``, ``vocab_size``, ``mlp_activations``, ``logits_via_embedding``), with
macros (``%NAME``) resolved. The file is parsed with gin-config's own parser; nothing of T5X
or of gin's registry is imported or run.
"""

from __future__ import annotations

import dataclasses
import tokenize
from typing import Any

import jax.numpy as jnp
from etils import epath
from gin import config_parser

from praxis_lite import config as config_lib
from praxis_lite.decoding import sampling
from praxis_lite.models.t5 import ACTIVATIONS, T5Shape, t5_model

CONFIG_GIN = "config.gin"
_T5_CONFIG = "network.T5Config"
#: T5Shape's fields <- T5Config's parameters (``None``: not given means T5X's default).
_FIELDS = {
    "model_dims": ("emb_dim", None),
    "num_heads": ("num_heads", None),
    "dims_per_head": ("head_dim", None),
    "hidden_dims": ("mlp_dim", None),
    "num_encoder_layers": ("num_encoder_layers", None),
    "num_decoder_layers": ("num_decoder_layers", None),
    "vocab_size": ("vocab_size", None),
    "mlp_activations": ("mlp_activations", ("relu",)),
    "logits_via_embedding": ("logits_via_embedding", False),
}


class GinConfigError(ValueError):
    """A config.gin that does not describe a T5 paxlite can build (the file and what)."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """``@name`` / ``@name()`` in a binding's value."""

    name: str
    evaluate: bool


@dataclasses.dataclass(frozen=True)
class Macro:
    """``%NAME`` in a binding's value."""

    name: str


class ValueDelegate(config_parser.ParserDelegate):
    """Keeps references and macros as values (gin's registry is never asked)."""

    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> Reference:
        return Reference(scoped_configurable_name, evaluate)

    def macro(self, macro_name: str) -> Macro:
        return Macro(macro_name)


def find(path: epath.PathLike) -> epath.Path | None:
    """The config.gin of a T5X model directory ``path`` or of its ``checkpoint_<step>``
    (in the directory above), or None."""
    path = epath.Path(path)
    for directory in (path, path.parent):
        if (directory / CONFIG_GIN).is_file():
            return directory / CONFIG_GIN
    return None


def bindings(text: str, where: str = CONFIG_GIN) -> dict[str, Any]:
    """``{'selector.parameter': value}`` of the unscoped bindings of ``text``, macros resolved.

    Raises:
      GinConfigError: the text does not parse, or a macro is never bound.
    """
    return bindings_and_macros(text, where)[0]


def bindings_and_macros(
    text: str, where: str = CONFIG_GIN, scoped: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`bindings`, and ``{macro: value}`` of the macros ``text`` binds (resolved);
    with ``scoped``, scoped bindings too, as ``'scope/selector.parameter'``.

    Raises:
      GinConfigError: the text does not parse, or a macro is never bound.
    """
    values, macros = {}, {}
    try:
        for statement in config_parser.ConfigParser(text, ValueDelegate()):
            if not isinstance(statement, config_parser.BindingStatement):
                continue
            if statement.scope and not (scoped and statement.arg_name):
                continue
            scope = f"{statement.scope}/" if statement.scope else ""
            if statement.arg_name:
                values[f"{scope}{statement.selector}.{statement.arg_name}"] = statement.value
            else:
                macros[statement.selector] = statement.value
    except SyntaxError as e:
        raise GinConfigError(f"{where} does not parse as gin: {e.msg} (line {e.lineno}).") from None
    except tokenize.TokenError as e:
        raise GinConfigError(f"{where} does not parse as gin: {e.args[0]}.") from None
    resolved = {key: _resolved(value, macros, where) for key, value in values.items()}
    return resolved, {name: _resolved(value, macros, where) for name, value in macros.items()}


def _resolved(value: Any, macros: dict[str, Any], where: str) -> Any:
    seen = set()
    while isinstance(value, Macro):
        if value.name not in macros or value.name in seen:
            raise GinConfigError(f"{where}: macro %{value.name} is not bound.")
        seen.add(value.name)
        value = macros[value.name]
    return value


def t5_shape(gin_file: epath.PathLike) -> T5Shape:
    """The T5 that ``gin_file``'s ``network.T5Config`` bindings describe.

    Raises:
      GinConfigError: a size is not bound, or a value paxlite's T5 cannot honour.
    """
    gin_file = epath.Path(gin_file)
    found = bindings(gin_file.read_text(), str(gin_file))
    fields = {}
    for field, (parameter, default) in _FIELDS.items():
        value = found.get(f"{_T5_CONFIG}.{parameter}", default)
        if value is None:
            raise GinConfigError(
                f"{gin_file} binds no {_T5_CONFIG}.{parameter}, which the model needs."
            )
        fields[field] = tuple(value) if isinstance(value, list) else value
    try:
        return T5Shape(**fields)
    except ValueError as e:
        raise GinConfigError(f"{gin_file}: {e} Known activations: {sorted(ACTIVATIONS)}.") from None


def t5_config_text(shape: T5Shape) -> str:
    """A config.gin naming the T5 of ``shape`` by ``network.T5Config``'s bindings (what
    :func:`t5_shape` reads back), for a model directory paxlite writes."""
    lines = [f"# The T5 of this model directory ({_T5_CONFIG}), written by paxlite.", ""]
    for field, (parameter, _) in _FIELDS.items():
        lines.append(f"{_T5_CONFIG}.{parameter} = {getattr(shape, field)!r}")
    return "\n".join(lines) + "\n"


#: T5's SentencePiece ids: decoding stops at EOS 1 and pads with 0.
T5_DECODING = sampling.DecoderParams(eos_token_id=1, pad_token_id=0)


def described(path: epath.PathLike) -> tuple[config_lib.Config, sampling.DecoderParams] | None:
    """The model a T5X checkpoint's config.gin describes (float32, plain stacks) and T5's
    decoding ids, or None when there is no config.gin."""
    gin_file = find(path)
    if gin_file is None:
        return None
    return t5_model(t5_shape(gin_file), fprop_dtype=jnp.float32, scanned=False), T5_DECODING
