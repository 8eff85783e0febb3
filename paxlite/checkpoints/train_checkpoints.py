"""Orbax checkpoints of the train state and the input position."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from paxlite.checkpoints import commit_watch, input_positions
from paxlite.runtime import storage
from paxlite.train.train_state import TrainState

STATE = "state"
INPUT = "input"
_MAX_LISTED = 20  # Mismatched arrays listed in a CheckpointMismatchError.
_STATUS = re.compile(r"[A-Z_]+: ")  # How tensorstore's errors start: 'DATA_LOSS: ...'.
_INCOMPLETE = re.compile(r"(\d+)\.orbax-checkpoint-tmp.*")  # A save that never finished.
_COMMITTED = "commit_success.txt"  # Orbax's mark of a finished save in a bucket.
DAMAGED_DIRNAME = "damaged_checkpoints"  # Beside checkpoints/: where damaged steps are moved.
_COMMIT_POLL_S = 0.2  # How often a wait for a save looks for a failed background write.


class CheckpointMismatchError(ValueError):
    """The checkpoint was written by a different model: its arrays' paths or shapes differ."""


class CheckpointCorruptError(ValueError):
    """A checkpoint's files cannot be read (truncated, overwritten or partly deleted).

    Attributes:
      step: the checkpoint; cause: the read error, one line; damaged: whether the files
        themselves are bad (False: the storage refused or failed the read, e.g. a
        permission or a network error: the checkpoint may be fine).
    """

    def __init__(self, message: str, step: int, cause: str, damaged: bool = True):
        super().__init__(message)
        self.step, self.cause, self.damaged = step, cause, damaged


class Restored(NamedTuple):
    """A restored checkpoint: its ``step``, the ``state`` and the input's JSON state, and
    the newer checkpoints passed over as damaged (``moved_aside``), newest first."""

    step: int
    state: TrainState
    input_state: dict[str, Any]
    moved_aside: list[MovedAside]


class MovedAside(NamedTuple):
    """A damaged checkpoint, moved from ``checkpoints/<step>`` to ``to``, and why."""

    step: int
    to: epath.Path
    cause: str


class CheckpointSaveError(storage.StorageWriteError):
    """A checkpoint (or an input position saved beside it) could not be written.

    Attributes:
      step: the checkpoint that failed; newest_complete: the newest one that did not
        (None: none yet).
    """

    def __init__(self, message: str, step: int, newest_complete: int | None):
        super().__init__(message)
        self.step, self.newest_complete = step, newest_complete


def _save_whole_arrays_on_cpu() -> None:
    """On CPU, each replicated array is written whole by its first replica.

    orbax's replica-parallel save has each replica write a slice of a replicated array: on
    accelerators it spreads the device-to-host copies. CPU devices share the host's memory,
    so there is nothing to spread, and the slicing compiles programs per array shape and
    replica: 240 compiles for the first save of a 40-array tree on 8 CPU devices (0 without
    it). The files written are the same either way. Applies to orbax's
    process-wide handler for ``jax.Array``; accelerator runs keep orbax's default.
    """
    if jax.default_backend() == "cpu":
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
        )


class CheckpointFormat:
    """paxlite's checkpoints: ``<job_log_dir>/checkpoints/<step>/``, the :class:`TrainState`
    as it is (orbax, item ``state``) beside the input's JSON state (item ``input``).

    Another framework's format (a task's ``checkpoint_format``, e.g. T5X's) overrides
    where the steps go and how the state is written and read back; the input's state,
    the saves' timing, retention and failure handling stay :class:`Checkpointer`'s.
    """

    #: Orbax's step directory prefix (``<prefix>_<step>``); None: the bare step.
    step_prefix: str | None = None
    #: Whether the step directories share their directory with the job's other files.
    #: Then the Checkpointer removes the steps' unfinished saves itself (orbax's clean-up
    #: passes over prefixed steps), and nothing else.
    shares_job_directory: bool = False

    def directory(self, job_log_dir: epath.Path) -> epath.Path:
        """Where the step directories go."""
        return job_log_dir / "checkpoints"

    def damaged_directory(self, job_log_dir: epath.Path) -> epath.Path:
        """Where damaged steps are moved (``--restore_fallback``)."""
        return job_log_dir / DAMAGED_DIRNAME

    def to_saved(self, state: TrainState) -> Any:
        """The pytree written as item ``state`` (traceable: its shapes come from
        ``jax.eval_shape``)."""
        return state

    def restored(
        self, manager: ocp.CheckpointManager, step: int, abstract_state: TrainState
    ) -> TrainState:
        """Step ``step``'s state on the shardings of ``abstract_state`` (shapes checked)."""
        args = ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract_state)})
        return manager.restore(step, args=args)[STATE]

    def describe(self, job_log_dir: epath.Path, abstract_state: TrainState) -> None:
        """Writes what the format keeps about a run's state when it starts (nothing here)."""

    def step_name(self, step: int) -> str:
        return str(step) if self.step_prefix is None else f"{self.step_prefix}_{step}"


