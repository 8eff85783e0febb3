"""Where a job directory lives: a local path or a bucket (``gs://bucket/run``).

One file-system layer for everything but arrays: etils ``epath`` paths, which keep URLs
as URLs, reaching ``gs://`` through fsspec's ``gcsfs`` (in production and against an
emulator alike). Arrays go through tensorstore (orbax), which reads ``gs://`` itself.

:func:`configure` sets both up once per process, before either is used:

- epath takes gcsfs even where TensorFlow is installed (``EPATH_USE_TF=false``), and
  gcsfs its plain JSON-API client (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: its
  bucket-type probe needs a gRPC control plane that emulators do not serve; set it to
  true for Rapid (zonal) buckets) without a listings cache (other processes and
  tensorstore write into the same directories).
- ``STORAGE_EMULATOR_HOST`` (``host:port`` or ``http://host:port``), as Google's own
  clients read it, points all of the job directory's I/O at an emulator with anonymous
  credentials: gcsfs reads it directly, tensorstore through ``TENSORSTORE_GCS_HTTP_URL``.

Settings already in the environment win. Data files and vocabularies on ``gs://`` are read
by TensorFlow/TFDS/SeqIO with TensorFlow's own GCS support, as in Pax.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from typing import Any

from etils import epath
from etils.epath import gpath

EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"
#: How a run ends when a StorageWriteError stops it; every process of the job exits so.
WRITE_FAILED_EXIT_CODE = 5
ANONYMOUS = "anon"


class StorageError(ValueError):
    """A job directory that cannot be reached (no bucket, no credentials, no access)."""


class StorageWriteError(RuntimeError):
    """Something the run must keep (a checkpoint, a benchmark report) could not be written.

    Its message is the whole story in one line: what, where, the storage's error, and
    what to do. ``paxlite.main`` ends the run with it and :data:`WRITE_FAILED_EXIT_CODE`.
    """


# Parts of tensorstore's messages that repeat the request: its spec and the HTTP body.
_BRACKETED_DETAIL = re.compile(r"\s*\[(tensorstore_spec|http_response_body)='.*?'\]")
_MAX_LINE = 300


def configure() -> None:
    """Sets up epath/gcsfs and tensorstore for ``gs://`` paths (idempotent)."""
    import fsspec

    os.environ.setdefault("EPATH_USE_TF", "false")
    # epath caches its TensorFlow-or-not answer at the first gs:// path of the process.
    getattr(gpath._is_tf_installed, "cache_clear", lambda: None)()  # noqa: SLF001
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    emulator = emulator_url()
    if emulator is not None:
        os.environ[EMULATOR_VARIABLE] = emulator  # gcsfs wants the scheme.
        os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)
        os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", ANONYMOUS)
    for protocol in ("gs", "gcs"):
        settings = fsspec.config.conf.setdefault(protocol, {})
        # Other processes (and tensorstore) write into the bucket: list it afresh each time.
        settings.setdefault("use_listings_cache", False)
        if emulator is not None:
            settings.setdefault("token", ANONYMOUS)


