"""Joining a multi-process job (jax.distributed), watching its peers, faking CPU devices."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import NoReturn

import jax

from paxlite.runtime import storage

# Environment variables that mean "this process is one of several" for a cluster
# JAX knows how to read (SLURM, Open MPI, TPU pods/multislice, explicit JAX env).
_CLUSTER_MARKERS = (
    ("SLURM_NTASKS", lambda v: int(v) > 1),
    ("OMPI_COMM_WORLD_SIZE", lambda v: int(v) > 1),
    ("MEGASCALE_COORDINATOR_ADDRESS", bool),
    ("TPU_WORKER_HOSTNAMES", lambda v: "," in v),
    ("JAX_COORDINATOR_ADDRESS", bool),
)


class DistributedSetupError(ValueError):
    """The multi-process flags are incomplete or contradict each other."""


def cluster_detected() -> bool:
    """Whether the environment describes a multi-process job JAX can auto-configure."""
    for name, is_multi in _CLUSTER_MARKERS:
        value = os.environ.get(name)
        if value:
            try:
                if is_multi(value):
                    return True
            except ValueError:
                continue
    return False


def initialize(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    timeout_s: int = 300,
    peer_timeout_s: float = 60.0,
) -> bool:
    """Initializes ``jax.distributed`` from flags, or from the cluster environment
    (:func:`join`), then watches the peers.

    With none of the flags and no cluster environment, does nothing (one process).
    In a multi-process job a :class:`PeerWatch` then stops this process, naming
    the lost peer, once another process has been silent for ``peer_timeout_s``
    seconds or has failed.

    Returns:
      Whether this is a multi-process job.
    """
    if not join(coordinator_address, num_processes, process_id, timeout_s, peer_timeout_s):
        return False
    if jax.process_count() == 1:
        return False
    global _peer_watch
    if _peer_watch is None:
        _peer_watch = PeerWatch(peer_timeout_s)
        _peer_watch.start()
    return True


def join(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    timeout_s: int = 300,
    peer_timeout_s: float = 60.0,
) -> bool:
    """``jax.distributed.initialize`` from the flags or the cluster environment, once (a
    second call finds the processes joined); starts no backend, so it may come before the
    platform and XLA flags are set. On CPU, cross-process collectives use gloo so local
    processes form one job.

    Returns:
      Whether the processes are joined (False: no flags and no cluster environment).
    """
    if jax.distributed.is_initialized():
        return True
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise DistributedSetupError(
            "--coordinator_address, --num_processes and --process_id go together; give all "
            "three (e.g. --coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id=0) "
            "or none (to use the cluster's environment)."
        )
    if not all(given) and not cluster_detected():
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's own heartbeat check aborts every process without saying which one died;
    # it stays as a backstop behind PeerWatch, which notices (and names) first.
    backstop = {"heartbeat_timeout_seconds": int(max(100, 2 * peer_timeout_s + 10))}
    if all(given):
        if not 0 <= process_id < num_processes:
            raise DistributedSetupError(
                f"--process_id={process_id} must be in [0, --num_processes={num_processes})."
            )
        jax.distributed.initialize(
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=timeout_s,
            **backstop,
        )
    else:
        jax.distributed.initialize(initialization_timeout=timeout_s, **backstop)
    return True


def agreed(key: str, value: str, timeout_s: float = 300.0) -> str:
    """Process 0's ``value`` on every process of a joined job (through the coordination
    service's key-value store; no backend is started)."""
    from jax._src import distributed as jax_distributed

    state = jax_distributed.global_state
    if state.process_id == 0:
        state.client.key_value_set(f"paxlite/agreed/{key}", value)
        return value
    return state.client.blocking_key_value_get(f"paxlite/agreed/{key}", int(timeout_s * 1000))


PEER_LOST_EXIT_CODE = 4  # Another process of the job died or failed; this one stopped.
# Exit codes of a peer that are not failures: done, or preempted with a checkpoint.
_ORDERLY_EXIT_CODES = (0, 143)
_KEY = "paxlite/peer/{index}/{field}"
# How long a failing process 0 waits for the others to learn of it before it exits (and
# the coordination service it hosts goes with it).
_LEADER_GRACE_S = 10.0
_peer_watch: PeerWatch | None = None


