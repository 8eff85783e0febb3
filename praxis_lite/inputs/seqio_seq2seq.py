"""Encoder-decoder (T5) batches of ``SeqIOInput(encoder_decoder=True)``: checks and shaping.

Training and eval batches are seqio's ``EncDecFeatureConverter`` (T5X's), its keys kept
(``Te = task_feature_lengths['inputs']``, ``Td = task_feature_lengths['targets']``)::

    encoder_input_tokens   [B, Te] int32: 'inputs' (with its EOS if the feature adds one);
                                   0 is padding
    decoder_target_tokens  [B, Td] int32: 'targets' (with its EOS); 0 is padding
    decoder_input_tokens   [B, Td] int32: the targets shifted right behind a 0 (the
                                   decoder's start; packed: each segment starts with 0)
    decoder_loss_weights   [B, Td] float32: 1 on the targets, 0 on padding
    encoder_segment_ids, decoder_segment_ids, encoder_positions, decoder_positions
                           int32, packed inputs only: example k of a row is segment k
                           (from 1; 0 is padding) on both sides, positions from 0 in each

Decoder inputs (``DecodeForm.INPUTS_TARGETS``) prompt the encoder with each example's
'inputs', with no start token before them::

    input_ids       [B, Te] int32: 'inputs' (with its EOS), right-padded with 0
    input_lengths   [B]     int32: its tokens (0 for a padding example)
    target_ids      [B, Td] int32: 'targets' (with its EOS), right-padded with 0
    target_lengths  [B]     int32

An example with empty 'inputs' has nothing to prompt with and is skipped by decoder inputs.
id 0 must be padding (seqio's vocabularies: bytes, SentencePiece); a Hugging Face tokenizer,
whose id 0 is a real token, is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import seqio
import tensorflow as tf

from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.seqio_tasks import zero_is_padding
from praxis_lite.py_utils import NestedMap

FEATURES = ("inputs", "targets")


def check_tasks(provider: Any, lengths: Mapping[str, int], where: str) -> None:
    """Raises unless ``lengths`` are positive 'inputs' and 'targets' lengths and every task
    of ``provider`` has both features, with a vocabulary whose id 0 is padding."""
    if sorted(lengths) != sorted(FEATURES) or not all(
        isinstance(n, int) and n > 0 for n in lengths.values()
    ):
        raise InputConfigError(
            f"{where}: encoder_decoder needs task_feature_lengths of positive 'inputs' (the "
            f"encoder's) and 'targets' (the decoder's) lengths only, got {dict(lengths)}."
        )
    for task in seqio.get_subtasks(provider):
        features = task.output_features
        if any(key not in features for key in FEATURES):
            raise InputConfigError(
                f"{where}: encoder_decoder reads 'inputs' into the encoder and 'targets' into "
                f"the decoder, but task {task.name!r} has only {sorted(features)}; give it "
                "both features, or set encoder_decoder=False for a decoder-only LM."
            )
        if not all(zero_is_padding(features[key].vocabulary) for key in FEATURES):
            raise InputConfigError(
                f"{where}: task {task.name!r} has a Hugging Face tokenizer, whose id 0 is a real "
                "token, but encoder-decoder (T5) batches need id 0 as padding; register the "
                "task with a SentencePiece model (e.g. T5's spiece.model) or bytes."
            )


def examples(
    ds: tf.data.Dataset, lengths: Mapping[str, int], *, pack: bool, decode: bool
) -> tf.data.Dataset:
    """A Task's examples -> converted examples (``decode``: decode examples; module docstring)."""
    if not decode:
        return seqio.EncDecFeatureConverter(pack=pack)(ds, lengths)
    width = {key: lengths[key] for key in FEATURES}

    def to_decode(ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        out = {}
        for key, name in (("inputs", "input"), ("targets", "target")):
            tokens = tf.cast(ex[key][: width[key]], tf.int32)
            padded = tf.pad(tokens, [[0, width[key] - tf.size(tokens)]])
            out[f"{name}_ids"] = tf.ensure_shape(padded, [width[key]])
            out[f"{name}_lengths"] = tf.size(tokens, out_type=tf.int32)
        return out

    ds = ds.filter(lambda ex: tf.size(ex["inputs"]) > 0)
    return ds.map(to_decode, num_parallel_calls=tf.data.AUTOTUNE)


def to_batch(raw: Mapping[str, np.ndarray]) -> NestedMap:
    """A converted numpy batch with the model's dtypes: int32, and float32 loss weights."""
    batch = NestedMap({key: np.asarray(value, np.int32) for key, value in raw.items()})
    batch.decoder_loss_weights = np.asarray(raw["decoder_loss_weights"], np.float32)
    return batch
