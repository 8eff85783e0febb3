"""paxlite.train.train_setup: where a run's starting state comes from.

Oracles: the source job's checkpoint read back by orbax, a fresh run's state (the seed's),
and JAX's compile log, which names each function it traces for jit (the seed's
initialisation is ``initialised``).
"""

import logging

import jax
import numpy as np
import pytest
from flax import traverse_util

from paxlite.checkpoints import train_checkpoints
from paxlite.experiments.base_experiment import with_overrides
from paxlite.experiments.tasks_lib import LOAD_ALL, CheckpointLoadingRules
from paxlite.runtime.job import build_job
from paxlite.train import train_loop, train_setup
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import restore_params

pytestmark = pytest.mark.slow  # Each test starts a run (traces and compiles its init).

Tiny = with_overrides(
    LmSyntheticTiny,
    dict(NUM_LAYERS=1, USE_REPEATED_LAYER=False, PERCORE_BATCH_SIZE=1, EVAL_INTERVAL_STEPS=0),
)
SEED_INIT_TRACED = "Finished tracing initialised for jit"


class LeavesTheSoftmaxFresh(Tiny):
    """Loads every parameter of SOURCE but the softmax's."""

    SOURCE: str = ""

    def task(self):
        task = super().task()
        task.train.init_from_checkpoint_rules = {
            self.SOURCE: CheckpointLoadingRules(
                load_rules=[LOAD_ALL], ignore_rules=[r"params/lm/softmax/.*"]
            )
        }
        return task


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A job trained 2 steps, its step-2 checkpoint written."""
    job_dir = tmp_path_factory.mktemp("source")
    exp = with_overrides(Tiny, dict(NUM_TRAIN_STEPS=2, CHECKPOINT_EVERY_N_STEPS=2))()
    train_loop.run(_job(exp, job_dir), peak_tflops=1.0)
    return job_dir


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> train_setup.RunState:
    """The starting state drawn from the seed alone."""
    job = _job(Tiny(), tmp_path_factory.mktemp("fresh"))
    with job.scope():
        return train_setup.init_or_restore(job, train_setup.StateSource.FRESH)


def _job(experiment, job_dir):
    """The experiment's job on the one device its mesh needs."""
    return build_job(
        experiment, experiment.task(), experiment.datasets(), job_dir, jax.devices()[:1]
    )


def _start(experiment, job_dir, caplog) -> tuple[train_setup.RunState, bool]:
    """``(starting state, whether the seed's initialisation was traced)`` of a new job."""
    job = _job(experiment, job_dir)
    checkpointer = train_checkpoints.Checkpointer(job_dir, max_to_keep=1)
    caplog.clear()
    try:
        with job.scope(), jax.log_compiles(True), caplog.at_level(logging.WARNING):
            run = train_setup.init_or_restore(
                job, train_setup.StateSource.LATEST_OR_FRESH, checkpointer
            )
    finally:
        checkpointer.close()
    return run, SEED_INIT_TRACED in caplog.text


def _flat(params) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def _assert_trees_equal(a, b) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_rules_that_load_every_parameter_draw_none_from_the_seed(source, fresh, tmp_path, caplog):
    exp = with_overrides(Tiny, dict(INIT_FROM=str(source)))()
    run, seed_traced = _start(exp, tmp_path / "job", caplog)
    assert not seed_traced
    _assert_trees_equal(run.state.params, restore_params(source, 2))
    # Step 0 and the optimizer's fresh state, as a run from the seed starts it.
    assert int(run.state.step) == 0
    _assert_trees_equal(run.state.opt_state, fresh.state.opt_state)


def test_rules_that_leave_parameters_fresh_draw_those_from_the_seed(
    source, fresh, tmp_path, caplog
):
    exp = with_overrides(LeavesTheSoftmaxFresh, dict(SOURCE=str(source)))()
    run, seed_traced = _start(exp, tmp_path / "job", caplog)
    assert seed_traced
    got, saved, seed = (
        _flat(run.state.params),
        _flat(restore_params(source, 2)),
        _flat(fresh.state.params),
    )
    softmax = [k for k in got if k.startswith("lm/softmax/")]
    assert softmax and len(softmax) < len(got)
    for name, value in got.items():
        np.testing.assert_array_equal(value, (seed if name in softmax else saved)[name], name)