class Checkpointer:
    """An orbax ``CheckpointManager`` under ``<job_log_dir>/checkpoints`` (or where the
    checkpoint format puts the steps).

    Saves are asynchronous (training continues while arrays are written) and the
    oldest checkpoints beyond ``max_to_keep`` are deleted, only once a newer save
    is complete. A checkpoint holds the
    :class:`TrainState` (sharded arrays) and the training input's position (JSON).
    Saves that a killed process left unfinished are listed in ``interrupted_steps``
    and removed; they are never restored. With ``restore_fallback``,
    :meth:`restore_latest` passes over damaged checkpoints (see there).

    A save that fails, in its synchronous part or its background commit, or whose
    commit takes longer than ``timeout_secs``, raises :class:`CheckpointSaveError`
    from that :meth:`save`, the next one, or :meth:`finish_pending`; the checkpoints that were
    complete before it stay.
    """

    def __init__(
        self,
        job_log_dir: epath.PathLike,
        *,
        max_to_keep: int | None,
        async_save: bool = True,
        timeout_secs: int = 1200,
        restore_fallback: bool = False,
        checkpoint_format: CheckpointFormat | None = None,
    ):
        self.format = checkpoint_format or CheckpointFormat()
        self.job_log_dir = storage.job_path(job_log_dir)
        self.directory = self.format.directory(self.job_log_dir)
        self._restore_fallback = restore_fallback
        interrupted = _interrupted_saves(self.directory, self.format)
        self.interrupted_steps = sorted(interrupted)
        self._timeout_secs = timeout_secs
        shared = self.format.shares_job_directory
        if shared and jax.process_index() == 0:
            for path in interrupted.values():
                path.rmtree(missing_ok=True)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            step_prefix=self.format.step_prefix,
            enable_async_checkpointing=async_save,
            async_options=ocp.AsyncOptions(timeout_secs=timeout_secs),
            create=True,
            cleanup_tmp_directories=not shared,  # Removes what interrupted_steps found.
        )
        _save_whole_arrays_on_cpu()
        # Handlers named up front, so the metadata of a step saved by an earlier run is readable.
        self._commit_watch = commit_watch.CommitWatch()
        handlers = {
            STATE: ocp.StandardCheckpointHandler(),
            INPUT: ocp.JsonCheckpointHandler(),
        }
        for handler in handlers.values():
            commit_watch.watch_commits(handler, self._commit_watch)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )
        self._pending: int | None = None  # The step whose asynchronous commit may still run.
        self.newest_complete = self.latest_step()
        self._draining: contextlib.ExitStack | None = None  # From the first save to close().

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (interrupted saves never count)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: TrainState, input_state: dict[str, Any]) -> None:
        """Starts an asynchronous save of ``state`` at ``step``, once the previous save
        is complete.

        Raises:
          CheckpointSaveError: this save, or the previous one, failed.
        """
        self.finish_pending()
        if self._draining is None:  # Saves run in background threads until close().
            self._draining = contextlib.ExitStack()
            self._draining.enter_context(_finish_tasks_before_loop_close())
        with self.writing(step):
            saved = self.format.to_saved(state)
        args = ocp.args.Composite(
            **{STATE: ocp.args.StandardSave(saved), INPUT: ocp.args.JsonSave(input_state)}
        )
        with self.writing(step):
            self._manager.save(step, args=args, force=True)
        self._pending = step

    def finish_pending(self) -> None:
        """Blocks until the pending save (if any) is complete and its predecessors beyond
        ``max_to_keep`` are deleted.

        Raises:
          CheckpointSaveError: it failed or timed out (orbax dropped it; it is never restored).
        """
        step, self._pending = self._pending, None
        if step is None:
            return
        with self.writing(step):
            self._wait_until_finished()
        self.newest_complete = step

    def _wait_until_finished(self) -> None:
        """orbax's wait for the pending save, which raises a failed background write the
        moment it fails (orbax's own wait, in a multi-process job, waits at a barrier until
        the save's timeout; see ``commit_watch``)."""
        done, failure = threading.Event(), []

        def wait() -> None:
            try:
                self._manager.wait_until_finished()
            except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
                failure.append(e)
            finally:
                done.set()

        threading.Thread(target=wait, name="paxlite-save-wait", daemon=True).start()
        while not done.wait(_COMMIT_POLL_S):
            if (error := self._commit_watch.error) is not None:
                raise error
        if failure:
            raise failure[0]

    @contextlib.contextmanager
    def writing(self, step: int) -> Iterator[None]:
        """Turns any error inside into a CheckpointSaveError for ``step``."""
        try:
            yield
        except Exception as e:
            raise CheckpointSaveError(
                self._save_message(step, e), step, self.newest_complete
            ) from e

    def _save_message(self, step: int, error: Exception) -> str:
        if isinstance(error, TimeoutError):
            cause = (
                f"the save did not finish within {self._timeout_secs} s (raise "
                "CHECKPOINT_ASYNC_TIMEOUT_SECS if the storage is only slow)"
            )
        else:
            cause = storage.one_line(_root_cause(error))
        newest = self.newest_complete
        kept = (
            f"the newest complete checkpoint is step {newest}"
            if newest is not None
            else "no checkpoint is complete yet"
        )
        return (
            f"the checkpoint at step {step} could not be written to {self.directory}: {cause}; "
            f"{kept} (rerun the same command once the storage works)"
        )

    def restore(
        self, step: int, abstract_state: TrainState
    ) -> tuple[TrainState, dict[str, Any] | None]:
        """Restores onto the shardings of ``abstract_state`` (ShapeDtypeStructs), and the
        input's state (None: the step holds none, e.g. T5X wrote it).

        The saved arrays' paths and shapes are checked against ``abstract_state``
        before any array is read; nothing on disk is changed.

        Raises:
          CheckpointMismatchError: the checkpoint holds a different model.
          CheckpointCorruptError: the checkpoint's files cannot be read.
        """
        with self._reading(step):
            saved = self._manager.item_metadata(step)[STATE]
        if saved is None:
            raise self._corrupt(step, f"no readable {STATE!r} item")
        problems = shape_mismatches(saved, jax.eval_shape(self.format.to_saved, abstract_state))
        if problems:
            shown = problems[:_MAX_LISTED]
            if len(problems) > len(shown):
                shown.append(f"... and {len(problems) - len(shown)} more")
            raise CheckpointMismatchError(
                f"the checkpoint at step {step} in {self.directory} was written by a different "
                f"model: {len(problems)} arrays differ from this experiment's (saved vs "
                "expected shape):\n  " + "\n  ".join(shown) + "\nTrain this configuration "
                "with a new --job_log_dir (T5X's command: a new MODEL_DIR), or rerun with the "
                f"knobs that wrote the checkpoint (see {self.job_log_dir / 'config.txt'})."
            )
        with self._reading(step):
            input_state = None  # A step another framework wrote (T5X's) may hold none.
            if (self.directory / self.format.step_name(step) / INPUT).exists():
                args = ocp.args.Composite(**{INPUT: ocp.args.JsonRestore()})
                input_state = self._manager.restore(step, args=args)[INPUT]
            state = self.format.restored(self._manager, step, abstract_state)
        return state, input_state

    def restore_latest(self, abstract_state: TrainState) -> Restored:
        """The newest checkpoint, restored as :meth:`restore` does.

        With ``restore_fallback``, when its files cannot be read the next older one is
        tried, and so on; once one reads, the damaged newer ones are moved to
        ``<job_log_dir>/damaged_checkpoints/<step>`` (their input positions beside, as
        ``<step>.input_positions``): kept, and out of the way of the steps the run saves
        again.

        Raises:
          CheckpointMismatchError: a checkpoint holds a different model.
          CheckpointCorruptError: the newest checkpoint cannot be read (with the fallback:
            none can; nothing was moved).
        """
        damaged: list[CheckpointCorruptError] = []
        for step in sorted(self.all_steps(), reverse=True):
            try:
                state, input_state = self.restore(step, abstract_state)
            except CheckpointCorruptError as e:
                if not (self._restore_fallback and e.damaged):
                    raise
                damaged.append(e)
                continue
            return Restored(step, state, input_state, self._move_aside(damaged))
        newest = damaged[0]
        raise CheckpointCorruptError(
            f"cannot read any checkpoint in {self.directory}: the files of steps "
            f"{', '.join(str(e.step) for e in damaged)} look damaged (truncated or "
            f"overwritten). Move them aside to train from scratch, or pass a new "
            f"--job_log_dir. (Read error of step {newest.step}: {newest.cause})",
            newest.step,
            newest.cause,
        )

    def _move_aside(self, damaged: list[CheckpointCorruptError]) -> list[MovedAside]:
        """Moves each damaged step (and its input positions) to the damaged directory.

        One process only (``--restore_fallback`` is refused in a multi-process job: its
        processes could see a step's damage differently).
        """
        aside = self.format.damaged_directory(self.job_log_dir)
        moved = []
        for e in damaged:
            step_dir = self.directory / self.format.step_name(e.step)
            entry = MovedAside(e.step, _free_name(aside, step_dir.name), e.cause)
            positions = self.directory / input_positions.DIRNAME / str(e.step)
            try:
                storage.move_tree(step_dir, entry.to)
                if positions.exists():
                    aside_positions = entry.to.with_name(f"{entry.to.name}.input_positions")
                    storage.move_tree(positions, aside_positions)
            except Exception as error:  # noqa: BLE001 (local disks and buckets fail variously)
                raise storage.StorageWriteError(
                    f"the damaged checkpoint at step {e.step} could not be moved from "
                    f"{step_dir} to {entry.to}: "
                    f"{storage.one_line(_root_cause(error))}; nothing was deleted (move it "
                    "yourself, or rerun once the storage works)"
                ) from error
            moved.append(entry)
        if moved:
            self._manager.reload()
            self.newest_complete = self.latest_step()
        return moved

    @contextlib.contextmanager
    def _reading(self, step: int) -> Iterator[None]:
        """Turns a failed read of ``step``'s files into a CheckpointCorruptError."""
        try:
            with _finish_tasks_before_loop_close():
                yield
        except Exception as e:
            if (cause := _read_error(e)) is None:
                raise
            raise self._corrupt(step, cause, damaged=_is_damage(cause)) from e

    def _corrupt(self, step: int, cause: Any, damaged: bool = True) -> CheckpointCorruptError:
        step_dir = self.directory / self.format.step_name(step)
        detail = " ".join(str(cause).split())
        if len(detail) > 300:
            detail = detail[:300] + " ..."
        earlier = [s for s in self.all_steps() if s < step]
        fallback = (
            f"to resume from step {max(earlier)} (or rerun with --restore_fallback, which "
            "moves it aside)"
            if earlier
            else "to train from scratch"
        )
        return CheckpointCorruptError(
            f"cannot read the checkpoint at step {step}: the files in {step_dir} look damaged "
            f"(truncated or overwritten). Move or delete {step_dir} {fallback}, or pass a new "
            f"--job_log_dir. (Read error: {detail})",
            step,
            detail,
            damaged,
        )

    def close(self) -> None:
        """Waits for a pending save and closes orbax; never raises (a failed save is
        reported by :meth:`save` or :meth:`finish_pending`, or superseded by the error
        being raised)."""
        self._pending = None
        # After a failed write in a multi-process job, orbax's threads wait at a barrier
        # the peers never reach: closing would wait with them. The process exits instead.
        stuck = self._commit_watch.error is not None and jax.process_count() > 1
        try:
            if not stuck:
                self._manager.close()
        except Exception:  # noqa: BLE001
            pass
        finally:
            if self._draining is not None:
                self._draining.close()
                self._draining = None


