"""The tree's shape, checked: package layering, no import cycles, small functions, thin main.py,
packages by concern (each says what it owns; none too big), tests mirroring the source, and a
trainer that asks experiments (typed methods) instead of reading their knobs.

Imports are read from the source (every ``import`` statement, also those inside
functions: a lazy import is still a dependency).
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("praxis_lite", "paxlite", "tasks")
MAX_FUNCTION_LINES = 80
MAX_MAIN_LINES = 200
MAX_MODULES_PER_FOLDER = 15
#: What is not "the trainer": the experiments (registry included) and the command line's main.
NOT_TRAINER = ("paxlite/experiments/", "paxlite/main.py")


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of our packages."""
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """Our modules that ``path`` imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def test_layering():
    """praxis_lite never imports paxlite or tasks; paxlite never imports tasks."""
    bad = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if (module.startswith("praxis_lite") and target.startswith(("paxlite", "tasks")))
        or (module.startswith("paxlite") and target.startswith("tasks"))
    ]
    assert bad == []


def test_no_trainer_module_names_a_model_family():
    """Hugging Face's families are configurations in paxlite/formats, never branches elsewhere."""
    from paxlite.formats.hf import models as hf_models

    families = set(hf_models.FAMILIES) | {"llama", "mistral", "qwen", "gemma", "gpt2", "t5"}
    bad = [
        f"{path.relative_to(ROOT)} names {family}"
        for path in (ROOT / "paxlite").rglob("*.py")
        if "formats" not in path.parts
        for family in sorted(families)
        if re.search(rf"\b{family}\b", path.read_text(), re.IGNORECASE)
    ]
    assert bad == []


#: Packages that read models by their classes and fields on purpose: the foreign formats and
#: the Python API (``from_pretrained``) with what exports and adapts through it.
_MODEL_AWARE = ("formats", "pretrained")


def test_no_trainer_module_names_a_model_class_or_field():
    """The trainer meets models through the contract (``praxis_lite.models.base.BaseModel``) only:
    no trainer module names a model class, the layer it wraps, or a template field of the
    model."""
    import importlib

    from praxis_lite.base_layer import BaseLayer
    from praxis_lite.models.base import BaseModel

    classes = []
    for path in sorted((ROOT / "praxis_lite" / "models").glob("*.py")):
        module = importlib.import_module(f"praxis_lite.models.{path.stem}")
        classes += [
            c
            for c in vars(module).values()
            if isinstance(c, type)
            and issubclass(c, BaseModel)
            and c is not BaseModel
            and c.__module__ == module.__name__
            and issubclass(c, BaseLayer)
        ]
    wrapped = [t.value.__fn_or_cls__ for c in classes for t in _template_defaults(c)]
    own = {f for c in classes for f in c.__annotations__ if f.endswith("_tpl")}
    names = {c.__name__ for c in classes + wrapped} | own
    assert {"LanguageModel", "EncoderDecoderModel", "lm_tpl", "encoder_decoder_tpl"} <= names
    bad = [
        f"{path.relative_to(ROOT)} names {name}"
        for path in (ROOT / "paxlite").rglob("*.py")
        if not set(path.relative_to(ROOT / "paxlite").parts) & set(_MODEL_AWARE)
        for name in sorted(names)
        if re.search(rf"\b{name}\b", path.read_text())
    ]
    assert bad == []


def _template_defaults(cls: type) -> list:
    """The default templates of ``cls``'s template fields (what the model wraps)."""
    import dataclasses

    from praxis_lite.config import Template

    out = []
    for field in dataclasses.fields(cls):
        default = field.default
        if isinstance(default, Template) and default.value is not None:
            out.append(default)
    return out


