"""What users import keeps working after the packages moved: the names in the README, in
ported Pax files and in pyproject's console scripts.

An old public name is the new module itself (the same object), so state such as the
experiment registry is shared, not copied.
"""

import importlib
import tomllib

import praxis_lite
from praxis_lite import layers
from tests import REPO
from tests.processes import run_python


def test_paxlite_inference_is_the_loading_module():
    import paxlite.inference
    from paxlite.inference import PretrainedLm, from_pretrained
    from paxlite.pretrained import loading

    assert paxlite.inference is loading
    assert from_pretrained is loading.from_pretrained
    assert PretrainedLm is loading.PretrainedLm


def test_experiment_registry_is_the_registry_the_trainer_reads():
    from paxlite import experiment_registry
    from paxlite.experiments import registry

    assert experiment_registry is registry  # One module: one table of registered experiments.
    assert experiment_registry.register is registry.register


def test_paxlite_tasks_lib_is_the_task_config_module():
    from paxlite import tasks_lib
    from paxlite.experiments import tasks_lib as task_config

    assert tasks_lib is task_config
    assert tasks_lib.CheckpointLoadingRules is task_config.CheckpointLoadingRules


def test_pax_params_paths_and_short_names_resolve():
    from paxlite.experiments import registry

    cls = registry.get("tasks.lm.params.lm_cloud.LmCloudSpmd2B")
    assert f"{cls.__module__}.{cls.__qualname__}" == "tasks.lm.lm_cloud.LmCloudSpmd2B"


def test_praxis_lite_top_level_and_layers_names():
    assert praxis_lite.instantiate is importlib.import_module("praxis_lite.config").instantiate
    for name in layers.__all__:
        assert isinstance(getattr(layers, name), type), name
    assert layers.AutodiffCheckpointType.SAVE_NOTHING is not None


def test_console_scripts_point_at_callables():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {
        "paxlite",
        "paxlite-bench",
        "paxlite-export",
        "paxlite-tiny-model",
        "paxlite-t5x-train",
        "paxlite-t5x-eval",
        "paxlite-t5x-infer",
        "paxlite-t5x-convert-tf-checkpoint",
    }
    for target in scripts.values():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), target


def test_python_m_paxlite_runs_main():
    source = (REPO / "paxlite" / "__main__.py").read_text()
    assert "from paxlite.main import run" in source and "run()" in source


def test_paxlite_bench_sweep_imports_as_the_sweep_module():
    import paxlite.bench_sweep
    from paxlite.perf import bench_sweep

    assert paxlite.bench_sweep is bench_sweep


def test_python_m_paxlite_bench_sweep_still_runs():
    out = run_python(["-m", "paxlite.bench_sweep", "--help"], timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Weak-scaling benchmark sweep" in out.stdout and "--devices" in out.stdout
