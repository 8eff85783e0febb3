"""HfTokenizer: tokenizer.json and tokenizer.model directories, their special tokens, errors;
and, against transformers' own outputs, the fixtures in tests/fixtures/hf/<family>/."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import sentencepiece as spm
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer, TokenizerError
from tests import REPO

FIXTURES = REPO / "tests" / "fixtures" / "hf"
LINES = ["Hello world!", "wow!! the cat sat on the mat!", "no bang here", "the dog sat on the log."]


def write_bpe_dir(directory: pathlib.Path, *, bos: bool = True, **config) -> str:
    """A GPT-2-like byte-level BPE directory: id 0 is "!"; "<|endoftext|>" is EOS and, with
    ``bos``, "<|bos|>" is BOS, added by the post-processor (as Llama 3's is)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(LINES * 10, trainer)
    tok.add_special_tokens(["<|bos|>", "<|endoftext|>"] if bos else ["<|endoftext|>"])
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))]
        )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"bos_token": "<|bos|>" if bos else None, "eos_token": "<|endoftext|>", **config}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory)


def write_spm_dir(directory: pathlib.Path, **config) -> str:
    """A Llama-2-like SentencePiece directory (BPE, byte fallback, <unk> <s> </s> = 0 1 2)."""
    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(LINES * 5 + ["  spaces\tand tabs", "naïve café 東京"]) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=340,
        model_type="bpe",
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    corpus.unlink()
    (directory / "tokenizer.vocab").unlink()
    llama = {"add_bos_token": True, "add_eos_token": False, "legacy": False}
    llama |= {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps({**llama, **config}))
    return str(directory)


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> str:
    return write_bpe_dir(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory) -> str:
    return write_spm_dir(tmp_path_factory.mktemp("spm"))


def test_import_loads_neither_seqio_nor_tensorflow():
    code = (
        "import praxis_lite, praxis_lite.tokenizers.hf_tokenizer, sys; "
        "assert 'seqio' not in sys.modules and 'tensorflow' not in sys.modules, 'loaded'"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)


def test_tokenizer_json(bpe_dir):
    tok = HfTokenizer.from_dir(bpe_dir)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (292, 293, None)
    assert tok.vocab_size == 294
    ids = tok.encode("wow!! hi !", add_special_tokens=False)
    assert 0 in ids  # "!" is id 0, as in GPT-2.
    assert tok.encode("wow!! hi !") == [292, *ids]  # The post-processor's BOS.
    assert tok.decode(ids) == "wow!! hi !"
    assert tok.decode([292, *ids, 293]) == "wow!! hi !"
    assert (
        tok.decode([292, *ids, 293], skip_special_tokens=False) == "<|bos|>wow!! hi !<|endoftext|>"
    )
    assert tok.encode_batch(["wow!! hi !", ""]) == [[292, *ids], [292]]
    assert tok.decode_batch([ids, []]) == ["wow!! hi !", ""]


def test_tokenizer_json_ignores_add_bos_token_as_transformers_does(tmp_path):
    tok = HfTokenizer.from_dir(write_bpe_dir(tmp_path, add_bos_token=False, add_eos_token=True))
    assert tok.encode("hi") == [tok.bos_token_id, *tok.encode("hi", add_special_tokens=False)]


def test_special_tokens_come_from_the_files(tmp_path):
    """tokenizer_config.json (strings or {'content'}), special_tokens_map.json (wins beside an
    old tokenizer_config.json), then generation_config.json / config.json ids."""
    directory = pathlib.Path(write_bpe_dir(tmp_path, bos=False, pad_token={"content": "<pad>"}))
    tok = HfTokenizer.from_dir(directory)
    assert (tok.bos_token_id, tok.eos_token_id) == (None, 292)
    assert tok.pad_token_id == 293 == tok.vocab_size - 1  # Not in the vocabulary: added.
    (directory / "special_tokens_map.json").write_text(json.dumps({"pad_token": "!"}))
    assert HfTokenizer.from_dir(directory).pad_token_id == 0
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {}}))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": [5, 6]}))
    (directory / "config.json").write_text(json.dumps({"bos_token_id": 7, "eos_token_id": 8}))
    tok = HfTokenizer.from_dir(directory)  # special_tokens_map.json fills in; config ids last.
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (5, 8, 0)
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": None}))
    assert HfTokenizer.from_dir(directory).bos_token_id is None  # null: no BOS, no fallback.


