"""``paxlite-tiny-model`` (``paxlite.formats.hf.tiny_models``): every family paxlite reads has a
recipe; each tiny model loads through paxlite's own loader and is its transformers-made
fixture's model (tensor names and shapes, config.json and generation_config.json), but where
its recipe says otherwise; its tokenizer reads back what the ``tokenizers`` / ``sentencepiece``
library reads, with the fixture's special ids; a seed writes the same bytes; bad input is one
line. (That transformers loads them: tools/hf_fixtures' ``--check-tiny``, by hand.)"""

import json
import pathlib
import re

import pytest
import sentencepiece
import tokenizers
from absl import flags
from etils import epath

from paxlite.cli import exits
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.hf import tiny_models
from paxlite.pretrained import loading
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tests import FIXTURES
from tests.paxlite.formats.hf.test_checkpoint import assert_written_with_umask

FAMILIES = list(tiny_models.RECIPES)
#: What transformers writes into generation_config.json beside the ids.
_BOOKKEEPING = {
    "_from_model_config",
    "output_attentions",
    "output_hidden_states",
    "transformers_version",
    "use_cache",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, pathlib.Path]:
    """Each family's tiny model (seed 0), written once for the module's tests."""
    root = tmp_path_factory.mktemp("tiny")
    return {family: _write(family, root / family) for family in FAMILIES}


def _write(family: str, out: pathlib.Path, seed: int = 0) -> pathlib.Path:
    tiny_models.write(family, out, seed)
    return out


def _fixture(family: str) -> pathlib.Path:
    return FIXTURES / "hf" / tiny_models.RECIPES[family].fixture


def _json(path: pathlib.Path) -> dict:
    return json.loads(path.read_text())


def test_every_family_has_a_recipe():
    """Each family the HF loader knows, the project's later ones too, has a tiny model."""
    assert {r.model_type for r in tiny_models.RECIPES.values()} == set(hf_models.FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_paxlite_loads_it(family, written):
    """from_pretrained reads every tensor into the model its config.json builds (a tensor
    missing, left over or of another shape would be an error), with its tokenizer."""
    model = loading.from_pretrained(written[family])
    assert model.tokenizer is not None


def _tensors(directory: pathlib.Path) -> dict[str, tuple[int, ...]]:
    source = hf_checkpoint.HfSource(epath.Path(directory), None)
    return {name: tuple(v.shape) for name, v in source.variables().items()}


def _any_layer(names: object) -> set[str]:
    """T5's tensor names with the layer index left out."""
    return {re.sub(r"/block/\d+/", "/block/N/", name) for name in names}


@pytest.mark.parametrize("family", FAMILIES)
def test_tensors_are_the_fixtures(family, written):
    """The fixture's tensor names (per layer where the layer counts differ on purpose) and
    shapes; a shape differs only where it holds a size the recipe changes (GPT-2's positions,
    T5's dimensions)."""
    recipe = tiny_models.RECIPES[family]
    ours, theirs = _tensors(written[family]), _tensors(_fixture(family))
    if any("layers" in field for field in recipe.unlike_fixture):
        assert _any_layer(ours) == _any_layer(theirs)
    else:
        assert set(ours) == set(theirs)
    config = _json(written[family] / hf_models.CONFIG_FILE)
    changed = {config[field] for field in recipe.unlike_fixture if type(config[field]) is int}
    differ = {n: (ours[n], theirs[n]) for n in set(ours) & set(theirs) if ours[n] != theirs[n]}
    assert {n: s for n, s in differ.items() if not changed & set(s[0])} == {}


def _model_of(fields: dict) -> object:
    return hf_models.build_model(hf_models.HfConfig(dict(fields), "config.json"))[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_config_is_the_fixtures(family, written):
    """config.json: each field is the fixture's, but the recipe's own; with those set back,
    the model it builds is the fixture's (no field the family reads is missing). The
    generation config is the fixture's (less transformers' bookkeeping)."""
    recipe = tiny_models.RECIPES[family]
    ours = _json(written[family] / hf_models.CONFIG_FILE)
    theirs = _json(_fixture(family) / hf_models.CONFIG_FILE)
    assert {
        k: v for k, v in ours.items() if k not in recipe.unlike_fixture and theirs.get(k) != v
    } == {}
    restored = {**ours, **{k: theirs.get(k) for k in recipe.unlike_fixture}}
    assert _model_of(restored) == _model_of(theirs)
    generation = _json(_fixture(family) / hf_checkpoint.GENERATION_CONFIG_FILE)
    expected = {k: v for k, v in generation.items() if k not in _BOOKKEEPING}
    assert _json(written[family] / hf_checkpoint.GENERATION_CONFIG_FILE) == expected


def _library_ids(directory: pathlib.Path, text: str) -> list[int]:
    """The ids the tokenizers library (tokenizer.json) or sentencepiece (spiece.model, with
    T5's EOS after) gives ``text``."""
    if (directory / "tokenizer.json").is_file():
        return tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text).ids
    processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "spiece.model"))
    return [*processor.encode(text), processor.eos_id()]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer(family, written):
    """HfTokenizer reads the library's ids, decodes the generated text back, and has the
    fixture's special ids."""
    tokenizer = HfTokenizer.from_dir(written[family])
    cases = _json(_fixture(family) / "tokenizer_cases.json")
    # Not T5's texts with special tokens in them: sentencepiece reads those as characters.
    texts = [tiny_models.generated_text(0, 1)[0], *(c["text"] for c in cases["cases"])]
    texts = [text for text in texts if "<" not in text]
    for text in texts:
        assert tokenizer.encode(text) == _library_ids(written[family], text), text
    ids = tokenizer.encode(texts[0], add_special_tokens=False)
    assert tokenizer.decode(ids) == texts[0]
    special = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert special == tuple(cases["special"].values())


