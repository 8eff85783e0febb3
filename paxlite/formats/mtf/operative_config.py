"""A Mesh TensorFlow checkpoint's ``operative_config.gin``, read for what its tensors'
shapes cannot say.

The T5 library writes the run's operative gin config beside its checkpoints. paxlite reads
four things from it, with gin-config's own parser (nothing of MTF is imported or run; scoped
bindings such as ``encoder/DenseReluDense.activation`` count): the MLP's activation
(``DenseReluDense.activation``: ``'relu'`` for T5 1.0, ``['gelu', 'linear']`` for T5 1.1's
gated GELU), the vocabulary (``SentencePieceVocabulary.sentencepiece_model_file``), whether
the logits are the shared table's (``Unitransformer.shared_embedding_and_softmax_weights``)
and the size macros (``d_model``, ``d_ff``, ``d_kv``, ``num_heads``, ``num_layers``), which the
tensors must agree with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from etils import epath

from paxlite.formats.t5x import gin as t5x_gin

OPERATIVE_CONFIG = "operative_config.gin"
_ACTIVATION = "DenseReluDense.activation"
_VOCABULARY = "SentencePieceVocabulary.sentencepiece_model_file"
_TIED = "Unitransformer.shared_embedding_and_softmax_weights"
#: MTF's activation names -> paxlite's T5 (``praxis_lite.models.t5.ACTIVATIONS``).
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "silu", "silu": "silu", "linear": "linear"}
#: The size macros MTF's T5 gins bind.
SIZE_MACROS = ("d_model", "d_ff", "d_kv", "num_heads", "num_layers")


class OperativeConfigError(ValueError):
    """An operative_config.gin paxlite cannot honour (the file and what)."""


@dataclasses.dataclass(frozen=True)
class OperativeConfig:
    """What a checkpoint's operative config says.

    Attributes:
      file: where it was read.
      activations: the MLP's activations in paxlite's names (``('gelu', 'linear')``), or
        None when the config does not bind them.
      vocabulary: the SentencePiece model file it names, or None.
      sizes: the size macros it binds (of :data:`SIZE_MACROS`).
      tied_logits: whether the logits are the shared table's (the decoder's
        ``Unitransformer.shared_embedding_and_softmax_weights``), or None when not bound.
    """

    file: epath.Path
    activations: tuple[str, ...] | None
    vocabulary: str | None
    sizes: dict[str, int]
    tied_logits: bool | None = None


def read(directory: epath.Path) -> OperativeConfig | None:
    """The operative config in ``directory``, or None when there is none.

    Raises:
      OperativeConfigError: it does not parse, or names an activation paxlite lacks.
    """
    file = directory / OPERATIVE_CONFIG
    if not file.is_file():
        return None
    try:
        values, macros = t5x_gin.bindings_and_macros(file.read_text(), str(file), scoped=True)
    except t5x_gin.GinConfigError as e:
        raise OperativeConfigError(str(e)) from None
    activations = {_activations(v, file) for v in _bound(values, _ACTIVATION).values()}
    if len(activations) > 1:
        raise OperativeConfigError(
            f"{file}: {_ACTIVATION} differs between scopes ({sorted(map(str, activations))}): "
            "paxlite's T5 has one MLP activation for both stacks."
        )
    vocabulary = next(iter(_bound(values, _VOCABULARY).values()), None)
    sizes = {name: int(macros[name]) for name in SIZE_MACROS if isinstance(macros.get(name), int)}
    tied = {bool(v) for k, v in _bound(values, _TIED).items() if not k.startswith("encoder/")}
    tied_logits = next(iter(tied)) if len(tied) == 1 else None
    return OperativeConfig(file, next(iter(activations), None), vocabulary, sizes, tied_logits)


def _bound(values: dict[str, Any], name: str) -> dict[str, Any]:
    """``{key: value}`` of each binding of ``name`` (``Configurable.parameter``), under any
    module prefix or scope (``encoder/DenseReluDense.activation``)."""
    return {
        key: value
        for key, value in values.items()
        if key.rpartition("/")[2] == name or key.endswith("." + name)
    }


def _activations(value: Any, file: epath.Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(value)
    unknown = [n for n in names if not isinstance(n, str) or n not in _ACTIVATIONS]
    if unknown:
        raise OperativeConfigError(
            f"{file}: {_ACTIVATION} = {value!r}: paxlite's T5 has no {unknown[0]!r} "
            f"(it has {', '.join(sorted(_ACTIVATIONS))})."
        )
    return tuple(_ACTIVATIONS[n] for n in names)
