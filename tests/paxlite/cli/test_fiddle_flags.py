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


@pytest.mark.slow
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


@pytest.mark.parametrize(
    "flag, why",
    [
        ("--eval_on_test", "every eval input of datasets() is evaluated"),
        ("--enable_checkpoint_saving=false", "checkpoints are always saved"),
        ("--study=s", "tuning is not part of paxlite"),
    ],
)
def test_pax_flags_without_a_counterpart_are_refused_saying_why(tmp_path, flag, why):
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", flag)
    assert code == 2, stderr[-2000:]
    assert stderr.startswith(f"paxlite: error: {flag.split('=')[0]}") and why in stderr
    assert stderr.count("\n") == 1 and not job.exists()


@pytest.mark.parametrize("flag", ["--restore_checkpoint_dir=/ckpt", "--restore_checkpoint_step=3"])
def test_restoring_a_chosen_checkpoint_in_a_training_mode_points_to_init_from(tmp_path, flag):
    job = tmp_path / "job"
    code, stderr = main_in_process(f"--job_log_dir={job}", flag)
    assert code == 2, stderr[-2000:]
    assert stderr.startswith("paxlite: error: --restore_checkpoint_dir/--restore_checkpoint_step")
    assert "--init_from=PATH" in stderr and stderr.count("\n") == 1 and not job.exists()


def test_pax_flags_that_ask_for_what_paxlite_does_are_accepted():
    from tests.paxlite.test_main import run_main_in_process

    code, stdout, stderr = run_main_in_process(
        "--print_config",
        "--enable_checkpoint_saving",
        "--enforce_restore_shape_check=true",
        "--jax_traceback_filtering_option=off",
    )
    assert code == 0, stderr[-2000:]
    assert "NUM_LAYERS" in stdout


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--server_addr=127.0.0.1:1", "--num_hosts=2", "--host_idx=0"], "add --multiprocess_gpu"),
        (
            ["--multiprocess_gpu", "--server_addr=127.0.0.1:1", "--coordinator_address=x:1"],
            "not both",
        ),
    ],
)
def test_pax_multihost_flags_misused_fail_in_one_line(tmp_path, flags, message):
    code, stderr = main_in_process(f"--job_log_dir={tmp_path / 'job'}", *flags)
    assert code == 2 and message in stderr and stderr.count("\n") == 1, stderr[-2000:]


@pytest.mark.parametrize("mode", ["infer", "tf_data_service_worker"])
def test_pax_modes_without_a_counterpart_are_refused(tmp_path, mode):
    code, stderr = main_in_process(f"--job_log_dir={tmp_path / 'job'}", f"--mode={mode}")
    assert code == 2 and stderr.startswith(f"paxlite: error: --mode={mode} (a paxml mode)")
    assert stderr.count("\n") == 1


def test_pax_decode_once_is_decode(tmp_path):
    """paxml's --mode=decode_once decodes the latest checkpoint once: our --mode=decode."""
    job = f"--job_log_dir={tmp_path / 'job'}"
    code, stderr = main_in_process(job, "--mode=decode_once", "--set=ICI_MESH_SHAPE=1,8,1")
    assert code == 2 and "--mode=decode needs a checkpoint" in stderr, stderr[-2000:]