def test_sentencepiece_as_transformers_5_converts_it(spm_dir):
    """Llama's LlamaTokenizer (transformers 5): BOS prepended; special tokens in the text are
    tokens; one "▁" before the text only where it does not start with a space."""
    tok = HfTokenizer.from_dir(spm_dir)
    sp = spm.SentencePieceProcessor(model_file=f"{spm_dir}/tokenizer.model")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, None)
    assert tok.vocab_size == sp.vocab_size() == 340
    for text in ["the cat sat", "naïve 東京 😀", "a\nb  c", "trailing "]:
        assert tok.encode(text) == [1, *sp.encode(text)]  # Raw SentencePiece agrees here.
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode(" the cat", add_special_tokens=False) == sp.encode("the cat")
    assert tok.decode(tok.encode(" the cat")) == "the cat"  # (transformers' too.)
    ids = tok.encode("<s>the</s>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert ids[1:-1] != sp.encode("the")  # No "▁" after a special token (legacy: false).
    assert tok.decode(ids, skip_special_tokens=False) == "<s>the</s>"
    the = sp.encode("the")
    assert tok.decode([1, *the, 2]) == "the"
    assert tok.decode([1, *the, 2], skip_special_tokens=False) == "<s> the</s>"
    assert tok.decode([sp.piece_to_id("<0xE2>"), sp.piece_to_id("<0x82>")]) == "\ufffd\ufffd"


def test_sentencepiece_flags(tmp_path):
    legacy = HfTokenizer.from_dir(write_spm_dir(tmp_path / "a", legacy=True, add_eos_token=True))
    assert legacy.encode("<s>the", False) == [1, *legacy.encode("the", False)]  # "▁the".
    assert legacy.encode("hi")[-1] == 2
    plain = HfTokenizer.from_dir(write_spm_dir(tmp_path / "b", add_bos_token=False))
    assert plain.encode("hi") == plain.encode("hi", False)


def test_save_copies_the_tokenizer_files(bpe_dir, spm_dir, tmp_path):
    for source, name in [(bpe_dir, "tokenizer.json"), (spm_dir, "tokenizer.model")]:
        tok = HfTokenizer.from_dir(source)
        paths = tok.save(tmp_path / name)
        assert sorted(pathlib.Path(p).name for p in paths) == sorted(
            [name, "tokenizer_config.json"]
        )
        copy = HfTokenizer.from_dir(tmp_path / name)
        assert copy.encode("wow!! the cat") == tok.encode("wow!! the cat")
        assert copy.bos_token_id == tok.bos_token_id


@pytest.mark.parametrize(
    "files, match",
    [
        ({}, r"has no tokenizer.json or tokenizer.model; copy"),
        ({"tokenizer.json": "{not json"}, r"tokenizer.json is not a tokenizers file"),
        ({"tokenizer.model": "not a model"}, r"tokenizer.model is not a SentencePiece model"),
        ({"tokenizer.model": ""}, r"tokenizer.model is not a SentencePiece model \(empty"),
        ({"tokenizer_config.json": "{"}, r"tokenizer_config.json is not JSON \(.*line 1"),
        ({"tokenizer_config.json": '{"bos_token": 3}'}, r"bos_token is 3, not a token"),
        ({"tokenizer_config.json": '{"legacy": "no"}'}, r"legacy is 'no', not true or false"),
    ],
)
def test_errors_are_one_line(tmp_path, files, match):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(TokenizerError, match=match) as e:
        HfTokenizer.from_dir(tmp_path)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(TokenizerError, match="is not a directory"):
        HfTokenizer.from_dir(tmp_path / "missing")


FIXTURE_DIRS = sorted(p.parent for p in FIXTURES.glob("*/tokenizer_cases.json"))
# (directory, the tokenizer file read): both where a fixture has tokenizer.json and .model.
SOURCES = [
    (d, name)
    for d in FIXTURE_DIRS
    for name in ("tokenizer.json", "tokenizer.model")
    if (d / name).exists()
]


@pytest.mark.parametrize("directory, source", SOURCES, ids=[f"{d.name}-{n}" for d, n in SOURCES])
def test_matches_transformers(directory, source, tmp_path):
    """The ids, texts and special token ids transformers gave for the fixture's model; a
    tokenizer.model is also read alone (a copy of the directory without tokenizer.json)."""
    cases = json.loads((directory / "tokenizer_cases.json").read_text())
    if source == "tokenizer.model" and (directory / "tokenizer.json").exists():
        for path in directory.glob("*"):
            if path.name == source or (path.suffix == ".json" and path.name != "tokenizer.json"):
                shutil.copyfile(path, tmp_path / path.name)
        directory = tmp_path
    tok = HfTokenizer.from_dir(directory)
    special = cases["special"]
    assert tok.bos_token_id == special["bos_token_id"]
    assert tok.eos_token_id == special["eos_token_id"]
    assert tok.pad_token_id == special["pad_token_id"]
    for case in cases["cases"]:
        text = case["text"]
        assert tok.encode(text) == case["ids"], text
        assert tok.encode(text, add_special_tokens=False) == case["ids_no_special"], text
        assert tok.decode(case["ids_no_special"], skip_special_tokens=False) == case["decoded"]


def test_fixtures_are_there():
    """The fixture families the test above covers (written by tools/hf_fixtures)."""
    assert {p.name for p in FIXTURE_DIRS} >= {"llama2", "llama3", "mistral", "qwen2", "qwen3"}
    assert (FIXTURES / "llama2" / "tokenizer.model").exists()
