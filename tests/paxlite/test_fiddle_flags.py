"""Fiddle's absl flags that paxlite does not use stop the run in one line instead of being
ignored."""

import pytest

from tests.paxlite.test_main import main_in_process


@pytest.mark.parametrize(
    "flag, instead",
    [
        ("--fdl_config=base_config", "--fiddler or --fdl_set"),
        ("--fdl_config_file=/tmp/config.json", "--fiddler or --fdl_set"),
        ("--fdl_tags_set=ParamDtype=float32", "--fdl_set"),
        ("--fdl_help", "--print_config"),
    ],
)
def test_unused_fiddle_flags_are_refused(tmp_path, flag, instead):
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", flag)
    name = flag.split("=")[0]
    assert code == 2, stderr[-2000:]
    assert stderr.startswith(f"paxlite: error: {name} is not supported by paxlite")
    assert instead in stderr and stderr.count("\n") == 1
    assert not job.exists()


@pytest.mark.parametrize(
    "knob, path",
    [
        ("LEARNING_RATE=0.1", "task.learner.optimizer.learning_rate=0.5"),
        ("NUM_LAYERS=3", "task.model.lm_tpl.stacked_transformer_tpl.num_layers=4"),
        ("PERCORE_BATCH_SIZE=4", "datasets[0].batch_size=8"),
    ],
)
def test_a_knob_and_a_path_that_set_one_leaf_are_refused(tmp_path, knob, path):
    """Given both, one would silently win: the run stops in one line naming both."""
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", f"--set={knob}", f"--fdl_set={path}")
    assert code == 2, stderr[-2000:]
    assert stderr.startswith(f"paxlite: error: --set {knob} and --fdl_set {path.split('=')[0]}")
    assert stderr.count("\n") == 1 and not job.exists()


def test_a_knob_and_a_path_on_different_leaves_both_apply(tmp_path):
    from tests.paxlite.test_main import run_main_in_process

    code, stdout, stderr = run_main_in_process(
        "--print_config", "--set=NUM_LAYERS=3", "--fdl_set=task.learner.optimizer.learning_rate=0.5"
    )
    assert code == 0, stderr[-2000:]
    assert "NUM_LAYERS: int = 3" in stdout and "learning_rate: float = 0.5" in stdout