def _free_name(directory: epath.Path, name: str) -> epath.Path:
    """``directory/name``, or ``name-2``, ``name-3``... if that is taken."""
    candidate, n = directory / name, 1
    while candidate.exists():
        n += 1
        candidate = directory / f"{name}-{n}"
    return candidate


def _interrupted_saves(
    directory: epath.Path, checkpoint_format: CheckpointFormat
) -> dict[int, epath.Path]:
    """Steps whose save was interrupted (process killed mid-write), and their directories.

    On a local disk orbax writes a step into ``<step>.orbax-checkpoint-tmp...`` and
    renames it to ``<step>`` only once every file is written; in a bucket, which has no
    rename, it writes ``<step>/`` in place and ``<step>/commit_success.txt`` last. Either
    way such a step is never restored. (``<step>``: the format's step name.)
    """
    if not directory.is_dir():
        return {}
    prefix = "" if checkpoint_format.step_prefix is None else checkpoint_format.step_prefix + "_"
    step_name = re.compile(re.escape(prefix) + r"(\d+)")
    incomplete = re.compile(re.escape(prefix) + _INCOMPLETE.pattern)
    if storage.is_remote(directory):
        steps = ((step_name.fullmatch(p.name), p) for p in directory.iterdir())
        return {int(m.group(1)): p for m, p in steps if m and not (p / _COMMITTED).exists()}
    found = ((incomplete.fullmatch(p.name), p) for p in directory.iterdir())
    return {int(m.group(1)): p for m, p in found if m}


