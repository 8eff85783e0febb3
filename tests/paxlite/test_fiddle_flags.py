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
