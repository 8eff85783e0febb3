"""``t5x.models``: the model configurables T5X's gin files bind."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paxlite.formats.t5x.api import decoding


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """What ``predict_batch_with_aux`` is configured with: ``num_decodes`` beams (T5X's
    beam search) or samples."""

    num_decodes: int | None
    return_all_decodes: bool | None
    decoder_params: Mapping[str, Any] | None
    prompt_with_targets: bool


@dataclasses.dataclass(frozen=True)
class EncoderDecoderModel:
    """T5X's ``models.EncoderDecoderModel`` (its fields and defaults)."""

    module: Any
    input_vocabulary: Any
    output_vocabulary: Any
    optimizer_def: Any
    decode_fn: Any = decoding.beam_search
    feature_converter_cls: Any = None
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    loss_normalizing_factor: float | int | str | None = None
    default_decoder_params: Mapping[str, Any] | None = None

    def predict_batch_with_aux(
        self,
        params: Any = None,
        batch: Any = None,
        rng: Any = None,
        decoder_params: Mapping[str, Any] | None = None,
        return_all_decodes: bool | None = None,
        num_decodes: int | None = None,
        prompt_with_targets: bool = False,
    ) -> DecodeSettings:
        """The decoding settings gin binds here (T5X's signature; paxlite's decoder runs)."""
        return DecodeSettings(num_decodes, return_all_decodes, decoder_params, prompt_with_targets)


@dataclasses.dataclass(frozen=True)
class DecoderOnlyModel:
    """T5X's ``models.DecoderOnlyModel``: named so a gin file that uses it is told paxlite's
    T5X commands do not run it (paxlite's own LM experiments do)."""

    module: Any
    vocabulary: Any
    optimizer_def: Any
    decode_fn: Any = None
    inputs_bidirectional_attention: bool = False
    feature_converter_cls: Any = None
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    loss_normalizing_factor: Any = None
