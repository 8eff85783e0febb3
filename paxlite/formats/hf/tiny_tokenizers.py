"""The tokenizers of ``paxlite-tiny-model`` (``paxlite.formats.hf.tiny_models``): trained on
its generated text, laid out as each family's real tokenizer lays out its special tokens, and
written as transformers 5 keeps them, so that paxlite's ``HfTokenizer`` and transformers'
``AutoTokenizer`` read the same ids from them.

Three kinds (:class:`Pieces`):
  - ``BYTE_FALLBACK``: SentencePiece-style BPE trained with the ``tokenizers`` library: spaces
    as "▁" (one before the text, or none), characters it never saw as ``<0xNN>`` byte pieces
    (Llama 2, Mixtral, Gemma). ids: the special tokens, the 256 byte pieces, the trained ones.
  - ``BYTE_LEVEL``: GPT-2's byte-level BPE (Llama 3, Mistral, Qwen, GPT-2), split by a
    :class:`Split` pattern; special tokens first or appended after the trained ones.
  - ``SENTENCEPIECE``: a SentencePiece unigram ``spiece.model`` (T5): ``<pad> </s> <unk>`` at
    0 1 2, no BOS, tabs and line breaks read as spaces, then ``extra_ids`` sentinels
    (``<extra_id_0>`` the last id) that tokenizer_config.json declares.

The ``tokenizers`` kinds are written as ``tokenizer.json`` with a tokenizer_config.json whose
``tokenizer_class`` is ``TokenizersBackend``: transformers then uses tokenizer.json as written.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import os
import tempfile
from collections.abc import Sequence

import sentencepiece
import tokenizers
from etils import epath
from tokenizers import decoders, normalizers, pre_tokenizers, processors

from praxis_lite.tokenizers import hf_tokenizer

_SPACE = "▁"  # SentencePiece's space.
_BYTE_PIECES = tuple(f"<0x{b:02X}>" for b in range(256))
#: A split pattern as Llama 3's (and Qwen's: one digit a piece); ``{digits}`` its digit group.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|{digits}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: spiece.model's normalization: tab, line feed and carriage return are spaces (T5's own
#: nmt_nfkc rules do the same, with a 240 KB table of NFKC mappings that a tiny model does not
#: need), so that SentencePiece and transformers' converted T5Tokenizer split text alike.
#: "source code points <TAB> target code points", in hex.
_SPIECE_RULES = "9\t20\nA\t20\nD\t20\n"

#: Llama 3's chat format: BOS, then per message a header, a blank line, the trimmed content
#: and ``<|eot_id|>``.
LLAMA3_CHAT_TEMPLATE = """\
{{- bos_token }}
{%- for message in messages %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""
#: ChatML (Qwen's), with a default system message when none is given.
CHATML_TEMPLATE = """\
{% if not messages or messages[0]['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{% for message in messages %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""


class Pieces(enum.Enum):
    """How text becomes tokens (module docstring)."""

    BYTE_FALLBACK = "byte_fallback"
    BYTE_LEVEL = "byte_level"
    SENTENCEPIECE = "sentencepiece"


class Split(enum.Enum):
    """How a byte-level BPE splits text before merging (its pre-tokenizer)."""

    GPT2 = "gpt2"  # GPT-2's own regular expression (Mistral too).
    DIGITS_BY_THREE = "digits_by_three"  # Llama 3's pattern: up to 3 digits a piece.
    DIGITS_BY_ONE = "digits_by_one"  # Qwen's: one digit a piece.


@dataclasses.dataclass(frozen=True)
class TokenizerSpec:
    """One family's tokenizer.

    Attributes:
      pieces: the kind (:class:`Pieces`).
      size: its number of ids, special tokens (and T5's sentinels) included; at most the
        model's vocab_size (Qwen's is smaller, as the real ones are). SentencePiece may train
        fewer pieces than ``size - extra_ids`` from a small text (a smaller tokenizer).
      leading: special tokens at ids 0, 1, ... (in this order).
      trailing: special tokens after the trained ones.
      bos, eos, pad, unk: the named special tokens (None: none).
      add_bos: ``encode`` puts BOS first (the post-processor's template).
      dummy_prefix: BYTE_FALLBACK: a "▁" before the text (Llama's; not Gemma's).
      split: BYTE_LEVEL's pattern; nfc: NFC-normalise the text first (Qwen).
      extra_special: special tokens beyond the named ones (tokenizer_config.json's
        ``extra_special_tokens``: Gemma's turn markers).
      chat_template: written to chat_template.jinja (None: no chat template).
      extra_ids: SENTENCEPIECE: T5's sentinels after the pieces.
    """

    pieces: Pieces
    size: int
    leading: tuple[str, ...] = ()
    trailing: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    add_bos: bool = False
    dummy_prefix: bool = True
    split: Split = Split.GPT2
    nfc: bool = False
    extra_special: tuple[str, ...] = ()
    chat_template: str | None = None
    extra_ids: int = 0


@dataclasses.dataclass(frozen=True)
class Written:
    """What :func:`write` wrote.

    Attributes:
      files: the file names, in the order written.
      token_ids: each special token (named, extra, sentinel) -> its id.
      named_ids: ``bos``, ``eos``, ``pad``, ``unk`` -> the id of the spec's token (None: none).
    """

    files: list[str]
    token_ids: dict[str, int]
    named_ids: dict[str, int | None]


def write(spec: TokenizerSpec, texts: Sequence[str], directory: epath.PathLike) -> Written:
    """Trains ``spec``'s tokenizer on ``texts`` (one document each) and writes its files into
    ``directory`` (which exists). Deterministic: the same texts give the same bytes."""
    directory = epath.Path(directory)
    if spec.pieces is Pieces.SENTENCEPIECE:
        return _write_sentencepiece(spec, texts, directory)
    if spec.pieces is Pieces.BYTE_FALLBACK:
        tokenizer = _byte_fallback(spec, texts)
    else:
        tokenizer = _byte_level(spec, texts)
    token_ids = {
        token: tokenizer.token_to_id(token)
        for token in (*spec.leading, *spec.trailing, *spec.extra_special)
    }
    if spec.add_bos:
        tokenizer.post_processor = _with_bos(tokenizer.post_processor, spec.bos, token_ids)
    (directory / hf_tokenizer.TOKENIZER_JSON).write_text(tokenizer.to_str(pretty=True) + "\n")
    files = [hf_tokenizer.TOKENIZER_JSON, *_write_config(spec, directory)]
    return Written(files, token_ids, _named_ids(spec, token_ids))


def _byte_fallback(spec: TokenizerSpec, texts: Sequence[str]) -> tokenizers.Tokenizer:
    """A SentencePiece-style BPE: trained on words that begin with "▁", then rebuilt with the
    special tokens and the byte pieces first and ``byte_fallback``."""
    prepend = "first" if spec.dummy_prefix else "never"
    trainer = tokenizers.Tokenizer(tokenizers.models.BPE())
    trainer.pre_tokenizer = pre_tokenizers.Metaspace(_SPACE, prepend_scheme=prepend, split=True)
    size = spec.size - len(spec.leading) - len(_BYTE_PIECES)
    trainer.train_from_iterator(
        texts, tokenizers.trainers.BpeTrainer(vocab_size=size, show_progress=False)
    )
    model = json.loads(trainer.to_str())["model"]
    trained = sorted(model["vocab"], key=model["vocab"].get)
    vocab = {token: i for i, token in enumerate((*spec.leading, *_BYTE_PIECES, *trained))}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab=vocab, merges=merges, unk_token=spec.unk, byte_fallback=True, fuse_unk=True
        )
    )
    tokenizer.add_special_tokens(list(spec.leading))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(_SPACE, prepend_scheme=prepend, split=False)
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if spec.dummy_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer


def _byte_level(spec: TokenizerSpec, texts: Sequence[str]) -> tokenizers.Tokenizer:
    """A byte-level BPE with its special tokens first (``leading``) or after (``trailing``)."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    if spec.nfc:
        tokenizer.normalizer = normalizers.NFC()
    if spec.split is Split.GPT2:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        digits = r"\p{N}{1,3}" if spec.split is Split.DIGITS_BY_THREE else r"\p{N}"
        pattern = tokenizers.Regex(_SPLIT_PATTERN.replace("{digits}", digits))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(pattern, behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=spec.size - len(spec.trailing),
        special_tokens=list(spec.leading),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.add_special_tokens(list(spec.trailing))
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _with_bos(
    after: processors.PostProcessor | None, bos: str | None, token_ids: dict[str, int]
) -> processors.PostProcessor:
    """``after`` (or nothing), then ``bos $A`` as Llama's and Mistral's tokenizers add BOS."""
    if bos is None:
        raise ValueError("add_bos needs a bos token.")
    template = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, token_ids[bos])]
    )
    return template if after is None else processors.Sequence([after, template])


def _named_ids(spec: TokenizerSpec, token_ids: dict[str, int]) -> dict[str, int | None]:
    named = {"bos": spec.bos, "eos": spec.eos, "pad": spec.pad, "unk": spec.unk}
    return {name: None if token is None else token_ids[token] for name, token in named.items()}


def _write_config(spec: TokenizerSpec, directory: epath.Path) -> list[str]:
    """tokenizer_config.json (and chat_template.jinja): the named and extra special tokens."""
    config: dict[str, object] = {
        "tokenizer_class": "TokenizersBackend",
        "backend": "tokenizers",
        "bos_token": spec.bos,
        "eos_token": spec.eos,
        "pad_token": spec.pad,
        "unk_token": spec.unk,
    }
    if spec.extra_special:
        config["extra_special_tokens"] = list(spec.extra_special)
    (directory / hf_tokenizer.TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if spec.chat_template is None:
        return [hf_tokenizer.TOKENIZER_CONFIG]
    (directory / hf_tokenizer.CHAT_TEMPLATE).write_text(spec.chat_template)
    return [hf_tokenizer.TOKENIZER_CONFIG, hf_tokenizer.CHAT_TEMPLATE]


# --- SentencePiece (T5) ----------------------------------------------------------------------


def _write_sentencepiece(
    spec: TokenizerSpec, texts: Sequence[str], directory: epath.Path
) -> Written:
    """spiece.model, and the tokenizer_config.json and special_tokens_map.json of T5's hub
    repositories (its special tokens, ``extra_ids``, the sentinels)."""
    proto = _train_spiece(spec, texts)
    (directory / hf_tokenizer.T5_SENTENCEPIECE_MODEL).write_bytes(proto)
    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    pieces = processor.get_piece_size()
    token_ids = {token: processor.piece_to_id(token) for token in spec.leading}
    sentinels = [f"<extra_id_{i}>" for i in range(spec.extra_ids)]
    token_ids.update({s: pieces + spec.extra_ids - 1 - i for i, s in enumerate(sentinels)})
    named = {"eos_token": spec.eos, "pad_token": spec.pad, "unk_token": spec.unk}
    config = {"tokenizer_class": "T5Tokenizer", "extra_ids": spec.extra_ids, **named}
    special = {**named, "additional_special_tokens": sentinels}
    for name, value in (
        (hf_tokenizer.TOKENIZER_CONFIG, config),
        (hf_tokenizer.SPECIAL_TOKENS_MAP, special),
    ):
        (directory / name).write_text(json.dumps(value, indent=2) + "\n")
    files = [
        hf_tokenizer.T5_SENTENCEPIECE_MODEL,
        hf_tokenizer.TOKENIZER_CONFIG,
        hf_tokenizer.SPECIAL_TOKENS_MAP,
    ]
    return Written(files, token_ids, _named_ids(spec, token_ids))


def _train_spiece(spec: TokenizerSpec, texts: Sequence[str]) -> bytes:
    """A unigram model of at most ``spec.size - spec.extra_ids`` pieces, its special pieces
    ``spec.leading`` (pad, eos, unk in T5's order), tabs and line breaks read as spaces."""
    roles = {spec.pad: "pad", spec.eos: "eos", spec.unk: "unk"}
    ids = {f"{roles[token]}_id": i for i, token in enumerate(spec.leading)}
    model = io.BytesIO()  # Not a model_prefix: no files but the rules' (below).
    with tempfile.TemporaryDirectory(prefix="paxlite-spiece-") as scratch:
        rules = os.path.join(scratch, "rules.tsv")
        with open(rules, "w") as f:
            f.write(_SPIECE_RULES)
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=spec.size - spec.extra_ids,
            hard_vocab_limit=False,
            model_type="unigram",
            bos_id=-1,
            **ids,
            normalization_rule_tsv=rules,
            character_coverage=1.0,
            num_threads=1,
            minloglevel=2,
        )
    return _without_rules_path(model.getvalue())


def _without_rules_path(proto: bytes) -> bytes:
    """``proto`` without the path of the rules file it was trained with (only informative:
    the model holds the rules themselves), so that its bytes do not depend on where it ran."""
    from sentencepiece import sentencepiece_model_pb2  # (protobuf, as hf_tokenizer's.)

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    return model.SerializeToString()
