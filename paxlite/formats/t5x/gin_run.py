"""T5X's gin files read as T5X reads them, into the call of its train, eval or infer script.

:func:`read_call` checks the files (:mod:`gin_sources`), then lets gin-config parse them
with T5X's module names answered by paxlite's (:mod:`t5x_modules`) and calls the script's
function (``train_script.train``, ``eval_script.evaluate``, ``infer_script.infer``) as
T5X's ``main`` does: gin supplies its arguments (scopes, macros, references, overrides)
and the stand-ins record them. Every failure is a
:class:`GinRunError` of one line naming the file and line, the configurable or the macro.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import logging
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import gin

from paxlite.formats.t5x import gin_sources, t5x_modules
from paxlite.formats.t5x.t5_subset import data as t5_data

#: T5's tasks (imported by gin files, never here: a user may register those names).
_T5_TASKS = "paxlite.formats.t5x.t5_subset.tasks"
_IN_FILE = re.compile(r'In file "([^"]+)", line (\d+)')


class GinRunError(ValueError):
    """A T5X gin configuration paxlite cannot run (one line: where and the fix)."""


@dataclasses.dataclass(frozen=True)
class Script:
    """One of T5X's commands: its ``__main__`` module's alias in gin files, the function
    gin calls, the run gin files that bind it (in words, and one of them by its include
    path), and the call's dataset arguments."""

    alias: str
    function: str
    run_gin: str
    example_gin: str
    datasets: tuple[str, ...]
    configurable: str | None = None  # A name the script registers itself (no module).

    @property
    def selector(self) -> str:
        return self.configurable or f"{self.alias}.{self.function}"


TRAIN = Script(
    "train_script",
    "train",
    "t5x/configs/runs/pretrain.gin or finetune.gin",
    "t5x/configs/runs/finetune.gin",
    ("train_dataset_cfg", "train_eval_dataset_cfg", "infer_eval_dataset_cfg"),
)
_EVAL_GIN, _INFER_GIN = "t5x/configs/runs/eval.gin", "t5x/configs/runs/infer.gin"
EVAL = Script("eval_script", "evaluate", _EVAL_GIN, _EVAL_GIN, ("dataset_cfg",))
INFER = Script("infer_script", "infer", _INFER_GIN, _INFER_GIN, ("dataset_cfg",))
_MODEL_GIN = "t5x/examples/t5/t5_1_1/base.gin"
CONVERT = Script(
    "convert_script",
    "convert_checkpoint",
    f"a model gin file ({_MODEL_GIN}) and --gin.convert_checkpoint.model=%MODEL",
    _MODEL_GIN,
    (),
    configurable="convert_checkpoint",
)


@dataclasses.dataclass(frozen=True)
class GinRun:
    """What T5X's gin files ask for: the script's call, where each binding is set, and the
    config text T5X writes to ``config.gin``."""

    call: Any
    sources: gin_sources.GinSources
    config_text: str


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
    """T5X's ``--gin.NAME=VALUE`` flags as ``--gin_bindings=NAME = VALUE`` (T5X's rewrite)."""
    out = []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin.") :].split("=", 1)
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


def read_call(
    script: Script,
    gin_files: Sequence[str],
    bindings: Sequence[str],
    search_paths: Sequence[str],
    own_packages: Sequence[str] = (),
    spm_path: str | None = None,
) -> GinRun:
    """The call of ``script`` in ``gin_files`` with ``bindings`` (``--gin_bindings``) applied
    (``own_packages``: see ``t5x_modules.t5x_names``; ``spm_path``: T5's SentencePiece
    model for the tasks of ``t5.data``, None for T5's own path).

    Raises:
      GinRunError: a missing file or include, a syntax error, an unknown configurable or
        parameter, an unset ``%gin.REQUIRED`` macro, a module that fails to import.
    """
    if not gin_files:
        raise GinRunError(
            "give --gin_file (repeatable), e.g. --gin_file=t5x/examples/t5/t5_1_1/tiny.gin "
            f"--gin_file={script.example_gin} (paxlite has both)."
        )
    flagged = [(f"--gin.{b.split('=')[0].strip()}", b) for b in bindings]
    try:
        sources = gin_sources.read_sources(gin_files, flagged, search_paths)
    except gin_sources.GinFileError as e:
        raise GinRunError(str(e)) from None
    t5_data.set_spm_path(spm_path)
    if _T5_TASKS in sys.modules:  # Registered by an earlier run in this process.
        sys.modules[_T5_TASKS].register()
    with _gin_parsing(search_paths, own_packages, script):
        try:
            gin.parse_config_files_and_bindings(
                list(gin_files), list(bindings), finalize_config=False
            )
            call = _called(script, sources)
            _import_task_modules([getattr(call, name) for name in script.datasets])
            return GinRun(call, sources, gin.config_str())
        except GinRunError:
            raise
        except Exception as e:  # gin's and the user's modules' errors: one line each.
            raise GinRunError(_one_line(e, sources)) from None


