"""Where each binding comes from: files in include order, then flags; macros followed."""

import pytest

from paxlite.formats.t5x import gin_sources


def _write(tmp_path, name, text):
    (tmp_path / name).write_text(text)


def test_the_last_assignment_wins_and_is_named_through_its_macro(tmp_path):
    _write(
        tmp_path,
        "base.gin",
        "SIZE = %gin.REQUIRED\nnet.Config.size = %SIZE\nnet.Config.depth = 2\n",
    )
    _write(tmp_path, "run.gin", "include 'base.gin'\nSIZE = 8\nnet.Config.depth = 3\n")
    sources = gin_sources.read_sources(
        ["run.gin"], [("--gin.net.Config.depth", "net.Config.depth = 4")], [str(tmp_path)]
    )
    assert sources.where("Config", "depth") == "--gin.net.Config.depth"
    assert sources.where("Config", "size").startswith(f"{tmp_path}/run.gin:2 (%SIZE")
    assert sources.where("Config", "width") == "Config.width's default"
    assert sources.unset_required() == []
    assert gin_sources.resolved_bindings(sources) == {
        "net.Config.size": "8",
        "net.Config.depth": "4",
    }


def test_a_required_macro_left_unset_is_reported(tmp_path):
    _write(tmp_path, "run.gin", "DIR = %gin.REQUIRED\ntrain.model_dir = %DIR\n")
    (missing,) = gin_sources.read_sources(["run.gin"], [], [str(tmp_path)]).unset_required()
    assert missing.value == "DIR" and missing.where == f"{tmp_path}/run.gin:1"


def test_missing_files_includes_and_syntax_errors(tmp_path):
    with pytest.raises(gin_sources.GinFileError, match="--gin_file=nope.gin not found"):
        gin_sources.read_sources(["nope.gin"], [], [str(tmp_path)])
    _write(tmp_path, "loop.gin", "include 'loop.gin'\n")
    with pytest.raises(gin_sources.GinFileError, match="includes itself"):
        gin_sources.read_sources(["loop.gin"], [], [str(tmp_path)])
    with pytest.raises(gin_sources.GinFileError, match="--gin.X: gin syntax error"):
        gin_sources.read_sources([], [("--gin.X", "X = (1")], [])


def test_macros_used_inside_lists_and_dicts_count_as_used(tmp_path):
    _write(
        tmp_path,
        "run.gin",
        "A = 1\nB = 2\nC = 3\nD = 4\nrestore.paths = [%A]\nrun.lengths = {'inputs': %B}\n"
        "E = (%C,)\n",
    )
    used = gin_sources.read_sources(["run.gin"], [], [str(tmp_path)]).used_macros()
    assert used == {"A", "B", "C"}  # D: set and never used.
