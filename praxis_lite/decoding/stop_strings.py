"""Stop strings checked inside a jitted decode loop, one token at a time, exactly.

Hugging Face ``generate(stop_strings=...)`` stops a row once its generated text contains one
of the strings, however the model happened to tokenize it ("Texas" as "Tex"+"as", "T"+"exas"
or inside " Texas,"). This module does the same in JAX: a row's state says which prefixes of
each stop string its text now ends with, and each step updates it from the new token alone.

Matching is over bytes: every token id has the bytes it adds to the decoded text
(``token_bytes(tokenizer)``: a byte-fallback piece ``<0x..>`` is one byte, possibly part of a
character), and a stop string is its UTF-8 bytes (at most 31, so a row's state for a string is
one int32 bitmask). For a stop string ``s`` of ``L`` bytes, bit ``j`` (1 <= j < L) of the state
is set when the text ends with ``s[:j]``. Per token ``t`` (its bytes), precomputed on the host:

  - ``continues[t]``: bit j when ``s[j:j+len(t)] == t`` and ``j + len(t) < L``: a text ending
    with ``s[:j]`` then ends with ``s[:j+len(t)]``;
  - ``completes[t]``: bit 0 when ``s in t``, bit j >= 1 when ``t.startswith(s[j:])``: a text
    ending with ``s[:j]`` then contains ``s``;
  - ``fresh[t]``: bit k (1 <= k < L) when ``t`` ends with ``s[:k]``.

A step, with ``m = state | 1`` (every text ends with the empty prefix, bit 0):
``hit = m & completes[t] != 0`` and ``state' = ((m & continues[t]) << len(t) | fresh[t]) & ~1``.
An empty token (a special token decoded as nothing) leaves the state as it was and hits
nothing; so does an id outside the vocabulary (a model's padded embedding rows), which decodes
to nothing. ``hit`` is True at the step whose token ends a new occurrence; the state stays exact
after it (a caller that keeps decoding a finished row gets further hits, not wrong ones).

Where this differs from transformers' StopStringCriteria (whose per-token strings
``token_bytes`` follows):
  - only the generated text is matched: the state starts empty, where transformers also
    matches a stop string that begins in the prompt and ends in the generated tokens (run the
    prompt's tokens through ``advance`` and ignore its hits to get that);
  - transformers looks at the last ``max(len(s))`` tokens only, so an empty token among them
    can hide a match; here empty tokens are transparent.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

MAX_STOP_BYTES = 31  # A string's prefixes are the bits of one int32 (bit 31: the sign).


class _Vocab(NamedTuple):
    """The token bytes, indexed for the lookups ``build`` makes.

    Attributes:
      tokens: each id's bytes, [V].
      ids_of: bytes -> the ids with exactly those bytes.
      forward, forward_ids: the token bytes sorted, and their ids.
      backward, backward_ids: the reversed token bytes sorted, and their ids.
    """

    tokens: Sequence[bytes]
    ids_of: dict[bytes, list[int]]
    forward: list[bytes]
    forward_ids: np.ndarray
    backward: list[bytes]
    backward_ids: np.ndarray


def _index(tokens: Sequence[bytes]) -> _Vocab:
    """``tokens`` [V] indexed by content, by prefix and by suffix."""
    ids_of: dict[bytes, list[int]] = {}
    for i, t in enumerate(tokens):
        ids_of.setdefault(t, []).append(i)
    forward_ids = np.array(sorted(range(len(tokens)), key=tokens.__getitem__), np.int64)
    backward_ids = np.array(sorted(range(len(tokens)), key=lambda i: tokens[i][::-1]), np.int64)
    return _Vocab(
        tokens=tokens,
        ids_of=ids_of,
        forward=[tokens[i] for i in forward_ids],
        forward_ids=forward_ids,
        backward=[tokens[i][::-1] for i in backward_ids],
        backward_ids=backward_ids,
    )


def _starting_with(keys: list[bytes], ids: np.ndarray, prefix: bytes) -> np.ndarray:
    """The ids whose key (``keys`` sorted, ``ids`` alongside) starts with ``prefix`` (non-empty)."""
    lo = bisect.bisect_left(keys, prefix)
    head = prefix.rstrip(b"\xff")  # The least string after every one starting with prefix.
    hi = bisect.bisect_left(keys, head[:-1] + bytes([head[-1] + 1])) if head else len(keys)
    return ids[lo:hi]


def _tables(s: bytes, vocab: _Vocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stop string's ``continues``, ``completes``, ``fresh`` bitmasks, each [V] int32."""
    size = len(vocab.tokens)
    continues, completes, fresh = (np.zeros(size, np.int32) for _ in range(3))
    completes[[i for i, t in enumerate(vocab.tokens) if s in t]] |= 1
    for j in range(1, len(s)):
        bit = np.int32(1 << j)
        for end in range(j, len(s)):  # Tokens s[j:end], the empty one included.
            continues[vocab.ids_of.get(s[j:end], [])] |= bit
        completes[_starting_with(vocab.forward, vocab.forward_ids, s[j:])] |= bit
        fresh[_starting_with(vocab.backward, vocab.backward_ids, s[:j][::-1])] |= bit
    return continues, completes, fresh