@contextlib.contextmanager
def _gin_parsing(
    search_paths: Sequence[str], own_packages: Sequence[str], script: Script
) -> Iterator[None]:
    """A fresh gin config with T5X's names and search paths; gin's own log lines hidden."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)  # gin logs each path it tries ('Path not found').
    gin.clear_config(clear_constants=True)
    # gin keeps search paths for the process and has no call to remove them: a second run
    # in one process (tests, notebooks) would find the first run's files first.
    prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
    kept = list(prefixes) if prefixes is not None else []
    if prefixes is not None:
        prefixes[:] = [""]
    for path in search_paths:
        gin.add_config_file_search_path(path)
    try:
        with t5x_modules.t5x_names(own_packages, script.alias):
            yield
    finally:
        root.setLevel(level)  # gin's config stays: the translation calls gin's configurables.
        if prefixes is not None:
            prefixes[:] = kept


def _called(script: Script, sources: gin_sources.GinSources) -> Any:
    """The script's function called with gin's bindings, as T5X's main calls it."""
    missing = sources.unset_required()
    if missing:
        first = missing[0]
        raise GinRunError(
            f"{first.value} is %gin.REQUIRED ({first.where}) and not set; set it with "
            f'--gin.{first.value}=... (strings quoted: --gin.{first.value}=\\"...\\").'
        )
    _refuse_misnamed_macros(sources)
    try:
        function = gin.get_configurable(script.selector)
    except KeyError:
        raise GinRunError(
            f"no gin file binds {script.selector}; include {script.run_gin} (as T5X's "
            f"{script.alias.split('_')[0]} command needs)."
        ) from None
    return function()


#: Macros T5X users set that T5X's gin files never use -> the one they meant.
_MISNAMED_MACROS = {"INIT_CHECKPOINT": "INITIAL_CHECKPOINT_PATH"}


def _refuse_misnamed_macros(sources: gin_sources.GinSources) -> None:
    """GinRunError for a macro set that binds nothing in T5X and has a name T5X does use
    (T5X's README sets ``INIT_CHECKPOINT``; its finetune.gin restores
    ``INITIAL_CHECKPOINT_PATH``): T5X would silently start from scratch."""
    used = sources.used_macros()
    for macro, meant in _MISNAMED_MACROS.items():
        if macro in sources.macros and macro not in used:
            raise GinRunError(
                f"{macro} ({sources.macros[macro].where}) binds nothing: no gin file uses it, "
                f"so T5X would start from scratch; set {meant} (finetune.gin restores it), "
                f'e.g. --gin.{meant}=\\"gs://.../model.ckpt-1000000\\".'
            )


def _import_task_modules(configs: Sequence[Any]) -> None:
    """Imports the datasets' ``module`` (T5X's MIXTURE_OR_TASK_MODULE), under T5X's names."""
    for config in configs:
        if config is not None and config.module:
            try:
                importlib.import_module(config.module)
            except Exception as e:
                raise GinRunError(
                    f"the task module {config.module!r} (DatasetConfig.module) failed to import: "
                    f"{type(e).__name__}: {_first_line(e)}; fix it (python -c 'import "
                    f"{config.module}' shows where) or put it on PYTHONPATH."
                ) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def _one_line(e: Exception, sources: gin_sources.GinSources) -> str:
    """gin's error (message, then 'In file ..., line N') as one line with a hint."""
    text = str(e)
    found = _IN_FILE.search(text)
    where = f"{found.group(1)}:{found.group(2)}: " if found else ""
    message = _first_line(e)
    if isinstance(e, t5x_modules.MissingModule):
        return f"{where}{message}."
    if isinstance(e, ModuleNotFoundError):
        return f"{where}{message}; install it, or put its folder on PYTHONPATH (T5X's user dirs)."
    if "was not provided by an import statement" in message:
        return (
            f"{where}{message} Each gin file imports what it binds (with dynamic registration): "
            "add e.g. `import __main__ as train_script` or `from t5x import utils` to it."
        )
    return f"{where}{message}{_did_you_mean(message)}"


def _did_you_mean(message: str) -> str:
    """' Did you mean X?' for gin's unknown configurable or parameter messages."""
    unknown_parameter = re.search(
        r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'", message
    )
    if unknown_parameter:
        configurable, name = unknown_parameter.groups()
        candidates = _parameters(configurable)
        close = difflib.get_close_matches(name, candidates, n=3)
        if close:
            return f"; did you mean {', '.join(close)}?"
        return f"; its parameters: {', '.join(candidates)}." if candidates else ""
    unknown = re.search(r"(?:No configurable matching|resolve selector) '?([\w.]+)", message)
    if unknown:
        selector = unknown.group(1)
        module_name, _, name = selector.rpartition(".")
        candidates = _attributes(module_name)
        close = difflib.get_close_matches(name, candidates, n=3)
        if close:
            return f"; did you mean {module_name}.{close[0]}?"
    return ""


def _parameters(configurable: str) -> list[str]:
    """The parameter names of one of paxlite's T5X stand-ins (``network.T5Config``)."""
    module_name, *attributes = configurable.split(".")
    target: Any = _our_module(module_name)
    for name in attributes:
        target = getattr(target, name, None)
    if target is None:
        return []
    return [p for p in inspect.signature(target).parameters if p != "self"]


def _our_module(module_name: str) -> Any:
    """paxlite's stand-in for T5X's module ``module_name`` (its last part), or None."""
    targets = {name.rsplit(".", 1)[-1]: target for name, target in t5x_modules.T5X_MODULES.items()}
    target = targets.get(module_name.rsplit(".", 1)[-1])
    return None if target is None else importlib.import_module(target)


def _attributes(module_name: str) -> list[str]:
    module = _our_module(module_name)
    return [] if module is None else [n for n in dir(module) if not n.startswith("_")]