def test_no_import_cycles():
    # A package's __init__ importing its submodules is not a cycle of concerns: skip packages.
    packages = {m for m, p in _modules().items() if p.name == "__init__.py"}
    graph = {m: ts - packages for m, ts in _graph().items() if m not in packages}
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(stack[stack.index(target) :] + [target]))
            elif target not in state:
                visit(target, stack + [target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize("package", PACKAGES)
def test_functions_are_small(package):
    long = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == []


def test_main_is_cli_glue():
    assert len((ROOT / "paxlite" / "main.py").read_text().splitlines()) <= MAX_MAIN_LINES


def _trainer_files() -> list[pathlib.Path]:
    return [
        path
        for path in sorted((ROOT / "paxlite").rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(NOT_TRAINER)
    ]


def _code_strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of a module that are not docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_the_trainer_reads_no_knob_by_name():
    """No ``getattr(experiment, "NUM_STAGES", 1)``: the trainer asks the experiment's typed
    methods (``init_source()``, ``pipeline_layout()``) instead."""
    bad = []
    for path in _trainer_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and re.fullmatch(r"[A-Z][A-Z0-9_]*", str(node.args[1].value))
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[1].value}")
    assert bad == []


#: Folders of layers and what runs them: no module-level state (a layer's state is its
#: variables; what a call needs, it is passed).
_STATELESS = ("praxis_lite/layers", "praxis_lite/models", "praxis_lite/decoding")
#: ``path: name`` of module-level state kept there on purpose -> why (none today).
_MUTABLE_GLOBALS_ALLOWED: dict[str, str] = {}
_MUTATORS = {"add", "append", "clear", "discard", "extend", "insert", "pop", "popitem"}
_MUTATORS |= {"remove", "setdefault", "update"}


def _mutated_globals(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of each module-level name the module rebinds (``global``) or changes
    in place (``NAME.add(...)``, ``NAME[key] = ...``, ``del NAME[key]``)."""
    top = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [(node.lineno, name) for name in node.names]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in top and node.func.attr in _MUTATORS:
                found.append((node.lineno, owner.id))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
            if isinstance(node.value, ast.Name) and node.value.id in top:
                found.append((node.lineno, node.value.id))
    return found


def test_no_mutable_module_globals_in_layers_models_and_decoding():
    """State that outlives a call lives in a layer's variables or the runtime that holds the
    job, not in a module: a warning said once is a ``functools.cache`` of its message."""
    bad = [
        f"{where}:{line}"
        for folder in _STATELESS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name in _mutated_globals(ast.parse(path.read_text()))
        if (where := f"{path.relative_to(ROOT)}: {name}") not in _MUTABLE_GLOBALS_ALLOWED
    ]
    assert bad == []


def test_the_mutable_globals_check_sees_a_set_changed_in_place():
    source = "SEEN = set()\n\ndef f(x):\n    SEEN.add(x)\n    CACHE[x] = 1\n\nCACHE = {}\n"
    assert _mutated_globals(ast.parse(source)) == [(4, "SEEN"), (5, "CACHE")]
    assert _mutated_globals(ast.parse("def f():\n    global N\n    N = 1\n")) == [(2, "N")]


def test_only_the_registry_names_the_tasks_package():
    """Code strings (not docstrings) of paxlite other than the registry never name ``tasks``:
    the default package for short names is one setting of the registry."""
    bad = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:60]!r}"
        for path in sorted((ROOT / "paxlite").rglob("*.py"))
        if path.relative_to(ROOT).as_posix() != "paxlite/experiments/registry.py"
        for node in _code_strings(ast.parse(path.read_text()))
        if re.search(r"(?<![\w./-])tasks(\.[a-z]|$)", node.value)
    ]
    assert bad == []


def test_every_package_says_what_it_owns():
    missing = [
        str(init.relative_to(ROOT))
        for package in PACKAGES
        for init in sorted((ROOT / package).rglob("__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert missing == []


def test_no_folder_is_a_sink():
    """A folder past ~15 modules holds two concerns."""
    folders = {
        init.parent for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")
    }
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in sorted(folders)
        if (count := len([p for p in folder.glob("*.py") if p.name != "__init__.py"]))
        > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_tests_mirror_the_source_tree():
    """tests/paxlite/formats/hf/test_models.py tests paxlite/formats/hf/models.py: each
    test module's folder under tests/<package>/ is a folder of that package."""
    stray = [
        str(test.relative_to(ROOT))
        for package in PACKAGES
        for test in sorted((ROOT / "tests" / package).rglob("test_*.py"))
        if not (ROOT / test.parent.relative_to(ROOT / "tests")).is_dir()
    ]
    assert stray == []


def _package_of(module: str) -> str:
    """The deepest package (folder with ``__init__.py``) that holds ``module``."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if (ROOT.joinpath(*parts[:k]) / "__init__.py").is_file():
            return ".".join(parts[:k])
    return parts[0]


def _may_import(init: pathlib.Path) -> set[str]:
    """The packages a package's docstring lets it import: the backticked names of its
    ``May import:`` paragraph."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    _, found, rest = doc.partition("May import:")
    assert found, f"{init.relative_to(ROOT)}: its docstring has no 'May import:' paragraph"
    return set(re.findall(r"(?<!`)`([\w.]+)`(?!`)", rest.split("\n\n")[0]))


def test_packages_import_only_what_their_docstrings_allow():
    """Each subpackage's ``May import:`` line is the truth: every import of our code by one of
    its modules targets itself, a package the line names (or one inside it), or, inside
    praxis_lite, the top-level modules (base_layer, config, sharding, flops, ...)."""
    inits = sorted(
        init
        for package in ("paxlite", "praxis_lite")
        for init in (ROOT / package).rglob("__init__.py")
        if init.parent != ROOT / package
    )
    modules, bad = _modules(), []
    for init in inits:
        package = ".".join(init.parent.relative_to(ROOT).parts)
        allowed = _may_import(init) | {package}
        if package.startswith("praxis_lite."):
            allowed.add("praxis_lite")  # Its top-level modules: exactly the package itself.
        for module in (m for m in modules if _package_of(m) == package):
            for target in _imports(modules[module], modules):
                unit = _package_of(target)
                ok = unit in allowed or (
                    not package.startswith("praxis_lite.")
                    and any(unit.startswith(a + ".") for a in allowed - {"paxlite"})
                )
                if not ok:
                    bad.append(
                        f"{module} imports {target} ({package} may import {sorted(allowed)})"
                    )
    assert bad == []


#: Source modules no test imports, each with the reason.
_NOT_IMPORTED_BY_TESTS = {"paxlite.__main__": "importing it runs main; tests run python -m paxlite"}


def _is_slow(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(d) == "pytest.mark.slow" for d in node.decorator_list)


def _fast_test_modules() -> list[pathlib.Path]:
    """Test modules with at least one test outside the slow tier (``-m "not slow"``)."""
    out = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        if "pytestmark = pytest.mark.slow" in path.read_text():
            continue
        tests = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")
        ]
        if any(not _is_slow(test) for test in tests):
            out.append(path)
    return out


def test_the_fast_tier_imports_every_source_module():
    """``-m "not slow"`` (the inner loop) loads every module of the source: each is imported,
    directly or through the modules it imports, by a test module with fast tests."""
    modules, graph = _modules(), _graph()
    helpers = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for p in (ROOT / "tests").rglob("*.py")
    }
    seen: set[str] = set()
    todo = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in _fast_test_modules()]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in helpers:  # A test module: what it imports of ours and of the tests.
            todo += _imports(helpers[name], {**modules, **helpers})
        else:
            todo += graph.get(name, ())
        parent = name.rpartition(".")[0]
        if parent in modules:  # Importing a.b.c runs a.b's __init__.
            todo.append(parent)
    missing = sorted(set(modules) - seen - set(_NOT_IMPORTED_BY_TESTS))
    assert missing == []
