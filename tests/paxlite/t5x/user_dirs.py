"""A T5X user directory for one command, as a fresh process would have it; a user's SeqIO
task registered for one test."""

import contextlib
import pathlib
import sys
from collections.abc import Callable, Iterator, Sequence

import seqio

from paxlite.formats.t5x import t5x_modules


@contextlib.contextmanager
def fresh_user_directory(user_dir: pathlib.Path, task: str) -> Iterator[None]:
    """``user_dir`` on sys.path with its ``tasks.py`` imported afresh by the command (no
    bytecode written into the repository's fixture); after the block, the path and the
    user modules as they were, and ``task`` (which the module registers) unregistered."""
    sys.path.insert(0, str(user_dir))
    saved, writes_bytecode = dict(t5x_modules._USERS_MODULES), sys.dont_write_bytecode
    t5x_modules._USERS_MODULES.clear()
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.path.remove(str(user_dir))
        sys.dont_write_bytecode = writes_bytecode
        t5x_modules._USERS_MODULES.clear()
        t5x_modules._USERS_MODULES.update(saved)
        if task in seqio.TaskRegistry.names():
            seqio.TaskRegistry.remove(task)


@contextlib.contextmanager
def registered_task_without_data(name: str, metric_fns: Sequence[Callable] = ()) -> Iterator[str]:
    """SeqIO task ``name`` registered for the block (its name yielded): a validation split
    that reads nothing, byte ``targets``, ``metric_fns``; unregistered after it."""
    seqio.TaskRegistry.add(
        name,
        source=seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=["validation"]),
        preprocessors=[],
        output_features={"targets": seqio.Feature(seqio.ByteVocabulary())},
        metric_fns=list(metric_fns),
    )
    try:
        yield name
    finally:
        seqio.TaskRegistry.remove(name)