class PeerWatch:
    """Stops this process when another process of the job is lost, and says which.

    Every process beats (a counter in the coordination service's key-value
    store) every ``interval_s``; a daemon thread reads the others' counters. A
    peer whose counter has not moved for ``timeout_s`` seconds is lost (killed,
    hung, or its host is gone), and a peer that published a failing exit code
    (see :func:`report_exit`) has failed: either way this process prints one
    line naming it (with the peer's own error line, if it sent one) and exits with
    :data:`PEER_LOST_EXIT_CODE` instead of waiting forever in its next collective. A
    peer's failed checkpoint write is the job's: every process exits with its code
    (``storage.WRITE_FAILED_EXIT_CODE``), and only process 0 prints the line. When the
    coordinator (process 0) itself dies, JAX stops the others at once with its own
    message ("the leader task was preempted/died").
    """

    def __init__(self, timeout_s: float, interval_s: float | None = None):
        from jax._src import distributed as jax_distributed  # The job's coordination client.

        self._client = jax_distributed.global_state.client
        self._index, self._count = jax.process_index(), jax.process_count()
        self.timeout_s = timeout_s
        self.interval_s = interval_s or min(1.0, timeout_s / 4)
        self._beats = 0
        self._exit_claim = threading.RLock()  # Held by the thread that stops this process.
        self._about: dict[int, str] = {}
        self._client.key_value_set(
            _KEY.format(index=self._index, field="about"),
            f"host {socket.gethostname()}, pid {os.getpid()}",
            allow_overwrite=True,
        )

    def start(self) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paxlite-peer-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the watch (and its calls into the coordination service) and waits for it."""
        self._stopped.set()
        self._thread.join(timeout=10)

    def _get(self, peer: int, field: str) -> str | None:
        try:
            return self._client.key_value_try_get(_KEY.format(index=peer, field=field))
        except Exception:  # Not published yet (NOT_FOUND).
            return None

    def _run(self) -> None:
        peers = [i for i in range(self._count) if i != self._index]
        last_beat = dict.fromkeys(peers)
        last_change = dict.fromkeys(peers, time.monotonic())
        while not self._stopped.is_set():
            self._beats += 1
            try:
                self._client.key_value_set(
                    _KEY.format(index=self._index, field="beat"),
                    str(self._beats),
                    allow_overwrite=True,
                )
            except Exception:  # The coordinator is gone: JAX itself stops this process.
                return
            now = time.monotonic()
            for peer in peers:
                code = self._get(peer, "exit")
                if code is not None:
                    if int(code) not in _ORDERLY_EXIT_CODES:
                        self._stop_after_failure(peer, int(code))
                    last_change[peer] = now  # Left in order: nothing more to hear from it.
                    continue
                beat = self._get(peer, "beat")
                if beat != last_beat[peer]:
                    last_beat[peer], last_change[peer] = beat, now
                elif now - last_change[peer] > self.timeout_s:
                    self._stop(peer, f"stopped responding: no heartbeat for {self.timeout_s:g} s")
            self._stopped.wait(self.interval_s)

    def stop_if_a_peer_failed(self) -> None:
        """Stops this process as :meth:`_run` would if a peer has published a failing exit."""
        for peer in range(self._count):
            code = None if peer == self._index else self._get(peer, "exit")
            if code is not None and int(code) not in _ORDERLY_EXIT_CODES:
                self._stop_after_failure(peer, int(code))

    def _stop_after_failure(self, peer: int, code: int) -> None:
        """Stops this process after ``peer`` failed with ``code``.

        A failed write of the job's checkpoint (storage's exit code) is the job's failure:
        every process exits with that code, and process 0 (whose log is the job's) repeats
        the peer's line, which names the step and the cause. Any other failure stops this
        process with :data:`PEER_LOST_EXIT_CODE`, naming the peer's line where it sent one.
        """
        self._claim_exit()
        line = self._get(peer, "error")
        said = f": {line}" if line else " (see its log)"
        if code == storage.WRITE_FAILED_EXIT_CODE:
            if self._index == 0:
                self._print(f"process {peer} of {self._count} ({self._described(peer)}){said}")
            self._leave(code)
        self._stop(peer, f"exited with code {code}{said}")

    def _stop(self, peer: int, what: str) -> None:
        self._claim_exit()
        self._print(
            f"process {peer} of {self._count} ({self._described(peer)}) {what}. Stopping "
            f"process {self._index} too; once every process can run again, rerun the same "
            "command to resume from the latest checkpoint."
        )
        self._leave(PEER_LOST_EXIT_CODE, lost=peer)

    def _claim_exit(self) -> None:
        """Returns in the first thread to stop this process (the watch's, or the main
        thread's in :func:`stop_if_a_peer_failed`); any other waits for its exit."""
        if not self._exit_claim.acquire(blocking=False):
            threading.Event().wait()

    def _leave(self, code: int, lost: int | None = None) -> NoReturn:
        """Exits with ``code`` at once, once the other processes (but a ``lost`` one) can
        know it."""
        try:
            self.report_exit(code, None)
            if self._index == 0:
                self.wait_for_peers_to_exit(_LEADER_GRACE_S, lost)
        except Exception:  # noqa: BLE001 (the coordinator is gone: nobody is left to tell)
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def wait_for_peers_to_exit(self, grace_s: float, lost: int | None = None) -> None:
        """Waits (at most ``grace_s``) until every other process (but a ``lost`` one, which
        never will) has published its exit.

        For process 0 as it fails: it hosts the coordination service, and a peer that loses
        it is aborted by JAX ("the leader task died") before it can see why.
        """
        deadline = time.monotonic() + grace_s
        waiting = [i for i in range(self._count) if i not in (self._index, lost)]
        while waiting and time.monotonic() < deadline:
            waiting = [peer for peer in waiting if self._get(peer, "exit") is None]
            time.sleep(0.05)

    def _described(self, peer: int) -> str:
        return self._get(peer, "about") or "host unknown"

    @staticmethod
    def _print(message: str) -> None:
        print(f"paxlite: error: {message}", file=sys.stderr, flush=True)

    def report_exit(self, code: int, line: str | None) -> None:
        """Publishes this process's exit code (and its error line), so peers stop if it
        is a failure; the line first, so a peer that sees the code finds it. A failing
        process's watch then reports no peer: what they do next follows this failure."""
        if code not in _ORDERLY_EXIT_CODES:
            self._claim_exit()
        if line is not None:
            self._client.key_value_set(
                _KEY.format(index=self._index, field="error"), line, allow_overwrite=True
            )
        self._client.key_value_set(
            _KEY.format(index=self._index, field="exit"), str(code), allow_overwrite=True
        )


def report_exit(code: int, line: str | None = None) -> None:
    """Tells the other processes how this one is exiting, with its ``paxlite: error:``
    line's message if it printed one (no-op in a one-process job)."""
    if _peer_watch is None:
        return
    try:
        _peer_watch.report_exit(code, line)
    except Exception:  # The coordinator may already be gone; peers then stop on their own.
        return
    if code not in _ORDERLY_EXIT_CODES and jax.process_index() == 0:
        _peer_watch.wait_for_peers_to_exit(_LEADER_GRACE_S)


def stop_if_a_peer_failed() -> None:
    """For a process about to fail: if another process of the job failed first, stops this
    one as the peer watch does (naming that process and its error) instead of letting it
    report its own error, which is then most likely a consequence (a peer that exits closes
    the connections this process's collectives use). No-op in a one-process job.

    A failing peer publishes its exit before it exits, so this sees it.
    """
    if _peer_watch is not None:
        _peer_watch.stop_if_a_peer_failed()


def shutdown() -> None:
    """Leaves the job in order: ``jax.distributed`` shuts down, which waits at a barrier
    until every process has finished its last collective, then the peer watch stops.

    For an orderly end of a process (a failing one leaves at once). The watch runs
    through the barrier, so a peer that fails meanwhile still stops this process (exit
    4) instead of leaving it at the barrier until JAX's heartbeat timeout aborts it; it
    is stopped before the interpreter shuts down (a daemon thread inside a native call
    at that moment aborts the process).
    """
    global _peer_watch
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
    if _peer_watch is not None:
        _peer_watch.stop()
        _peer_watch = None


def use_fake_cpu_devices(count: int) -> None:
    """Makes this process see ``count`` CPU devices (must run before JAX starts a backend)."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        if jax.device_count() == count and jax.devices()[0].platform == "cpu":
            return
        raise RuntimeError(
            "JAX already started with other devices; the compile dry run must configure fake "
            "devices first (run it in a fresh process)."
        )
    flags = os.environ.get("XLA_FLAGS", "")
    flags = " ".join(f for f in flags.split() if "xla_force_host_platform_device_count" not in f)
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()
    jax.config.update("jax_platforms", "cpu")
