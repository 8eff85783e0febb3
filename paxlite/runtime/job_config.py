"""The job directory's config files (config.txt to read, config.json for Fiddle) and its checks."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import tempfile
from collections.abc import Sequence
from typing import Any

from etils import epath
from fiddle import printing

from paxlite.cli.flags import UsageError
from paxlite.experiments import base_experiment
from paxlite.runtime import storage
from praxis_lite import config as config_lib

_FLAX_PARENT = re.compile(r"(.*\.)?parent: .* = <\[unset; default: <flax\.")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def write_config(
    job_log_dir: epath.Path,
    experiment: Any,
    task_cfg: Any,
    datasets: Any,
    decoder_datasets: Sequence[Any] = (),
) -> str:
    """Writes config.txt (readable) and config.json (Fiddle JSON) into the job dir, and the
    files the experiment keeps with the job (``job_files``, ``job_texts``)."""
    text = format_config(experiment, task_cfg, datasets, decoder_datasets)
    job_log_dir.mkdir(parents=True, exist_ok=True)
    (job_log_dir / "config.txt").write_text(text)
    tree = {"task": task_cfg, "datasets": list(datasets)}
    if decoder_datasets:
        tree["decoder_datasets"] = list(decoder_datasets)
    (job_log_dir / "config.json").write_text(config_lib.to_json(tree))
    for relative, source in experiment.job_files().items():
        target = job_log_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        epath.Path(source).copy(target, overwrite=True)
    for relative, content in experiment.job_texts().items():
        target = job_log_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    return text


def format_config(
    experiment: Any, task_cfg: Any, datasets: Any, decoder_datasets: Sequence[Any] = ()
) -> str:
    cls = type(experiment)
    lines = [f"# Experiment {cls.__module__}.{cls.__qualname__}", "", "## Knobs"]
    lines.append(base_experiment.format_knobs(cls, experiment))
    lines += ["", "## Task (Fiddle paths)", _flattened(task_cfg)]
    for i, cfg in enumerate(datasets):
        lines += ["", f"## datasets[{i}]", _flattened(cfg)]
    for i, cfg in enumerate(decoder_datasets):
        lines += ["", f"## decoder_datasets[{i}]", _flattened(cfg)]
    return "\n".join(lines) + "\n"


def _flattened(cfg: Any) -> str:
    """Fiddle's ``path: type = value`` lines, without Flax's unset ``parent`` plumbing (not a
    hyperparameter) and without memory addresses (``<function zeros at 0x7f...>``), which
    differ in every process: the same config gives the same text."""
    lines = printing.as_str_flattened(cfg).splitlines()
    kept = (_ADDRESS.sub("", line) for line in lines if not _FLAX_PARENT.match(line))
    return "\n".join(kept)


def check_job_dir_writable(job_log_dir: epath.Path, name: str = "--job_log_dir") -> None:
    """Raises :class:`UsageError` unless ``job_log_dir`` is (or can be made) a writable directory
    (``name``: what the user calls it, in the message).

    Creates nothing: the nearest existing directory is probed with a temporary
    directory that is removed at once. A bucket (``gs://...``) is probed with an object
    that is removed at once (:func:`paxlite.runtime.storage.check_reachable`).
    """
    if storage.is_remote(job_log_dir):
        storage.check_reachable(job_log_dir)
        return
    path = pathlib.Path(job_log_dir).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # A dangling link: the directory it names is gone.
            break
        existing = existing.parent
    blockers = [existing] + [path / sub for sub in ("checkpoints", "summaries")]
    for blocker in blockers:
        if (blocker.exists() or blocker.is_symlink()) and not blocker.is_dir():
            where = "is" if blocker == path else f"cannot be used: {blocker} is"
            raise UsageError(
                f"{name} {job_log_dir} {where} a file, not a directory; pass another "
                "path, or move that file."
            )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".paxlite-write-check-", dir=existing))
    except OSError as e:
        where = "" if existing == path else f" (its nearest existing parent {existing} is not)"
        raise UsageError(
            f"{name} {job_log_dir} is not writable{where}: {e.strerror}; pass a "
            "directory you can write to, or fix its permissions."
        ) from None


@dataclasses.dataclass(frozen=True)
class JobDirBefore:
    """What a job dir held before a run wrote its config into it: enough to undo a start
    that is then refused (:func:`undo_refused_start`).

    Attributes:
      existed: whether the directory existed; entries: the names in it;
      config_files: the bytes of its config files.
    """

    existed: bool
    entries: frozenset[str]
    config_files: dict[epath.Path, bytes]


def read_before(job_log_dir: epath.Path, experiment: Any = None) -> JobDirBefore:
    """The job dir as it is before this run writes to it (with ``experiment``: also the
    files it keeps with the job, e.g. T5X's config.gin)."""
    paths = [job_log_dir / "config.txt", job_log_dir / "config.json"]
    if experiment is not None:
        paths += [job_log_dir / name for name in _job_file_names(experiment)]
    return JobDirBefore(
        existed=job_log_dir.is_dir(),
        entries=_names(job_log_dir),
        config_files={p: p.read_bytes() for p in paths if p.is_file()},
    )


def undo_refused_start(job_log_dir: epath.Path, before: JobDirBefore, experiment: Any) -> None:
    """After a start refused with one line (exit 2): what :func:`write_config` wrote put back
    (config files, and the files the experiment keeps with the job, as they were; those
    that are new removed), and a new, empty checkpoints/ removed; a job dir the run created is
    removed once empty. Anything else (summaries of steps a run took before data it read
    was found bad, moved-aside damaged checkpoints) stays.

    Best effort: the refusal's line matters more than a file left behind.
    """
    kept_with_job = {pathlib.PurePosixPath(r).parts[0] for r in _job_file_names(experiment)}
    try:
        for path in (job_log_dir / "config.txt", job_log_dir / "config.json"):
            if path not in before.config_files:
                path.unlink(missing_ok=True)
        for path, content in before.config_files.items():  # Config and kept files as they were.
            path.write_bytes(content)
        for name in kept_with_job - before.entries:
            _remove(job_log_dir / name)
        checkpoints = job_log_dir / "checkpoints"
        if "checkpoints" not in before.entries and not _names(checkpoints):
            _remove(checkpoints)  # As orbax makes it, before any save.
        if not before.existed and job_log_dir.is_dir() and not _names(job_log_dir):
            job_log_dir.rmdir()
    except OSError:
        pass


def _job_file_names(experiment: Any) -> list[str]:
    """The job-dir-relative paths of the files the experiment keeps with the job."""
    return [*experiment.job_files(), *experiment.job_texts()]


def _remove(path: epath.Path) -> None:
    if path.is_dir():
        path.rmtree()
    elif path.exists():
        path.unlink()


def _names(directory: epath.Path) -> frozenset[str]:
    return frozenset(p.name for p in directory.iterdir()) if directory.is_dir() else frozenset()