def _encoded(strings: Sequence[str]) -> list[bytes]:
    """The stop strings' UTF-8; ValueError for an empty one or one over MAX_STOP_BYTES."""
    if isinstance(strings, str):
        raise ValueError(f"stop strings must be a list of strings, not the string {strings!r}.")
    out = []
    for s in strings:
        b = s.encode("utf-8")
        if not b:
            raise ValueError("a stop string is empty; give non-empty stop strings.")
        if len(b) > MAX_STOP_BYTES:
            raise ValueError(
                f"stop string {s!r} is {len(b)} bytes in UTF-8; at most {MAX_STOP_BYTES} are "
                "supported."
            )
        out.append(b)
    return out


class StopStrings(NamedTuple):
    """Per-token tables of S stop strings over a vocabulary of V tokens (module docstring).

    A NamedTuple of arrays, so a pytree: close over it in a jitted function (its arrays
    become constants) or pass it in.

    Attributes:
      continues, completes, fresh: [S, V] int32 bitmasks over the prefixes of each string.
      lengths: [V] int32, each token's length in bytes.
    """

    continues: np.ndarray
    completes: np.ndarray
    fresh: np.ndarray
    lengths: np.ndarray

    @classmethod
    def build(cls, strings: Sequence[str], token_bytes: Sequence[bytes]) -> StopStrings:
        """The tables of ``strings`` (S, each 1 to 31 bytes in UTF-8; ValueError otherwise)
        for a vocabulary whose id i decodes to ``token_bytes[i]`` ([V])."""
        encoded = _encoded(strings)
        vocab = _index(list(token_bytes))
        size = len(vocab.tokens)
        tables = [_tables(s, vocab) for s in encoded]
        stacked = [
            np.stack([t[k] for t in tables]) if tables else np.zeros((0, size), np.int32)
            for k in range(3)
        ]
        lengths = np.array([len(t) for t in vocab.tokens], np.int32)
        return cls(*stacked, lengths=lengths)


def init_state(table: StopStrings, batch: int) -> jax.Array:
    """The state of rows that have generated nothing yet: [B, S] int32 zeros."""
    return jnp.zeros((batch, table.continues.shape[0]), jnp.int32)


def advance(table: StopStrings, state: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Appends one token per row: state [B, S] int32, tokens [B] int ->
    (state [B, S] int32, hit [B] bool: the token ends an occurrence of some stop string).

    Ids outside [0, V) are empty tokens. Jit-friendly; ``table`` may hold numpy or jax arrays.
    """
    size = table.lengths.shape[0]
    inside = (tokens >= 0) & (tokens < size)
    ids = jnp.where(inside, tokens, 0)
    row = inside[:, None]
    continues = jnp.where(row, jnp.asarray(table.continues)[:, ids].T, -1)
    completes = jnp.where(row, jnp.asarray(table.completes)[:, ids].T, 0)
    fresh = jnp.where(row, jnp.asarray(table.fresh)[:, ids].T, 0)
    # continues is 0 for tokens of >= 31 bytes; the clip keeps the shift defined.
    shift = jnp.minimum(jnp.where(inside, jnp.asarray(table.lengths)[ids], 0), MAX_STOP_BYTES)
    matched = state | 1
    hit = jnp.any((matched & completes) != 0, axis=-1)
    state = (((matched & continues) << shift[:, None]) | fresh) & ~1
    return state.astype(jnp.int32), hit


class _HasTokenBytes(Protocol):
    def token_bytes(self, skip_special_tokens: bool = False) -> list[bytes]: ...


def token_bytes(tokenizer: _HasTokenBytes, skip_special_tokens: bool = False) -> list[bytes]:
    """Each id's bytes in the decoded text ([vocab_size]) for ``StopStrings.build``.

    For ``hf_tokenizer.HfTokenizer`` (see its ``token_bytes``): byte-level BPE
    (Llama 3, GPT-2, Qwen, Mistral's tekken) through GPT-2's byte table, ``<0xNN>`` pieces as
    that byte, "▁" as a space, special tokens as their text as transformers' StopStringCriteria
    has them (so "<|eot_id|>" can be a stop string), or as b"" with ``skip_special_tokens``.
    """
    return tokenizer.token_bytes(skip_special_tokens)


def sentencepiece_bytes(processor: Any, vocab_size: int) -> list[bytes]:
    """Each id's bytes under a SentencePiece model (``sentencepiece.SentencePieceProcessor``,
    e.g. seqio's ``SentencePieceVocabulary.tokenizer``): "▁" as a space, byte pieces as
    their byte, control and unknown pieces and ids past the model (T5's extra ids) b""."""
    out = [b""] * vocab_size
    for i in range(min(vocab_size, processor.get_piece_size())):
        if processor.is_control(i) or processor.is_unknown(i):
            continue
        piece = processor.id_to_piece(i)
        if processor.is_byte(i):
            out[i] = bytes([int(piece[3:5], 16)])
        else:
            out[i] = piece.replace("\u2581", " ").encode("utf-8")
    return out
