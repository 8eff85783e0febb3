"""Tests for paxlite.experiments.registry: registration, on-demand import, suffix lookup, errors."""

import sys

import pytest

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import BaseExperiment
from paxlite.experiments.registry import ExperimentRegistryError

_PKG = "tests.paxlite.user_experiments"
_MY_EXPS = f"{_PKG}.my_exps"


@pytest.fixture(autouse=True)
def _isolated_registry(monkeypatch: pytest.MonkeyPatch):
    """Each test starts with an empty registry and none of the user modules imported."""
    monkeypatch.setattr(registry, "_REGISTRY", {})
    saved = {name: mod for name, mod in sys.modules.items() if name.startswith(_PKG + ".")}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [name for name in sys.modules if name.startswith(_PKG + ".")]:
        del sys.modules[name]
    sys.modules.update(saved)


def test_full_name_imports_module_on_demand():
    assert _MY_EXPS not in sys.modules
    cls = registry.get(f"{_MY_EXPS}.MyTinyLm")
    assert _MY_EXPS in sys.modules
    assert cls is sys.modules[_MY_EXPS].MyTinyLm
    assert issubclass(cls, BaseExperiment)
    assert cls().task() == {"num_layers": 4}


def test_registered_name_is_module_and_qualname():
    registry.get(f"{_MY_EXPS}.MyTinyLm")
    assert list(registry.get_all()) == [f"{_MY_EXPS}.MyTinyLm"]


@pytest.mark.parametrize(
    "suffix", ["MyTinyLm", "my_exps.MyTinyLm", "user_experiments.my_exps.MyTinyLm"]
)
def test_unique_suffix_resolves(suffix: str):
    cls = registry.get(f"{_MY_EXPS}.MyTinyLm")
    assert registry.get(suffix) is cls


def test_ambiguous_suffix_lists_both():
    registry.get(f"{_PKG}.ambiguous_a.SameName")
    registry.get(f"{_PKG}.ambiguous_b.SameName")
    with pytest.raises(ExperimentRegistryError, match="ambiguous") as info:
        registry.get("SameName")
    assert f"{_PKG}.ambiguous_a.SameName" in str(info.value)
    assert f"{_PKG}.ambiguous_b.SameName" in str(info.value)
    assert "longer suffix" in str(info.value)
    assert registry.get("ambiguous_b.SameName").__module__ == f"{_PKG}.ambiguous_b"


def test_unknown_name_lists_close_candidates():
    registry.get(f"{_MY_EXPS}.MyTinyLm")
    with pytest.raises(ExperimentRegistryError, match="unknown experiment 'MyTinyLM'") as info:
        registry.get("MyTinyLM")
    assert f"{_MY_EXPS}.MyTinyLm" in str(info.value)


def test_unknown_name_with_nothing_close_says_how_to_import():
    with pytest.raises(ExperimentRegistryError, match="full dotted name"):
        registry.get("NoSuchExperiment")


def test_unregistered_class_in_imported_module_says_to_register():
    with pytest.raises(ExperimentRegistryError, match="'NotRegistered' but does not register"):
        registry.get(f"{_MY_EXPS}.NotRegistered")


def test_misspelled_class_in_imported_module_lists_close_candidates():
    with pytest.raises(ExperimentRegistryError, match="no submodule or class 'MyTinyLM'") as info:
        registry.get(f"{_MY_EXPS}.MyTinyLM")
    assert f"{_MY_EXPS}.MyTinyLm" in str(info.value)


def test_module_import_error_is_surfaced():
    with pytest.raises(ExperimentRegistryError, match="paxlite_missing_dependency") as info:
        registry.get(f"{_PKG}.broken_exps.Broken")
    assert isinstance(info.value.__cause__, ImportError)
    assert "unknown experiment" not in str(info.value)


def test_register_same_class_twice_is_a_no_op():
    class Exp:
        pass

    assert registry.register(registry.register(Exp)) is Exp


def test_register_different_class_under_same_name_raises():
    def make() -> type:
        class Exp:
            pass

        return Exp

    registry.register(make())
    with pytest.raises(ExperimentRegistryError, match=r"already registered.*rename"):
        registry.register(make())


def test_errors_are_lookup_errors():
    assert issubclass(ExperimentRegistryError, LookupError)


def test_short_name_found_by_searching_packages():
    assert _MY_EXPS not in sys.modules
    with pytest.raises(ExperimentRegistryError):
        registry.get("MyTinyLm")
    cls = registry.get("MyTinyLm", search_packages=(_PKG,))
    assert cls is sys.modules[_MY_EXPS].MyTinyLm


def test_short_name_imports_only_the_modules_that_define_it():
    """The other modules of the package (a broken one among them, which the full search
    would report) are not imported: a short name costs only its own module's imports."""
    cls = registry.get("MyTinyLm", search_packages=(_PKG,))
    assert cls.__module__ == _MY_EXPS
    imported = {name for name in sys.modules if name.startswith(_PKG + ".")}
    assert imported == {_MY_EXPS}


def test_a_short_name_defined_twice_imports_both_and_is_ambiguous():
    with pytest.raises(ExperimentRegistryError, match="ambiguous"):
        registry.get("SameName", search_packages=(_PKG,))
    assert f"{_PKG}.broken_exps" not in sys.modules


def test_a_module_suffix_narrows_the_modules_imported():
    cls = registry.get("ambiguous_b.SameName", search_packages=(_PKG,))
    assert cls.__module__ == f"{_PKG}.ambiguous_b"
    assert f"{_PKG}.ambiguous_a" not in sys.modules


def test_search_reports_modules_that_failed_to_import():
    with pytest.raises(ExperimentRegistryError, match=r"broken_exps: .*failed to import|broken"):
        registry.get("NoSuchExperiment", search_packages=(_PKG,))
