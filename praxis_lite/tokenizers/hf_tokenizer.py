"""Hugging Face tokenizers: ``HfTokenizer.from_dir(model_dir)`` reads a model directory's tokenizer.

A Hugging Face model directory holds its tokenizer as ``tokenizer.json`` (the ``tokenizers``
library's file: Llama 3, Mistral, Qwen2/3, Gemma, GPT-2), read with that library when
present, else as ``tokenizer.model`` (SentencePiece: Llama 2), read with ``sentencepiece``.
``encode(text)`` gives what transformers 5.x's ``tokenizer(text).input_ids`` gives.

Special tokens. Each of BOS, EOS, pad (and unk) is the token string that
``tokenizer_config.json`` or ``special_tokens_map.json`` names (``"bos_token": "<s>"`` or
``{"content": "<s>", ...}``; ``null``: none), mapped to its id through the vocabulary, as
transformers does (special_tokens_map.json wins only for an older tokenizer_config.json
without ``added_tokens_decoder``, as there); a string the vocabulary lacks is added after
it, as transformers adds it. A token neither file mentions comes from the SentencePiece
model's own BOS/EOS/unk/pad pieces (tokenizer.model only), else from the ``*_token_id`` of
``generation_config.json``, then ``config.json`` (the first of a list). The other special
tokens tokenizer_config.json lists (``extra_special_tokens``, ``additional_special_tokens``)
are found in the text and skipped by ``decode`` like the named ones.

Which special tokens ``encode`` adds:
  - tokenizer.json: those of the file's post-processor (Llama 3's and Mistral's BOS; none
    for Qwen). transformers 5 ignores tokenizer_config.json's ``add_bos_token`` /
    ``add_eos_token`` beside a tokenizer.json; so does this.
  - tokenizer.model: BOS when ``add_bos_token`` (default True, LlamaTokenizer's documented
    default; transformers 5 adds none when tokenizer_config.json lacks the key, transformers
    4 adds it), EOS when ``add_eos_token`` (default False).

tokenizer.model as transformers 5 reads it. It converts the model to a BPE tokenizer
(``LlamaTokenizer``) whose ids differ from raw SentencePiece's in three ways, which this
module follows (it runs SentencePiece on the text after doing these steps itself):
  1. special-token strings in the text (``"<s>"``, added tokens) are those tokens, not
     characters;
  2. spaces become "▁" and one "▁" goes before the text, only where the text does not start
     with a space (raw SentencePiece adds it there too: " hi" is [▁, ▁hi] there, [▁hi]
     here), and only at the start of the text (``legacy: false``, transformers' default;
     ``legacy: true``: before every stretch of text between special tokens;
     ``add_prefix_space: false``, or a model without SentencePiece's dummy prefix as
     Gemma's: never);
  3. the model's normalizer (``remove_extra_whitespaces``, NFKC rules) is not applied.
(Without a tokenizer_config.json, transformers 5 follows the model's own settings between
special tokens, as raw SentencePiece; so does this.)
Decoding is transformers': pieces with "▁" as spaces, ``<0xNN>`` pieces as UTF-8 bytes
(U+FFFD for invalid ones), special tokens as their text unless skipped, then one leading
space removed.

Importing this module imports neither seqio nor TensorFlow (``seqio_tasks.HfVocabulary``
puts an HfTokenizer in a SeqIO pipeline).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sentencepiece
import tokenizers

TOKENIZER_JSON = "tokenizer.json"
SENTENCEPIECE_MODEL = "tokenizer.model"
T5_SENTENCEPIECE_MODEL = "spiece.model"  # T5's name for it.
SENTENCEPIECE_MODELS = (SENTENCEPIECE_MODEL, T5_SENTENCEPIECE_MODEL)
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# The files ``save`` copies: the tokenizer and the files naming its special tokens.
CHAT_TEMPLATE = "chat_template.jinja"  # transformers 5 keeps the chat template here.
TOKENIZER_FILES = (
    TOKENIZER_JSON,
    *SENTENCEPIECE_MODELS,
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS_MAP,
    CHAT_TEMPLATE,
)
# Model files whose ``*_token_id`` name a special token the tokenizer files do not mention.
ID_FILES = ("generation_config.json", "config.json")

_NAMES = ("bos", "eos", "pad", "unk")
_SPACE = "▁"  # SentencePiece's space.
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_PREFIX = "abcdef"  # Text before a token when decoding it alone (as StopStringCriteria).
_FIX = "copy the tokenizer files from the model's Hugging Face repository again"


class TokenizerError(ValueError):
    """A model directory's tokenizer is missing or malformed (a one-line message)."""