def abstract_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of ``tree`` (arrays or ShapeDtypeStructs) with ``shardings``."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception of ``error``'s chain (the storage's own error)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def _read_error(error: BaseException) -> BaseException | None:
    """The failed file read in ``error``'s chain, if any.

    A read fails with a tensorstore status (``ValueError('DATA_LOSS: ...')``), an
    OSError, undecodable JSON, or a missing item (KeyError).
    """
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, (OSError, json.JSONDecodeError, KeyError)) or (
            isinstance(cause, ValueError) and _STATUS.match(str(cause))
        ):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


#: tensorstore statuses of a read the storage refused or could not serve (the files may
#: be fine): never a reason to pass a checkpoint over.
_NOT_DAMAGE = re.compile(
    r"(PERMISSION_DENIED|UNAUTHENTICATED|UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|"
    r"ABORTED|CANCELLED): "
)


def _is_damage(cause: BaseException) -> bool:
    """Whether a failed read (:func:`_read_error`) says the files are bad: unreadable data
    or metadata, or a file missing; not a refused or failed access."""
    if isinstance(cause, OSError):
        return isinstance(cause, FileNotFoundError)
    return not _NOT_DAMAGE.match(str(cause))


class _DrainingLoopPolicy(asyncio.AbstractEventLoopPolicy):
    """The current event loop policy, but its new loops finish their pending tasks on close()."""

    def __init__(self, base: asyncio.AbstractEventLoopPolicy):
        self._base = base

    def get_event_loop(self) -> asyncio.AbstractEventLoop:
        return self._base.get_event_loop()

    def set_event_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._base.set_event_loop(loop)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._base.new_event_loop()
        close = loop.close

        def finish_then_close() -> None:
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            if pending and not loop.is_running() and not loop.is_closed():
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            close()

        loop.close = finish_then_close
        return loop


