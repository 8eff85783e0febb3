"""T5X's ``t5x/scripts/convert_tf_checkpoint.py``: its ``convert_checkpoint``, which that
script registers as the gin configurable ``convert_checkpoint`` (no module), so that gin files
and flags bind ``convert_checkpoint.model``, ``.tf_checkpoint_path``, ``.output_dir``,
``.save_dtype`` and ``.concurrent_gb``."""

from __future__ import annotations

import dataclasses
from typing import Any

import gin

from praxis_lite.models.t5 import T5Shape

CONFIGURABLE = "convert_checkpoint"


@dataclasses.dataclass(frozen=True)
class ConvertCall:
    """The arguments gin called T5X's ``convert_checkpoint`` with (its names and defaults).

    ``concurrent_gb``: T5X's parameters converted at once; paxlite converts one tensor at a
    time whatever it is."""

    model: Any
    tf_checkpoint_path: str
    output_dir: str
    save_dtype: Any = "float32"
    concurrent_gb: int = 16

    def t5_shape(self) -> T5Shape | None:
        """The T5 the model's ``network.T5Config`` describes (None: not T5X's network)."""
        config = getattr(getattr(self.model, "module", None), "config", None)
        if config is None:
            return None
        return T5Shape(
            num_encoder_layers=config.num_encoder_layers,
            num_decoder_layers=config.num_decoder_layers,
            model_dims=config.emb_dim,
            hidden_dims=config.mlp_dim,
            num_heads=config.num_heads,
            dims_per_head=config.head_dim,
            vocab_size=config.vocab_size,
            mlp_activations=tuple(config.mlp_activations),
            logits_via_embedding=bool(config.logits_via_embedding),
        )


def convert_checkpoint(
    model: Any,
    tf_checkpoint_path: str,
    output_dir: str,
    save_dtype: Any = "float32",
    concurrent_gb: int = 16,
) -> ConvertCall:
    """T5X's ``convert_checkpoint`` signature; returns the call for paxlite to run."""
    return ConvertCall(model, tf_checkpoint_path, output_dir, save_dtype, concurrent_gb)


gin.external_configurable(convert_checkpoint, name=CONFIGURABLE)
