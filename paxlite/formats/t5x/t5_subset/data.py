"""``t5.data``: T5's default vocabulary and output features, and SeqIO's registries."""

from __future__ import annotations

import seqio

#: T5's SentencePiece model (32000 pieces; 100 extra ids are added as sentinels).
DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100

TaskRegistry = seqio.TaskRegistry
MixtureRegistry = seqio.MixtureRegistry
Feature = seqio.Feature


def get_default_vocabulary() -> seqio.SentencePieceVocabulary:
    """T5's vocabulary: DEFAULT_SPM_PATH with 100 extra ids (read when first used)."""
    return seqio.SentencePieceVocabulary(DEFAULT_SPM_PATH, DEFAULT_EXTRA_IDS)


DEFAULT_OUTPUT_FEATURES = {
    "inputs": seqio.Feature(vocabulary=get_default_vocabulary(), add_eos=True, required=False),
    "targets": seqio.Feature(vocabulary=get_default_vocabulary(), add_eos=True),
}
