"""LoRA adapters around a model config and its weights: put on from a PEFT directory,
found in a run's config, folded into the base weights (``paxlite.pretrained.loading``,
``paxlite.pretrained.export``).

The adapters themselves are layer fields (``praxis_lite.layers.lora``); PEFT's format is
``paxlite.formats.peft.adapter``.
"""

from __future__ import annotations

import sys
from typing import Any

import fiddle as fdl
import jax
from etils import epath
from fiddle import daglish
from flax import traverse_util

from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from praxis_lite import config as config_lib
from praxis_lite.layers import lora
from praxis_lite.layers.lora_targets import clear_lora, set_lora


class AdapterError(ValueError):
    """An adapter that cannot be put on this model (the message says why)."""


def base_of(adapter_dir: epath.Path) -> epath.Path:
    """The local base model directory a PEFT adapter names (``base_model_name_or_path``).

    Raises:
      AdapterError: it names a hub id or anything else that is no local model directory.
    """
    base = peft_adapter.AdapterConfig.load(adapter_dir).base_model_name_or_path
    if base and (epath.Path(base) / hf_models.CONFIG_FILE).is_file():
        return epath.Path(base)
    raise AdapterError(
        f"{adapter_dir} adapts {base!r}, which is no local Hugging Face model directory (a hub "
        "id? paxlite downloads nothing); pass the base: from_pretrained(BASE_DIR, adapter=...)."
    )


def check_base(adapter_dir: epath.Path, base_dir: epath.Path) -> None:
    """Refuses a base model that is not the adapter's; warns (one ``paxlite: warning:``
    line) when the adapter names a base paxlite cannot open, under another name
    (``peft_adapter.check_base``).

    Raises:
      AdapterError: the adapter names a local model directory, and ``base_dir`` is another.
    """
    try:
        warning = peft_adapter.check_base(
            adapter_dir, peft_adapter.AdapterConfig.load(adapter_dir), base_dir
        )
    except peft_adapter.PeftError as e:
        raise AdapterError(str(e)) from None
    if warning is not None:
        print(f"paxlite: warning: {warning}", file=sys.stderr, flush=True)


def put_on(model_cfg: Any, family: hf_models.Family, adapter_dir: epath.Path) -> lora.LoraSettings:
    """Sets the adapter's LoRA settings on ``model_cfg``'s targeted layers (in place);
    returns them."""
    adapter = peft_adapter.AdapterConfig.load(adapter_dir)
    targets = peft_adapter.lora_targets(family, adapter.target_modules)
    settings = lora.LoraSettings(
        rank=adapter.rank,
        alpha=adapter.alpha,
        dropout_prob=adapter.dropout,
        use_rslora=adapter.use_rslora,
    )

    def settings_for(layer_targets: tuple[str, ...]) -> config_lib.Config:
        return config_lib.Config(
            lora.LoraSettings,
            rank=settings.rank,
            alpha=settings.alpha,
            dropout_prob=settings.dropout_prob,
            use_rslora=settings.use_rslora,
            targets=layer_targets,
        )

    set_lora(model_cfg, targets, settings_for)
    return settings


def settings_in(model_cfg: Any) -> lora.LoraSettings | None:
    """The LoRA settings a model config holds (its layers share them), or None."""
    for value, _ in daglish.iterate(model_cfg):
        if isinstance(value, fdl.Buildable) and fdl.get_callable(value) is lora.LoraSettings:
            return fdl.build(value)
    return None


def merged(model_cfg: Any, params: Any, settings: lora.LoraSettings) -> tuple[Any, Any]:
    """``(model_cfg without adapters, params with every adapter folded in)``; the config is
    changed in place, the params are new (same shardings as their base weights)."""
    flat = traverse_util.flatten_dict(params, sep="/")
    folded = lora.merged(flat, settings.scale)
    clear_lora(model_cfg)
    return model_cfg, traverse_util.unflatten_dict(folded, sep="/")


def check_all_used(adapter_dir: epath.Path, table: Any, params: Any) -> None:
    """AdapterError when the adapter holds tensors the model has no adapter for."""
    source = peft_adapter.PeftSource(adapter_dir, table)
    flat = traverse_util.flatten_dict(params, sep="/")
    run = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in flat.items()}
    unused = sorted(set(source.variables()) - set(source.run_names(run)))
    if unused:
        raise AdapterError(
            f"{adapter_dir} adapts modules this model has no adapter for ({', '.join(unused[:4])}"
            f"{' ...' if len(unused) > 4 else ''}): its adapter_config.json and its tensors differ."
        )
