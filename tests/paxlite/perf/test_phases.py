"""Long one-off work says when each phase starts, that it is still running, and its time."""

import time

import pytest

from paxlite.perf import phases


def test_a_phase_says_it_started_is_still_running_and_how_long_it_took(capsys):
    with phases.phase("Compiling for v4-8", every_s=0.05):
        time.sleep(0.2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Compiling for v4-8 ..."
    assert any(x.startswith("Compiling for v4-8: still running (") for x in lines[1:-1])
    assert lines[-1].startswith("Compiling for v4-8: 0.") and lines[-1].endswith(" s")


def test_a_failed_phase_says_so(capsys):
    with pytest.raises(RuntimeError), phases.phase("Lowering"):
        raise RuntimeError("boom")
    assert capsys.readouterr().out.splitlines()[-1].startswith("Lowering: failed after 0.")
