"""``t5.data``: T5's default vocabulary and output features, and SeqIO's registries."""

from __future__ import annotations

import seqio

#: T5's SentencePiece model (32000 pieces; 100 extra ids are added as sentinels).
DEFAULT_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
DEFAULT_EXTRA_IDS = 100

#: The --t5_spm_path flag of paxlite's T5X commands.
SPM_PATH_HELP = (
    "T5's SentencePiece model for t5.data's tasks (DEFAULT_SPM_PATH, 32000 pieces + 100 extra "
    f"ids); default {DEFAULT_SPM_PATH} (a local copy for offline machines)."
)
_spm_path = [DEFAULT_SPM_PATH]

TaskRegistry = seqio.TaskRegistry
MixtureRegistry = seqio.MixtureRegistry
Feature = seqio.Feature


def set_spm_path(path: str | None) -> None:
    """Where T5's SentencePiece model is (None: DEFAULT_SPM_PATH), for tasks registered after."""
    _spm_path[0] = path or DEFAULT_SPM_PATH


def spm_path() -> str:
    """The SentencePiece model T5's tasks read (``set_spm_path``'s, or DEFAULT_SPM_PATH)."""
    return _spm_path[0]


def get_default_vocabulary() -> seqio.SentencePieceVocabulary:
    """T5's vocabulary: ``spm_path()`` with 100 extra ids (read when first used)."""
    return seqio.SentencePieceVocabulary(spm_path(), DEFAULT_EXTRA_IDS)


def default_output_features() -> dict[str, seqio.Feature]:
    """T5's 'inputs' and 'targets' features: the default vocabulary, an EOS each."""
    return {
        "inputs": seqio.Feature(vocabulary=get_default_vocabulary(), add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=get_default_vocabulary(), add_eos=True),
    }


def __getattr__(name: str) -> object:
    """``DEFAULT_OUTPUT_FEATURES``, built when asked (after ``--t5_spm_path`` is set)."""
    if name == "DEFAULT_OUTPUT_FEATURES":
        return default_output_features()
    raise AttributeError(name)
