"""Stop strings: ``advance`` against a brute-force reference on random byte vocabularies and
token sequences; ``token_bytes`` of the fixture tokenizers against their ``decode``; errors."""

from __future__ import annotations

import json
import pathlib
import random
import shutil

import jax
import numpy as np
import pytest

from praxis_lite.decoding import stop_strings
from praxis_lite.decoding.stop_strings import StopStrings
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tests import FIXTURES as TEST_FIXTURES

FIXTURES = TEST_FIXTURES / "hf"
# Overlapping prefixes ("abab"), one byte, the 31-byte limit, a two-byte character.
STRINGS = ["abab", "cca", "~", "aab" * 10 + "c", "é"]
ALPHABET = b"abc\xc3\xa9"  # Random bytes; "~" comes only from the strings' pieces.


def random_vocab(rng: random.Random, size: int) -> list[bytes]:
    """Every single byte, empty tokens, random short tokens, pieces of the stop strings
    (prefixes, suffixes, middles), tokens longer than a string or holding a whole one."""
    vocab = [bytes([b]) for b in ALPHABET] + [b"~", b"", b""]
    encoded = [s.encode() for s in STRINGS]
    while len(vocab) < size:
        s = rng.choice(encoded)
        i, j = sorted(rng.sample(range(len(s) + 1), 2))
        noise = bytes(rng.choice(ALPHABET) for _ in range(rng.randrange(3)))
        vocab.append(
            rng.choice(
                [
                    s[i:j],
                    s[i:j] + noise,
                    noise + s[i:j],
                    noise + s + noise,
                    bytes(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 12))),
                ]
            )
        )
    return vocab


def random_sequence(rng: random.Random, vocab: list[bytes], steps: int) -> list[int]:
    """Token ids: uniform, or a random tokenization of text holding a stop string (with
    empty tokens and out-of-vocabulary ids, which add nothing, between)."""
    if rng.random() < 0.5:
        return [rng.randrange(-1, len(vocab) + 1) for _ in range(steps)]
    noise = bytes(rng.choice(ALPHABET) for _ in range(rng.randrange(8)))
    text, ids = noise + rng.choice(STRINGS).encode() + noise, []
    while text and len(ids) < steps:
        if rng.random() < 0.1:
            ids.append(rng.choice([1 << 20, -5, vocab.index(b"")]))
            continue
        i = rng.choice([i for i, t in enumerate(vocab) if t and text.startswith(t)])
        ids.append(i)
        text = text[len(vocab[i]) :]
    return (ids + [0] * steps)[:steps]


def reference(vocab: list[bytes], ids: list[int]) -> tuple[list[bool], list[list[int]]]:
    """Per step: whether an occurrence of a stop string ends in the new token's bytes, and
    each string's prefixes the text ends with (as state bits)."""
    text, hits, states = b"", [], []
    for i in ids:
        start = len(text)
        text += vocab[i] if 0 <= i < len(vocab) else b""
        hits.append(any(s.encode() in text[max(0, start - len(s.encode()) + 1) :] for s in STRINGS))
        states.append(
            [
                sum(1 << j for j in range(1, len(s.encode())) if text.endswith(s.encode()[:j]))
                for s in STRINGS
            ]
        )
    return hits, states


def first_true(flags) -> int | None:
    """The index of the first True in ``flags`` (None: none)."""
    return next((k for k, flag in enumerate(flags) if flag), None)