def test_a_seed_writes_the_same_bytes(tmp_path, written):
    """The same seed: every file byte for byte; another seed: other weights and text."""
    again, other = _write("llama3", tmp_path / "again"), _write("llama3", tmp_path / "other", 1)
    files = sorted(p.name for p in written["llama3"].iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    for name in files:
        assert (again / name).read_bytes() == (written["llama3"] / name).read_bytes(), name
    weights = hf_checkpoint.SINGLE_FILE
    assert (other / weights).read_bytes() != (again / weights).read_bytes()
    assert tiny_models.generated_text(1) != tiny_models.generated_text(0)


def test_files_take_the_umask(tmp_path):
    assert_written_with_umask(
        lambda: tiny_models.write("flan-t5", tmp_path / "t5"), tmp_path / "t5"
    )


def _run(*argv: str) -> None:
    """The command line, in this process: its flags parsed and checked, then run."""
    flag_values = flags.FlagValues()
    tiny_models.define_flags(flag_values)
    rest = tiny_models.parse(flag_values, ["paxlite-tiny-model", *argv])
    tiny_models.check_flags(flag_values, rest)
    tiny_models.execute(flag_values)


def test_write_text(tmp_path, capsys):
    """--write_text: the text the tokenizer learned, one document a line."""
    _run("--family=gpt2", f"--out={tmp_path / 'gpt2'}", f"--write_text={tmp_path / 'a/text.txt'}")
    lines = (tmp_path / "a" / "text.txt").read_text().splitlines()
    assert lines == tiny_models.generated_text(0)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith(f"Wrote {tmp_path / 'gpt2'}: model.safetensors, config.json")
    assert printed[1] == f"Wrote {tmp_path / 'a/text.txt'}: {len(lines)} lines of generated text"


def test_the_same_command_again_writes_nothing(tmp_path, capsys):
    """A repeated docs example: the directory and text it wrote are found and kept."""
    argv = ("--family=gpt2", f"--out={tmp_path / 'gpt2'}", f"--write_text={tmp_path / 'text.txt'}")
    _run(*argv)
    before = {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("**/*")}
    capsys.readouterr()
    _run(*argv)
    assert capsys.readouterr().out == f"{tmp_path / 'gpt2'} already holds --family=gpt2 --seed=0\n"
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("**/*")} == before
    with pytest.raises(exits.Failed):  # Another seed's model is not this one: refused.
        _run("--family=gpt2", "--seed=1", f"--out={tmp_path / 'gpt2'}")


def test_help_lists_the_families(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _run("--help")
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    for name, recipe in tiny_models.RECIPES.items():
        assert f"  {name} " in printed and recipe.summary in printed


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--family=llama4", "--out=OUT/x"], "--family=llama4: value should be one of <llama|"),
        (["--out=OUT/x"], "needs --family=NAME (one of llama, llama3,"),
        (["--family=gpt2", "OUT/x"], "unexpected arguments OUT/x"),
        (["--family=gpt2", "--out=OUT/full"], "--out=OUT/full is not empty; give a new directory"),
        (["--family=gpt2", "--out=OUT/file"], "--out=OUT/file is not a directory"),
        (["--family=gpt2", "--out=OUT/file/x"], "cannot write OUT/file/x: Not a directory."),
        (["--family=gpt2", "--seed=-1", "--out=OUT/x"], "--seed=-1: -1 is not a non-negative"),
        (
            ["--family=gpt2", "--out=OUT/x", "--write_text=OUT/file"],
            "--write_text=OUT/file already exists and is not this seed's text",
        ),
        (
            ["--family=gpt2", "--out=OUT/x", "--write_text=OUT/file/t.txt"],
            "--write_text=OUT/file/t.txt: OUT/file is a file, not a directory.",
        ),
        (
            ["--family=gpt2", "--out=OUT/x", "--write_text=OUT/x/t.txt"],
            "--write_text=OUT/x/t.txt is inside --out=OUT/x; give a file outside",
        ),
    ],
)
def test_bad_input_is_one_line(argv, says, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("kept")
    (tmp_path / "file").write_text("a file")
    with pytest.raises(exits.Failed) as failed:
        _run(*(arg.replace("OUT", str(tmp_path)) for arg in argv))
    assert failed.value.code == exits.BAD_INPUT_EXIT_CODE
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("paxlite: error: ")
    assert says.replace("OUT", str(tmp_path)) in lines[0]
    assert (tmp_path / "full" / "mine.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "full"]  # Nothing written.
