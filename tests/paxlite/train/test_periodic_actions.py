"""paxlite.train.periodic_actions: the first step's console line."""

import re

import jax.numpy as jnp

from paxlite.train import summaries
from paxlite.train.periodic_actions import FirstStepReport, RunResult, StepContext


class _Writer:
    """A summary writer that keeps what it is given: ``(step, scalars)``."""

    def __init__(self):
        self.written = []

    def write_scalars(self, step, scalars):
        self.written.append((step, dict(scalars)))


def _context(step: int, loss: float) -> StepContext:
    return StepContext(
        step=step,
        state={"step": jnp.array(step)},
        metrics={"loss": jnp.array(loss, jnp.float32), "num_tokens": jnp.array(8.0)},
        last_step=10,
        final_step=10,
        result=RunResult(),
        progress=summaries.Progress(step - 1, 10),
    )


def test_the_first_step_line_says_the_first_loss_and_times(capsys):
    """Every run's console shows where its loss started, beside the compile time; the line
    comes once, after the run's first step (here a resumed run's: step 4 of 10)."""
    writer = _Writer()
    report = FirstStepReport(3, 0.0, 1.5, writer, summaries.PaxliteSummaries())
    report(_context(4, 5.83))
    report(_context(5, 4.0))
    line = capsys.readouterr().out.strip()
    assert re.fullmatch(
        r"First step done \d+\.\d s after start \(compile 1\.5 s\); loss 5\.8300; "
        r"rates below exclude it\.",
        line,
    ), line
    assert [step for step, _ in writer.written] == [4]
    assert set(writer.written[0][1]) == {"train/compile_time_s", "train/time_to_first_step_s"}