def _scan(table: StopStrings, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """ids [B, T] -> (hit [T, B], state [T, B, S]) of ``advance`` step by step."""

    def step(state, tokens):
        state, hit = stop_strings.advance(table, state, tokens)
        return state, (hit, state)

    return jax.lax.scan(step, stop_strings.init_state(table, ids.shape[0]), ids.T)[1]


_scan_jit = jax.jit(_scan)  # The tables an argument.


def run(table: StopStrings, ids: np.ndarray, closed: bool = False) -> tuple[np.ndarray, ...]:
    """``_scan`` jitted, with the tables an argument or (``closed``) constants."""
    hits, states = jax.jit(lambda x: _scan(table, x))(ids) if closed else _scan_jit(table, ids)
    return np.asarray(hits), np.asarray(states)


@pytest.mark.parametrize("seed, closed", [(0, True), (1, False)])
def test_advance_matches_brute_force(seed, closed):
    """Every step's hit and state as the concatenated bytes say; so the first hit is the
    first step whose text holds a stop string."""
    rng = random.Random(seed)
    vocab = random_vocab(rng, 120)
    table = StopStrings.build(STRINGS, vocab)
    ids = [random_sequence(rng, vocab, 24) for _ in range(300)]
    hits, states = run(table, np.array(ids, np.int32), closed)
    for row, seq in enumerate(ids):
        want_hits, want_states = reference(vocab, seq)
        assert hits[:, row].tolist() == want_hits, seq
        assert states[:, row].tolist() == want_states, seq
        texts = [b"".join(vocab[i] for i in seq[: k + 1] if 0 <= i < len(vocab)) for k in range(24)]
        holds = [any(s.encode() in text for s in STRINGS) for text in texts]
        assert first_true(hits[:, row]) == first_true(holds), seq
    assert 0.05 < hits.mean() < 0.95  # Both kinds of steps were there.


def test_table_shapes_and_first_hit():
    vocab = [b"", b"ab", b"a", b"b", b"bab"]
    table = StopStrings.build(["abab", "x"], vocab)
    assert table.continues.shape == table.completes.shape == table.fresh.shape == (2, 5)
    assert table.lengths.tolist() == [0, 2, 1, 1, 3]
    hits, _ = run(table, np.array([[2, 0, 3, 1, 4, 1]]))  # "a" "" "b" "ab" "bab" "ab"
    assert hits[:, 0].tolist() == [False, False, False, True, False, True]  # "abab" at 0, 5.


def fixture_tokenizers(tmp_path: pathlib.Path) -> list[tuple[str, HfTokenizer, dict]]:
    """(name, tokenizer, cases): the tokenizer.json fixtures, and llama2's and gemma's
    tokenizer.model read alone."""
    out = []
    for name in ("llama3", "gpt2", "qwen2", "mistral", "gemma", "llama2", "t5_flan"):
        cases = json.loads((FIXTURES / name / "tokenizer_cases.json").read_text())
        out.append((name, HfTokenizer.from_dir(FIXTURES / name), cases))
        if name in ("llama2", "gemma"):
            directory = tmp_path / name
            directory.mkdir()
            for path in (FIXTURES / name).glob("*"):
                if path.suffix in (".model", ".json") and path.name != "tokenizer.json":
                    shutil.copyfile(path, directory / path.name)
            out.append((f"{name}.model", HfTokenizer.from_dir(directory), cases))
    return out


# Fixtures whose decode removes one leading space (SentencePiece's rule; token_bytes keep it).
STRIPS_A_SPACE = {"llama2", "llama2.model", "t5_flan"}


def test_token_bytes_join_to_the_decoded_text(tmp_path):
    """For each case's ids (with and without special tokens): the joined token bytes, as
    UTF-8, are ``decode(ids, skip_special_tokens)``; where that decode removes one leading
    space (STRIPS_A_SPACE), they are that space and the decoded text."""
    for name, tok, cases in fixture_tokenizers(tmp_path):
        for skip in (False, True):
            pieces = stop_strings.token_bytes(tok, skip_special_tokens=skip)
            assert len(pieces) == tok.vocab_size, name
            for case in cases["cases"]:
                for ids in (case["ids"], case["ids_no_special"]):
                    text = b"".join(pieces[i] for i in ids).decode("utf-8")
                    decoded = tok.decode(ids, skip_special_tokens=skip)
                    if name in STRIPS_A_SPACE and text.startswith(" "):
                        text = text[1:]
                    assert text == decoded, (name, skip, case["text"])
                    if ids is case["ids_no_special"] and not skip:
                        assert text == case["decoded"], (name, case["text"])


def test_stops_on_any_tokenization_of_fixture_text(tmp_path):
    """A word of a fixture text is caught at the token that completes it, however the
    tokenizer split it (byte-level BPE, byte fallback, SentencePiece pieces)."""
    words = [w.encode() for w in ("café", "fox", " mill")]
    for name, tok, cases in fixture_tokenizers(tmp_path):
        pieces, checked = stop_strings.token_bytes(tok), 0
        # Padded to one shape for all fixtures (one compilation): empty tokens, ids -1.
        table = StopStrings.build(["café", "fox", " mill"], pieces + [b""] * (400 - len(pieces)))
        rows = [case["ids_no_special"] for case in cases["cases"]]
        all_hits = run(table, np.array([row + [-1] * (64 - len(row)) for row in rows]))[0]
        for case, ids, row_hits in zip(cases["cases"], rows, all_hits.T, strict=True):
            hits = row_hits[: len(ids)]
            texts = [b"".join(pieces[i] for i in ids[: k + 1]) for k in range(len(ids))]
            holds = [any(w in text for w in words) for text in texts]
            assert first_true(hits) == first_true(holds), (name, case["text"])
            checked += any(holds)
        assert checked, name


@pytest.mark.parametrize(
    "strings, match",
    [
        ([""], "a stop string is empty"),
        (["x" * 32], "is 32 bytes in UTF-8; at most 31"),
        (["é" * 16], "is 32 bytes in UTF-8; at most 31"),
        ("stop", "must be a list of strings"),
    ],
)
def test_errors_are_one_line(strings, match):
    with pytest.raises(ValueError, match=match) as e:
        StopStrings.build(strings, [b"a"])
    assert "\n" not in str(e.value)