def emulator_url() -> str | None:
    """``STORAGE_EMULATOR_HOST`` as ``http://host:port``, or None when it is not set."""
    host = os.environ.get(EMULATOR_VARIABLE, "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def job_path(text: str | os.PathLike) -> epath.Path:
    """The job directory as an epath: a URL stays a URL, a local path becomes absolute."""
    path = epath.Path(text)
    return path if is_remote(path) else path.absolute()


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL (``gs://...``) rather than a local path."""
    return "://" in os.fspath(path)


def kvstore(path: epath.Path) -> str:
    """Tensorstore's kvstore URL of a directory: ``gs://...`` as is, a local path as file://."""
    return os.fspath(path) if is_remote(path) else f"file://{os.fspath(path)}"


def check_reachable(path: epath.Path) -> None:
    """Raises StorageError unless a remote job directory's bucket can be written: a probe
    object is written and removed (local paths: see ``job_config.check_job_dir_writable``).

    The probe's name is this process's own: the processes of a multi-host job check the
    same directory at once, and one removing another's probe would read as a missing bucket.
    """
    probe = path / f".paxlite-write-check-{uuid.uuid4().hex}"
    gcsfs_log = logging.getLogger("gcsfs")  # Its retries log tracebacks; the error is enough.
    level = gcsfs_log.level
    gcsfs_log.setLevel(logging.CRITICAL)
    try:
        probe.write_text("")
        probe.unlink()
    except Exception as e:  # noqa: BLE001 (gcsfs and google-auth raise many kinds)
        raise StorageError(
            f"--job_log_dir {path} cannot be written: {_reason(e)}. Check the bucket name "
            "and your credentials (gcloud auth application-default login, or a service "
            f"account), or set {EMULATOR_VARIABLE} for an emulator."
        ) from None
    finally:
        gcsfs_log.setLevel(level)


def move_tree(source: epath.Path, target: epath.Path) -> None:
    """Moves the directory ``source`` to ``target`` (whose parent may not exist yet): a
    rename on a local disk; in a bucket, which has no directories to rename, each file is
    copied, then ``source`` removed (a failure part way leaves ``source`` whole)."""
    if not is_remote(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)
        return
    import fsspec

    fs, root = fsspec.core.url_to_fs(os.fspath(source))
    for file in fs.find(root):  # Every object under the prefix (epath's rglob refuses GCS).
        relative = file[len(root) :].lstrip("/")
        (source / relative).copy(target / relative)
    source.rmtree()


def one_line(error: BaseException) -> str:
    """A storage library's error as one line: its type and message, without tensorstore's
    spec and response body, at most ~300 characters."""
    text = " ".join(_BRACKETED_DETAIL.sub("", str(error)).split())
    if len(text) > _MAX_LINE:
        text = text[:_MAX_LINE] + " ..."
    name = type(error).__name__
    return f"{name}: {text}" if text else name


def close() -> None:
    """Closes the HTTP sessions of gcsfs and stops fsspec's event-loop thread (a no-op
    when neither started), so nothing of theirs runs while the interpreter shuts down.

    For the end of a process: a later ``gs://`` access starts a new loop and sessions.
    """
    import fsspec.asyn

    loop, thread = fsspec.asyn.loop[0], fsspec.asyn.iothread[0]
    if loop is None or not loop.is_running():
        return
    for fs in _gcs_filesystems():
        session = getattr(fs, "_session", None)
        if session is not None and not session.closed:
            try:
                fsspec.asyn.sync(loop, session.close, timeout=5)
            except Exception:  # noqa: BLE001 (a session that cannot close is dropped)
                pass
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(timeout=5)
    if not loop.is_running():
        loop.close()
    for fs in _gcs_filesystems():
        fs.clear_instance_cache()  # Each holds the stopped loop.
    fsspec.asyn.reset_lock()  # The next sync() starts a new loop and thread.


def _gcs_filesystems() -> list[Any]:
    """The gcsfs file systems this process made (fsspec caches one per set of options)."""
    import sys

    gcsfs = sys.modules.get("gcsfs")
    return list(gcsfs.GCSFileSystem._cache.values()) if gcsfs is not None else []  # noqa: SLF001


def _reason(error: Exception) -> str:
    """One line for a storage error (gcsfs's messages carry the HTTP status)."""
    text = " ".join(str(error).split())[:200] or type(error).__name__
    code = getattr(error, "code", None)
    if isinstance(error, FileNotFoundError):
        return f"the bucket does not exist ({text})"
    if code == 401:
        return f"no valid credentials (HTTP 401: {text})"
    if isinstance(error, PermissionError) or text.startswith("Forbidden"):
        return f"access denied (HTTP 403: {text})"
    return f"{type(error).__name__}: {text}"
