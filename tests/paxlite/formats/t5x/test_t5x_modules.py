"""T5X's (and T5's) module names are paxlite's inside the block, and nothing after it."""

import importlib
import sys

import pytest

from paxlite.formats.t5x import t5x_modules
from paxlite.formats.t5x.api import train_script, utils
from tests import REPO


def test_t5x_names_inside_the_block_only():
    main_before = sys.modules["__main__"]
    with t5x_modules.t5x_names():
        assert importlib.import_module("t5x.utils") is utils
        assert sys.modules["__main__"] is train_script
        network = importlib.import_module("t5x.examples.t5.network")
        assert network.T5Config(vocab_size=8).emb_dim == 512
        with pytest.raises(t5x_modules.MissingModule, match="t5x.contrib is not part"):
            importlib.import_module("t5x.contrib.moe")
        if not t5x_modules.real_t5_installed():
            metrics = importlib.import_module("t5.evaluation.metrics")
            assert metrics.accuracy([1, 2], [1, 3]) == {"accuracy": 50.0}
    assert sys.modules["__main__"] is main_before
    assert "t5x" not in sys.modules and "t5x.utils" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("t5x")


def test_a_user_module_named_like_a_paxlite_package_answers_inside_the_block(tmp_path, monkeypatch):
    """T5X's README names its user module ``tasks``, as paxlite's experiments package is."""
    (tmp_path / "tasks.py").write_text("USERS = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t5x_modules.import_own_packages(("tasks",), REPO)  # paxlite's first, as the command does.
    ours = sys.modules["tasks"]
    assert not hasattr(ours, "USERS")

    with t5x_modules.t5x_names(own_packages=("tasks",)):
        users = importlib.import_module("tasks")
        assert users.USERS is True
    assert sys.modules["tasks"] is ours
    with t5x_modules.t5x_names(own_packages=("tasks",)):
        assert importlib.import_module("tasks") is users  # Not run twice.


def test_our_modules_are_unchanged_after_the_block():
    spec = utils.__spec__
    with t5x_modules.t5x_names():
        importlib.import_module("t5x.utils")
        importlib.import_module("optax")  # The recorder, though imported first here.
    assert utils.__spec__ is spec and not hasattr(utils, "__path__")
