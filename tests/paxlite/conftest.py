"""Fixtures of the paxlite tests: a GCS emulator for bucket job dirs, and faults in front of it."""

import os

import pytest

from paxlite import storage
from tests.paxlite.gcs import FaultyGcs, start_emulator


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """fake-gcs-server on loopback with an empty bucket; this process's storage (and the
    environment the runs it starts inherit) pointed at it, then put back."""
    url, server = start_emulator(tmp_path_factory.mktemp("emulator") / "log.txt")
    saved = dict(os.environ)
    os.environ["STORAGE_EMULATOR_HOST"] = url.removeprefix("http://")  # As users write it.
    storage.configure()
    yield url
    server.terminate()
    server.wait(timeout=10)
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def faulty_gcs(emulator, monkeypatch):
    """A :class:`FaultyGcs` in front of the emulator, where runs started by the test (and
    tensorstore, which reads its own variable) send their requests."""
    with FaultyGcs(emulator) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.address)
        monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://{proxy.address}")
        yield proxy