@dataclasses.dataclass(frozen=True)
class _Settings:
    """What a directory's JSON files say about its tokenizer.

    Attributes:
      tokens: special token name ('bos', ...) -> its string, or None where a file says
        null; names no tokenizer file mentions are absent.
      extra: the other special tokens tokenizer_config.json lists (``extra_special_tokens``,
        ``additional_special_tokens``).
      fallback_ids: name -> id, from generation_config.json / config.json.
      add_bos, add_eos: tokenizer_config.json's ``add_bos_token`` / ``add_eos_token``
        (None: not set; for tokenizer.model).
      legacy, add_prefix_space: tokenizer_config.json's (for tokenizer.model).
      has_config: whether there is a tokenizer_config.json.
      added: tokenizer_config.json's ``added_tokens_decoder``: id -> (content, special).
      extra_ids: T5's ``extra_ids`` (its sentinels ``<extra_id_0>``... after the
        SentencePiece vocabulary, counting down from the last id; 0: not a T5 tokenizer).
    """

    tokens: dict[str, str | None]
    extra: tuple[str, ...]
    fallback_ids: dict[str, int]
    add_bos: bool | None
    add_eos: bool | None
    legacy: bool
    add_prefix_space: bool
    added: dict[int, tuple[str, bool]]
    has_config: bool
    extra_ids: int = 0