@contextlib.contextmanager
def _finish_tasks_before_loop_close() -> Iterator[None]:
    """While active, event loops finish their pending tasks before they close.

    When one array read of a restore (or write of a save) fails, orbax closes its
    event loop with the others still in flight; as they complete, tensorstore's
    threads hit the closed loop and print tracebacks ('Event loop is closed').
    Finishing them first leaves the storage error alone.
    """
    base = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_DrainingLoopPolicy(base))
    try:
        yield
    finally:
        asyncio.set_event_loop_policy(base)


def shape_mismatches(saved: Any, expected: Any) -> list[str]:
    """``'path: saved S, expected E'`` for each array whose path or shape differs.

    ``saved`` is a checkpoint's metadata tree (leaves with ``.shape``); ``expected``
    is the target (ShapeDtypeStructs or arrays). Parameters are listed first.
    """
    saved_shapes = dict(_leaf_shapes(saved))
    expected_shapes = dict(_leaf_shapes(expected))
    problems = []
    for path in sorted(saved_shapes.keys() | expected_shapes.keys(), key=_params_first):
        have, want = saved_shapes.get(path), expected_shapes.get(path)
        if have != want:
            problems.append(f"{path}: saved {_shape_text(have)}, expected {_shape_text(want)}")
    return problems


def _leaf_shapes(tree: Any) -> Iterator[tuple[str, tuple[int, ...]]]:
    for keys, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        yield path_name(keys), tuple(getattr(leaf, "shape", ()))


def path_name(keys: Any) -> str:
    """``'opt_state/1/0/mu/lm/...'``: a tree path (jax's keys) as orbax names it."""
    return "/".join(_key_name(k) for k in keys)


def _key_name(key: Any) -> str:
    """``params``, ``0``: a path key as orbax names it (attribute, dict key or index)."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _params_first(path: str) -> tuple[bool, str]:
    return (not path.startswith(("params/", "target/")), path)  # target/: T5X's params.


def _shape_text(shape: tuple[int, ...] | None) -> str:
    return "(absent)" if shape is None else str(shape)
