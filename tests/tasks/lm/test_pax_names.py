"""Pax's experiment names: Pax's paths (with 'params'), the headline C4Spmd1B, suggestions.

Against the real registry of tasks/ (tests/paxlite/experiments/test_registry.py
empties the registry for its own tests).
"""

import pytest

from paxlite.experiments import registry
from paxlite.experiments.registry import ExperimentRegistryError


def test_pax_paths_with_params_resolve_as_in_pax():
    """Pax registers tasks.lm.params.c4.X and drops 'params': both spellings work here."""
    from tasks.lm import c4

    for name in (
        "tasks.lm.params.c4.C4Spmd2BAdam4Replicas",
        "lm.params.c4.C4Spmd2BAdam4Replicas",
        "params.c4.C4Spmd2BAdam4Replicas",
        "tasks.lm.c4.C4Spmd2BAdam4Replicas",
    ):
        assert registry.get(name, ("tasks",)) is c4.C4Spmd2BAdam4Replicas


def test_the_headline_name_is_the_1b_c4_experiment():
    from paxlite.experiments.base_experiment import knobs
    from tasks.lm import c4

    short = registry.get("tasks.lm.c4.C4Spmd1B")
    assert issubclass(short, c4.C4Spmd1BAdam4Replicas)
    assert knobs(short) == knobs(c4.C4Spmd1BAdam4Replicas)


def test_a_mistyped_name_suggests_class_names_that_start_like_it_first():
    with pytest.raises(ExperimentRegistryError) as e:
        registry.get("C4Spmd1b", ("tasks",))
    lines = str(e.value).splitlines()
    closest = lines[lines.index("Closest registered experiments:") + 1 :]
    assert [c.strip() for c in closest[:2]] == [
        "tasks.lm.c4.C4Spmd1B",
        "tasks.lm.c4.C4Spmd1BAdam4Replicas",
    ]


def test_limit_steps_variants_are_their_base_run_for_paxs_step_count():
    from paxlite.experiments.base_experiment import knobs
    from tasks.lm import c4, lm_cloud

    for variant, base, steps in (
        (lm_cloud.LmCloudSpmd2BLimitSteps, lm_cloud.LmCloudSpmd2B, 300),
        (c4.C4Spmd1BAdam4ReplicasLimitSteps, c4.C4Spmd1BAdam4Replicas, 15_000),
    ):
        assert variant().task().num_train_steps == steps
        changed = {k for k, v in knobs(variant).items() if knobs(base)[k] != v}
        assert changed == {"NUM_TRAIN_STEPS"}
    # Pax's README command: --exp=tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps.
    found = registry.get("tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps")
    assert found is lm_cloud.LmCloudSpmd2BLimitSteps


def test_lm_cloud_runs_use_paxs_default_adam_schedule():
    """Pax's LmCloudSpmd calls set_default_adam: linear ramp-up, then exponential decay."""
    from praxis_lite import config as config_lib
    from praxis_lite.optim import schedules
    from tasks.lm import lm_cloud

    optimizer = config_lib.instantiate(lm_cloud.LmCloudSpmd2B().task()).learner.optimizer
    assert optimizer.lr_schedule == schedules.LinearRampupExponentialDecay(
        warmup_steps=4000, decay_start=4001, decay_end=300_000, min_ratio=0.1, max=1.0
    )


@pytest.mark.parametrize(
    "exp, line",
    [
        ("tasks.lm.c4.C4Spmd1B", "NUM_LAYERS: int = 13"),  # docs/scale.md's sizing command
        ("tasks.lm.params.c4.C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas", "STREAM_IO: bool"),
        ("tasks.lm.params.c4_multislice.C4Spmd32BAdam2xv5_256", "DCN_MESH_SHAPE"),
        ("tasks.lm.params.lm_cloud.SmallMlp", "MESH_SHAPE"),
    ],
)
def test_pax_commands_print_their_config(exp, line):
    """``paxlite --exp=<Pax's name> --print_config`` builds the whole configuration."""
    from tests.paxlite.test_main import run_main_in_process

    code, out, err = run_main_in_process("--print_config", exp=exp)
    assert code == 0, err
    assert line in out and "## Task (Fiddle paths)" in out and "num_train_steps" in out