def _read_json(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` ({} if there is no such file)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerError(
            f"{path} is not JSON ({e.msg}: line {e.lineno} column {e.colno}); {_FIX}."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path} cannot be read ({e}); {_FIX}.") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path} holds a JSON {type(value).__name__}, not an object; {_FIX}.")
    return value


def _content(value: Any, where: str) -> str | None:
    """A token as tokenizer_config.json writes it (a string, {'content': ...} or null)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{where} is {value!r}, not a token string or {{'content': ...}}; {_FIX}.")


def _sentinels_last(extra: tuple[str, ...], extra_ids: int) -> tuple[str, ...]:
    """T5's sentinels count down from the last id (``<extra_id_0>`` is the vocabulary's
    last): added after the other extra tokens, ``<extra_id_{N-1}>`` first."""
    if not extra_ids:
        return extra
    sentinels = [f"<extra_id_{i}>" for i in reversed(range(extra_ids))]
    return (*(t for t in extra if t not in sentinels), *sentinels)


def _read_settings(directory: str) -> _Settings:
    config_path = os.path.join(directory, TOKENIZER_CONFIG)
    config = _read_json(config_path)
    special_map = _read_json(os.path.join(directory, SPECIAL_TOKENS_MAP))
    # transformers reads special_tokens_map.json only beside a tokenizer_config.json
    # without added_tokens_decoder (saved by older versions), and then it wins.
    old = "added_tokens_decoder" not in config
    merged = {**config, **special_map} if old else {**special_map, **config}
    tokens = {}
    for name in _NAMES:
        key = f"{name}_token"
        if key in merged:
            mapped = key in special_map and (old or key not in config)
            where = f"{os.path.join(directory, SPECIAL_TOKENS_MAP if mapped else TOKENIZER_CONFIG)}"
            tokens[name] = _content(merged[key], f"{where}: {key}")
    extra = []
    for key in ("extra_special_tokens", "additional_special_tokens"):
        listed = config.get(key) or []
        for token in listed.values() if isinstance(listed, Mapping) else listed:
            extra.append(_content(token, f"{config_path}: {key}"))
    fallback_ids: dict[str, int] = {}
    for file in ID_FILES:
        model_config = _read_json(os.path.join(directory, file))
        for name in _NAMES:
            value = model_config.get(f"{name}_token_id")
            value = value[0] if isinstance(value, list) and value else value
            if isinstance(value, int) and not isinstance(value, bool):
                fallback_ids.setdefault(name, value)
    added: dict[int, tuple[str, bool]] = {}
    for key, token in (config.get("added_tokens_decoder") or {}).items():
        where = f"{config_path}: added_tokens_decoder[{key!r}]"
        if not str(key).isdigit():
            raise TokenizerError(f"{where}: {key!r} is not a token id; {_FIX}.")
        special = bool(token.get("special", False)) if isinstance(token, Mapping) else False
        added[int(key)] = (_content(token, where) or "", special)
    flags = {}
    for key in ("add_bos_token", "add_eos_token", "legacy", "add_prefix_space"):
        value = config.get(key)
        if value is not None and not isinstance(value, bool):
            raise TokenizerError(f"{config_path}: {key} is {value!r}, not true or false; {_FIX}.")
        flags[key] = value
    extra_ids = config.get("extra_ids") or 0
    return _Settings(
        tokens=tokens,
        extra=_sentinels_last(tuple(t for t in extra if t), extra_ids),
        extra_ids=extra_ids,
        fallback_ids=fallback_ids,
        add_bos=flags["add_bos_token"],
        add_eos=flags["add_eos_token"],
        legacy=bool(flags["legacy"]),  # LlamaTokenizer's default: False.
        add_prefix_space=flags["add_prefix_space"] is not False,
        added=added,
        has_config=os.path.exists(config_path),
    )


class _JsonBackend:
    """``tokenizer.json`` through the ``tokenizers`` library."""

    def __init__(self, path: str):
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # tokenizers raises plain Exceptions.  # noqa: BLE001
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise TokenizerError(f"{path} is not a tokenizers file ({why}); {_FIX}.") from None

    def default_token(self, name: str) -> str | None:
        del name
        return None

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def add_special(self, token: str) -> int:
        self._tok.add_special_tokens([tokenizers.AddedToken(token, special=True)])
        return self._tok.token_to_id(token)

    def set_special(self, tokens: Mapping[str, tuple[str, int] | None], s: _Settings) -> None:
        """Nothing: the file's post-processor adds what it adds (transformers 5 ignores
        add_bos_token / add_eos_token beside a tokenizer.json)."""
        del tokens, s

    def encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [e.ids for e in encodings]

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_bytes(self, skip_special_tokens: bool) -> list[bytes]:
        """Each id's bytes in the decoded text, as transformers' StopStringCriteria reads
        them: through GPT-2's byte table where the decoder is ByteLevel, ``<0xNN>`` as that
        byte where it has ByteFallback, else the decoder's text for the token after a prefix
        (so no leading-space rule applies)."""
        modes = _decoder_types(self._tok.decoder)
        table = _unicode_to_byte() if "ByteLevel" in modes else {}
        byte_pieces = "ByteFallback" in modes
        prefix = [
            self._tok.id_to_token(i)
            for i in self._tok.encode(_PREFIX, add_special_tokens=False).ids
        ]
        special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        vocab = self._tok.get_vocab(with_added_tokens=True)
        out = [b""] * max(self.vocab_size, *(i + 1 for i in vocab.values()))
        for token, i in vocab.items():
            if skip_special_tokens and i in special:
                continue
            byte = _BYTE_PIECE.fullmatch(token) if byte_pieces else None
            if byte:
                out[i] = bytes([int(byte.group(1), 16)])
            elif table and all(c in table for c in token):
                out[i] = bytes(table[c] for c in token)
            elif self._tok.decoder is None:
                out[i] = token.encode("utf-8")
            else:
                text = self._tok.decoder.decode([*prefix, token])
                out[i] = text[text.find(_PREFIX) + len(_PREFIX) :].encode("utf-8")
        return out


class _SentencePieceBackend:
    """``tokenizer.model`` through ``sentencepiece``, as transformers 5 reads it (module
    docstring)."""

    def __init__(self, path: str, s: _Settings):
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            with open(path, "rb") as f:
                proto = f.read()
            if not proto:
                raise RuntimeError("empty file")
            self._sp.LoadFromSerializedProto(proto)
            self._bpe = sentencepiece.SentencePieceProcessor()
            plain, self._dummy_prefix = _without_normalizer(proto)
            self._bpe.LoadFromSerializedProto(plain)
        except Exception as e:  # RuntimeError, OSError, protobuf's DecodeError.  # noqa: BLE001
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise TokenizerError(f"{path} is not a SentencePiece model ({why}); {_FIX}.") from None
        self._pieces = self._sp.get_piece_size()
        self._added = {content: i for i, (content, _) in s.added.items() if content}
        self._text_of = {i: content for i, (content, _) in s.added.items() if content}
        self._special = {i for i, (_, special) in s.added.items() if special}
        self._prepend = "never" if not s.add_prefix_space else "always" if s.legacy else "first"
        if not s.has_config or s.extra_ids:  # Not a LlamaTokenizer (T5's, or none said):
            self._prepend = "model"  # transformers follows the model's own settings.
        elif not self._dummy_prefix:  # Gemma's model adds no "▁" before the text; nor does HF.
            self._prepend = "never"
        self._pattern: re.Pattern | None = None
        self._bos: int | None = None
        self._eos: int | None = None

    def default_token(self, name: str) -> str | None:
        i = {"bos": self._sp.bos_id, "eos": self._sp.eos_id, "pad": self._sp.pad_id}.get(
            name, self._sp.unk_id
        )()
        return self._sp.id_to_piece(i) if 0 <= i < self._pieces else None

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        i = self._sp.piece_to_id(token)
        return i if self._sp.id_to_piece(i) == token else None

    def add_special(self, token: str) -> int:
        i = self.vocab_size
        self._added[token], self._text_of[i] = i, token
        return i

    def set_special(self, tokens: Mapping[str, tuple[str, int] | None], s: _Settings) -> None:
        """Special tokens (named or extra) are tokens in the text and skipped by ``decode``;
        BOS and EOS are added as add_bos_token (default True) / add_eos_token (default False)
        say."""
        named = [t for t in tokens.values() if t]
        self._special |= {i for _, i in named}
        strings = sorted({t for t, _ in named} | set(self._added), key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        bos, eos = tokens["bos"], tokens["eos"]
        self._bos = bos[1] if bos and s.add_bos is not False else None
        add_eos = s.add_eos if s.add_eos is not None else bool(s.extra_ids)  # T5 appends EOS.
        self._eos = eos[1] if eos and add_eos else None

    def encode(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return [self._encode(text, add_special_tokens) for text in texts]

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = [self._bos] if add_special_tokens and self._bos is not None else []
        start = 0
        for match in self._pattern.finditer(text) if self._pattern else ():
            self._encode_piece(text[start : match.start()], start, ids)
            ids.append(self.token_to_id(match.group()))
            start = match.end()
        self._encode_piece(text[start:], start, ids)
        return ids + ([self._eos] if add_special_tokens and self._eos is not None else [])

    def _encode_piece(self, text: str, offset: int, ids: list[int]) -> None:
        """Appends the ids of a stretch of text between special tokens (at ``offset``)."""
        if not text:
            return
        if self._prepend == "model":
            ids.extend(self._sp.encode(text))
            return
        text = text.replace(" ", _SPACE)
        first = self._prepend == "always" or (self._prepend == "first" and offset == 0)
        if first and not text.startswith(_SPACE):
            text = _SPACE + text
        ids.extend(self._bpe.encode(text))

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        parts: list[str] = []
        run = bytearray()  # Consecutive <0xNN> pieces.
        for i in ids:
            if i in self._text_of:
                piece = self._text_of[i]
            elif 0 <= i < self._pieces:
                piece = self._sp.id_to_piece(i)
            else:
                continue  # As transformers: ids past the vocabulary decode to nothing.
            if skip_special_tokens and i in self._special:
                continue
            byte = (
                _BYTE_PIECE.fullmatch(piece) if i < self._pieces and self._sp.is_byte(i) else None
            )
            if byte:
                run.append(int(byte.group(1), 16))
                continue
            parts.append(_bytes_text(run))
            run.clear()
            parts.append(piece.replace(_SPACE, " "))
        text = "".join(parts) + _bytes_text(run)
        strip = self._dummy_prefix if self._prepend == "model" else self._prepend != "never"
        return text[1:] if strip and text.startswith(" ") else text

    @property
    def vocab_size(self) -> int:
        return max([self._pieces - 1, *self._text_of]) + 1

    def token_bytes(self, skip_special_tokens: bool) -> list[bytes]:
        """Each id's bytes in ``decode``'s text before its leading space is removed."""
        out = [b""] * self.vocab_size
        for i in range(len(out)):
            if skip_special_tokens and i in self._special:
                continue
            if i in self._text_of or i < self._pieces:
                piece = self._text_of.get(i) or self._sp.id_to_piece(i)
                byte = i not in self._text_of and self._sp.is_byte(i)
                byte = _BYTE_PIECE.fullmatch(piece) if byte else None
                text = piece.replace(_SPACE, " ").encode("utf-8")
                out[i] = bytes([int(byte.group(1), 16)]) if byte else text
        return out


def _without_normalizer(proto: bytes) -> tuple[bytes, bool]:
    """The SentencePiece model ``proto`` with no normalization and no "▁" prefix; whether
    ``proto`` adds that prefix."""
    from sentencepiece import sentencepiece_model_pb2  # (protobuf: only for tokenizer.model.)

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    spec = model.normalizer_spec
    dummy_prefix = spec.add_dummy_prefix
    spec.name, spec.precompiled_charsmap = "identity", b""
    spec.add_dummy_prefix = spec.remove_extra_whitespaces = False
    return model.SerializeToString(), dummy_prefix


def _bytes_text(run: bytearray) -> str:
    """transformers' ByteFallback: UTF-8 bytes as text; invalid ones as one U+FFFD each."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def _decoder_types(decoder: Any) -> set[str]:
    """The ``type`` names in a tokenizers decoder's JSON (a Sequence's members too)."""
    state = json.loads(decoder.__getstate__()) if decoder is not None else {}
    found, stack = set(), [state]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            found.add(value.get("type"))
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte -> the byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + n): b for n, b in enumerate(moved)}


class HfTokenizer:
    """A Hugging Face model directory's tokenizer (see the module docstring).

    Attributes:
      directory: the model directory it was read from.
      files: the tokenizer files it was read from (``save`` copies them).
      bos_token_id, eos_token_id, pad_token_id: the special tokens' ids (None: none).
    """

    def __init__(
        self,
        backend: _JsonBackend | _SentencePieceBackend,
        *,
        directory: str,
        files: Sequence[str],
        ids: Mapping[str, int | None],
    ):
        self._backend = backend
        self.directory, self.files = directory, tuple(files)
        self.bos_token_id = ids.get("bos")
        self.eos_token_id = ids.get("eos")
        self.pad_token_id = ids.get("pad")

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> HfTokenizer:
        """Reads ``tokenizer.json`` (preferred) or ``tokenizer.model`` and the files naming
        the special tokens; raises TokenizerError if there is none or one is malformed."""
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise TokenizerError(
                f"{directory} is not a directory; point at a Hugging Face model directory "
                "(with tokenizer.json or tokenizer.model)."
            )
        settings = _read_settings(directory)
        json_path = os.path.join(directory, TOKENIZER_JSON)
        spm_path = next(
            (
                p
                for name in SENTENCEPIECE_MODELS
                if os.path.exists(p := os.path.join(directory, name))
            ),
            os.path.join(directory, SENTENCEPIECE_MODEL),
        )
        if os.path.exists(json_path):
            backend: _JsonBackend | _SentencePieceBackend = _JsonBackend(json_path)
        elif os.path.exists(spm_path):
            backend = _SentencePieceBackend(spm_path, settings)
        else:
            raise TokenizerError(
                f"{directory} has no {TOKENIZER_JSON} or {SENTENCEPIECE_MODEL}; copy the "
                "model's tokenizer files (with tokenizer_config.json) from its Hugging Face "
                "repository there."
            )
        # Name ('bos', ..., or 'extra: TOKEN') -> (token, id); tokens not in the
        # vocabulary are added after it, as transformers adds them.
        tokens: dict[str, tuple[str, int] | None] = {}
        named = {name: settings.tokens.get(name, backend.default_token(name)) for name in _NAMES}
        for name, token in {**named, **{f"extra: {t}": t for t in settings.extra}}.items():
            i = None if token is None else backend.token_to_id(token)
            tokens[name] = (
                None if token is None else (token, backend.add_special(token) if i is None else i)
            )
        backend.set_special(tokens, settings)
        ids = {name: t[1] if t else None for name, t in tokens.items()}
        for name, i in settings.fallback_ids.items():
            if name not in settings.tokens and ids[name] is None:
                ids[name] = i
        files = [f for f in TOKENIZER_FILES if os.path.exists(os.path.join(directory, f))]
        return cls(backend, directory=directory, files=files, ids=ids)

    def __repr__(self) -> str:
        return (
            f"HfTokenizer({self.directory!r}, vocab_size={self.vocab_size}, bos={self.bos_token_id}"
            f", eos={self.eos_token_id}, pad={self.pad_token_id})"
        )

    @property
    def vocab_size(self) -> int:
        """Ids it can produce: the vocabulary and the added tokens (transformers' ``len()``)."""
        return self._backend.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text``'s ids: transformers' ``tokenizer(text).input_ids`` (module docstring)."""
        return self._backend.encode([text], add_special_tokens)[0]

    def encode_batch(
        self, texts: Iterable[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (in parallel for tokenizer.json)."""
        return self._backend.encode(list(texts), add_special_tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; special tokens are left out unless ``skip_special_tokens`` is
        False (transformers' default is False)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens)

    def decode_batch(
        self, rows: Iterable[Iterable[int]], skip_special_tokens: bool = True
    ) -> list[str]:
        return [self.decode(row, skip_special_tokens) for row in rows]

    def token_bytes(self, skip_special_tokens: bool = False) -> list[bytes]:
        """Each id's contribution to the decoded text, as bytes ([vocab_size]): a byte piece
        is one byte (maybe part of a character), "▁" is a space, a special token is its
        text (b"" with ``skip_special_tokens``), an id without a token b"". Joined, they
        are the UTF-8 of ``decode(ids, skip_special_tokens)`` where that is valid text,
        except that SentencePiece-style decoding removes one leading space there. These are
        transformers' StopStringCriteria's per-token strings (its ``clean_tokenizer_vocab``).
        """
        return self._backend.token_bytes(skip_special_tokens)

    def save(self, directory: str | os.PathLike) -> list[str]:
        """Copies the tokenizer files it was read from into ``directory``; their paths.

        Special token ids that only generation_config.json / config.json gave are the
        model's files, not copied.
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name in self.files:
            source, target = os.path.join(self.directory, name), os.path.join(directory, name)
            if not (os.path.exists(target) and os.path.samefile(source, target)):
                shutil.copyfile(source, target)
            paths.append(target)
        return paths
