"""Which layers of a model config get LoRA adapters: the target names of paxlite's layers.

``DotProductAttention`` adapts ``query``, ``key``, ``value``, ``post`` (or ``qkv``: one A
shared by q, k and v); ``TransformerFeedForward`` adapts ``ffn_layer1``,
``ffn_layer1_gate``, ``ffn_layer2``. :func:`set_lora` sets each layer config's ``lora``
field for the targets it has; :func:`clear_lora` takes them off again (a merged model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fiddle as fdl
from fiddle import daglish

from praxis_lite.layers.attentions import LORA_TARGETS, DotProductAttention
from praxis_lite.layers.transformers import FFN_LORA_TARGETS, TransformerFeedForward

#: Attention's q, k and v under one shared A (PEFT's adapter on a fused q/k/v module).
FUSED_QKV = "qkv"
ATTENTION_TARGETS = tuple(t for t in LORA_TARGETS if t != FUSED_QKV)
FEED_FORWARD_TARGETS = FFN_LORA_TARGETS


def set_lora(
    model: Any, targets: tuple[str, ...], settings_for: Callable[[tuple[str, ...]], Any]
) -> int:
    """Sets ``lora`` on every attention and feed-forward layer config of ``model`` that
    has one of ``targets`` (``settings_for(layer_targets)`` -> its LoraSettings config);
    returns how many layer configs were set.

    With every feed-forward target named (``all-linear``), a layer without a gate gets
    its other two."""
    count = 0
    for value, _ in daglish.iterate(model):
        if not isinstance(value, fdl.Config):
            continue
        layer_targets = _layer_targets(value, targets)
        if layer_targets:
            value.lora = settings_for(layer_targets)
            count += 1
    return count


def _layer_targets(cfg: fdl.Config, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The targets of ``targets`` that layer config ``cfg`` has."""
    layer = fdl.get_callable(cfg)
    if not isinstance(layer, type):
        return ()
    if issubclass(layer, DotProductAttention):
        return tuple(t for t in targets if t in ATTENTION_TARGETS + (FUSED_QKV,))
    if issubclass(layer, TransformerFeedForward):
        chosen = tuple(t for t in targets if t in FEED_FORWARD_TARGETS)
        if chosen == FEED_FORWARD_TARGETS and not cfg.use_gated_activation:
            chosen = ("ffn_layer1", "ffn_layer2")
        return chosen
    return ()


def clear_lora(model: Any) -> None:
    """Sets every ``lora`` field of ``model``'s layer configs back to None (in place)."""
    for value, _ in daglish.iterate(model):
        if isinstance(value, fdl.Config) and getattr(value, "lora", None) is not None:
            value.lora = None
