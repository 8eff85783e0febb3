"""``python -m paxlite.t5x.train`` in this process: T5X's README commands on tiny versions.

Oracle for the written config.gin: the one T5X's own ``t5x/train.py`` wrote for the same
command (tests/fixtures/t5x/user_dir_runs), the same bindings but for this machine's paths.

The user directory (tests/fixtures/t5x/user_dir) is what T5X's README shows: a ``tasks.py``
registering SeqIO tasks and gin files that include T5X's standard ones (paxlite's copies,
found without a T5X clone) and are passed with ``--gin_search_paths``. A run trains with
paxlite's loop and writes T5X's ``config.gin``; each bad input is one line, exit 2, and an
untouched MODEL_DIR.
"""

import hashlib
import json
import pathlib
import re
import shutil

import numpy as np
import pytest
import seqio
from absl import flags
from tensorboard.backend.event_processing import event_accumulator

from paxlite.checkpoints import checkpoint_sources
from paxlite.experiments import registry
from paxlite.experiments.base_experiment import with_overrides
from paxlite.formats.t5x import gin_files, gin_run, gin_sources, t5x_modules, translation
from paxlite.t5x import command, train
from praxis_lite import config as config_lib
from tests import FIXTURES, REPO
from tests.paxlite.t5x.commands import refusal, run_in_process

USER_DIR = FIXTURES / "t5x" / "user_dir"
#: What T5X's own train.py wrote running the user directory's gin files (its config.gin),
#: made by tools/t5x_fixtures/run_t5x_user_dir.sh.
T5X_RUNS = FIXTURES / "t5x" / "user_dir_runs"
FLAN_CHECKPOINT = FIXTURES / "t5x" / "flan_legacy" / "checkpoint_7"


def run_t5x_train(*argv: str) -> tuple[int, str, str]:
    """``python -m paxlite.t5x.train ARGV`` in this process: ``(exit code, stdout, stderr)``."""
    try:
        return run_in_process(train.main, "paxlite.t5x.train", argv)
    finally:
        seqio.set_tfds_data_dir_override(None)  # --tfds_data_dir is for the process.


def _train(
    user_dir: pathlib.Path, gin_file: str, model_dir: pathlib.Path, *argv: str
) -> tuple[int, str, str]:
    """T5X's train command: ``gin_file`` found in ``user_dir``, MODEL_DIR ``model_dir``, then
    ARGV: ``(exit code, stdout, stderr)``."""
    return run_t5x_train(
        f"--gin_file={gin_file}",
        f"--gin_search_paths={user_dir}",
        f'--gin.MODEL_DIR="{model_dir}"',
        *argv,
    )


def _fine_tune(
    user_dir: pathlib.Path, model_dir: pathlib.Path, checkpoint: pathlib.Path, *argv: str
) -> tuple[int, str, str]:
    """The user directory's finetune.gin from INITIAL_CHECKPOINT_PATH ``checkpoint``, with its
    vocabulary, then ARGV: ``(exit code, stdout, stderr)``."""
    return _train(
        user_dir,
        "finetune.gin",
        model_dir,
        f'--gin.INITIAL_CHECKPOINT_PATH="{checkpoint}"',
        f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file="{user_dir}/spiece.model"',
        *argv,
    )


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> pathlib.Path:
    """A copy of the README's user directory, on sys.path (T5X's PYTHONPATH=DIR)."""
    copy = tmp_path / "user_dir"
    shutil.copytree(USER_DIR, copy)
    monkeypatch.syspath_prepend(str(copy))
    # A fresh process per command, as a user has: other tests reset SeqIO's registry.
    monkeypatch.setattr(t5x_modules, "_USERS_MODULES", {})
    return copy


def _config_gin_bindings(path: pathlib.Path) -> dict[str, str]:
    """The bindings of a written config.gin, macros resolved."""
    return gin_sources.resolved_bindings(gin_sources.read_sources([str(path)], [], []))


#: Bindings whose values are this machine's paths (the model dir, the checkpoint, the vocabulary).
_PATHS = (
    "train_script.train.model_dir",
    "utils.RestoreCheckpointConfig.path",
    "seqio.SentencePieceVocabulary.sentencepiece_model_file",
)


def _without_paths(bindings: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in bindings.items() if k not in _PATHS}


def _checkpoint_steps(model_dir: pathlib.Path) -> list[int]:
    """The steps of T5X's ``checkpoint_<step>/`` in MODEL_DIR."""
    found = (re.fullmatch(r"checkpoint_(\d+)", p.name) for p in model_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


@pytest.mark.slow
def test_from_scratch_with_a_user_directory(user_dir, tmp_path):
    model_dir = tmp_path / "model"
    code, out, err = _train(
        user_dir,
        "scratch.gin",
        model_dir,
        "--gin.train_script.train.random_seed=None",  # T5X: a fresh seed per run.
    )
    assert code == 0, err[-3000:]
    seed = re.search(
        r"RANDOM_SEED \(initialization and dropout\) is None: this run's seed is (\d+)", out
    )
    assert seed, out[:2000]
    assert f"\nSEED: int = {seed.group(1)}\n" in (model_dir / "config.txt").read_text()
    assert "step       6/6" in out
    assert "eval 'validation' at step 6" in out
    assert _checkpoint_steps(model_dir) == [0, 3, 6]  # T5X saves its start; period 3.
    ours = _config_gin_bindings(model_dir / "config.gin")
    assert ours["network.T5Config.emb_dim"] == "8"  # tiny.gin's, over base.gin's 768.
    assert ours["train_script.train.model_dir"] == repr(str(model_dir))
    assert ours.pop("train_script.train.random_seed") == "None"
    theirs = _config_gin_bindings(T5X_RUNS / "scratch_config.gin")
    assert theirs.pop("train_script.train.random_seed") == "0"
    assert _without_paths(ours) == _without_paths(theirs)


@pytest.mark.slow
def test_fine_tune_from_a_t5x_checkpoint_with_num_partitions_overridden(user_dir, tmp_path):
    """finetune.gin from T5X's checkpoint, 2-way model parallel (``--gin.`` wins over the
    files, as in T5X), decoding the validation split and scoring it with T5's metric."""
    model_dir = tmp_path / "model"
    code, out, err = _fine_tune(
        user_dir,
        model_dir,
        FLAN_CHECKPOINT,
        "--gin.partitioning.PjitPartitioner.num_partitions=2",
        # The checkpoint's Adafactor state factors 32-wide kernels, as T5X needs told too.
        "--gin.adafactor.Adafactor.min_dim_size_to_factor=32",
    )
    assert code == 0, err[-3000:]
    assert "'data': 4, 'mdl': 2" in out  # 8 devices, each model copy on 2.
    assert "from T5X" in out or "INIT_FROM" in out or "Initialised" in out, out[-3000:]
    assert "step      10/10" in out
    assert "sequence_accuracy" in out
    assert _checkpoint_steps(model_dir)[-1] == 10
    # T5X's inference eval run and names (SeqIO's evaluator's): the task's metrics only.
    run = model_dir / "inference_eval" / "tiny_reverse_spm"  # finetune.gin's task.
    inference = event_accumulator.EventAccumulator(str(run), size_guidance={"tensors": 0})
    inference.Reload()
    assert inference.Tags()["tensors"] == ["eval/sequence_accuracy"]
    assert [e.step for e in inference.Tensors("eval/sequence_accuracy")][-1] == 10
    # And T5X's JSON lines: each decoded example, and a metrics line per inference eval.
    decoded = (model_dir / "inference_eval" / "tiny_reverse_spm-000010.jsonl").read_text()
    first = json.loads(decoded.splitlines()[0])
    assert set(first) == {"input", "target", "output", "prediction"}
    metric_lines = (model_dir / "inference_eval" / "tiny_reverse_spm-metrics.jsonl").read_text()
    assert json.loads(metric_lines.splitlines()[-1])["step"] == 10
    ours = _without_paths(_config_gin_bindings(model_dir / "config.gin"))
    theirs = _without_paths(_config_gin_bindings(T5X_RUNS / "finetune_config.gin"))
    assert ours.pop("partitioning.PjitPartitioner.num_partitions") == "2"  # T5X's run: 1.
    assert theirs.pop("partitioning.PjitPartitioner.num_partitions") == "1"
    assert ours == theirs


def _refused(code: int, err: str, model_dir: pathlib.Path) -> str:
    """The one error line of a refused run, checked: exit 2, nothing written."""
    line = refusal(code, err)
    assert not model_dir.exists()
    return line


def _write(directory: pathlib.Path, name: str, text: str) -> str:
    (directory / name).write_text(text)
    return name


_HEADER = """from __gin__ import dynamic_registration
import __main__ as train_script
import tasks
from t5x import utils
from t5x.examples.t5 import network
include 'scratch.gin'
"""


def _run_bad(user_dir: pathlib.Path, tmp_path: pathlib.Path, text: str, *extra: str) -> str:
    model_dir = tmp_path / "model"
    gin_file = _write(user_dir, "bad.gin", text)
    code, _, err = _train(user_dir, gin_file, model_dir, *extra)
    return _refused(code, err, model_dir)


def test_paxlite_s_own_run_flags_are_refused(user_dir, tmp_path):
    code, _, err = run_t5x_train(
        "--gin_file=scratch.gin", f"--gin_search_paths={user_dir}", f"--job_log_dir={tmp_path}/j"
    )
    line = _refused(code, err, tmp_path / "j")
    assert "--job_log_dir is not a flag of T5X's train command" in line and "MODEL_DIR" in line


def test_a_gin_syntax_error_names_file_and_line(user_dir, tmp_path):
    line = _run_bad(user_dir, tmp_path, _HEADER + "network.T5Config.emb_dim = (8\nX = 1\n")
    assert "bad.gin:8" in line and "syntax" in line


def test_an_include_not_found_lists_the_search_paths(user_dir, tmp_path):
    line = _run_bad(user_dir, tmp_path, "include 't5x/examples/t5/t5_1_1/tinyy.gin'\n")
    assert "bad.gin:1" in line and "tinyy.gin" in line and str(user_dir) in line
    assert "--gin_search_paths" in line


def test_an_unknown_configurable_or_parameter_gets_did_you_mean(user_dir, tmp_path):
    line = _run_bad(user_dir, tmp_path, _HEADER + "network.T5Confg.emb_dim = 4\n")
    assert "bad.gin:7" in line and "did you mean network.T5Config?" in line
    line = _run_bad(user_dir, tmp_path, _HEADER + "network.T5Config.emb_dm = 4\n")
    assert "bad.gin:7" in line and "emb_dm" in line and "did you mean emb_dim" in line


def test_an_unset_required_macro_names_the_flag(user_dir, tmp_path):
    code, _, err = run_t5x_train("--gin_file=scratch.gin", f"--gin_search_paths={user_dir}")
    line = _refused(code, err, tmp_path / "model")
    assert "MODEL_DIR is %gin.REQUIRED" in line and "pretrain.gin" in line
    assert '--gin.MODEL_DIR=\\"...\\"' in line


def test_a_task_module_that_fails_to_import(user_dir, tmp_path):
    _write(user_dir, "broken_tasks.py", "import seqio\nraise RuntimeError('no data here')\n")
    text = _HEADER + "MIXTURE_OR_TASK_MODULE = 'broken_tasks'\n"
    line = _run_bad(user_dir, tmp_path, text)
    assert "broken_tasks" in line and "RuntimeError: no data here" in line


def test_a_tfds_dataset_missing_under_tfds_data_dir(user_dir, tmp_path):
    text = _HEADER + "import t5.data.mixtures\nMIXTURE_OR_TASK_NAME = 'wmt_t2t_ende_v003'\n"
    empty = tmp_path / "tfds"
    empty.mkdir()
    spm = f"--t5_spm_path={user_dir}/spiece.model"
    line = _run_bad(user_dir, tmp_path, text, f"--tfds_data_dir={empty}", spm)
    assert "wmt_t2t_translate" in line and str(empty) in line


def test_a_model_paxlite_does_not_have_is_named(user_dir, tmp_path):
    moe = _HEADER.replace("tasks\n", "tasks\nfrom t5x.contrib.moe import models as moe\n")
    line = _run_bad(user_dir, tmp_path, moe)
    assert "t5x.contrib" in line and "not part of what paxlite runs" in line
    decoder_only = _HEADER + (
        "from t5x import models\nMODEL = @models.DecoderOnlyModel()\n"
        "models.DecoderOnlyModel:\n  module = None\n  vocabulary = None\n  optimizer_def = None\n"
    )
    line = _run_bad(user_dir, tmp_path, decoder_only)
    assert "DecoderOnlyModel" in line and "EncoderDecoderModel" in line


def test_a_value_paxlite_does_not_implement_names_its_line(user_dir, tmp_path):
    text = _HEADER + "from t5x import adafactor\nadafactor.Adafactor.weight_decay_rate = 0.1\n"
    line = _run_bad(user_dir, tmp_path, text)
    assert "Adafactor.weight_decay_rate = 0.1" in line and "bad.gin:8" in line


def test_t5x_s_multi_host_flags_are_paxlite_s():
    try:
        flags.FLAGS(
            [
                "paxlite.t5x.train",
                "--coordinator_address=10.0.0.1:1234",
                "--process_count=4",
                "--process_index=3",
                "--initialization_timeout=90",
            ]
        )
        command.join_flags()
        assert flags.FLAGS.coordinator_address == "10.0.0.1:1234"
        assert (flags.FLAGS.num_processes, flags.FLAGS.process_id) == (4, 3)
        assert flags.FLAGS.distributed_timeout_s == 90
    finally:
        flags.FLAGS.unparse_flags()


def test_help_and_gin_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse(["paxlite.t5x.train", "--help"])
    assert exit_info.value.code == 0
    assert "--gin_search_paths" in capsys.readouterr().out
    assert gin_run.rewrite_gin_args(["x", '--gin.MODEL_DIR="/m"', "--gin_file=a.gin"]) == [
        "x",
        '--gin_bindings=MODEL_DIR = "/m"',
        "--gin_file=a.gin",
    ]


def test_a_custom_network_module_is_named(user_dir, tmp_path):
    (user_dir / "my_net.py").write_text(
        "class Transformer:\n    def __init__(self, config=None):\n        pass\n"
    )
    text = _HEADER + (
        "import my_net\nfrom t5x import models\n"
        "models.EncoderDecoderModel.module = @my_net.Transformer()\n"
    )
    line = _run_bad(user_dir, tmp_path, text)
    assert "EncoderDecoderModel.module" in line and "network.Transformer" in line


def test_an_unknown_flag_and_a_gin_flag_without_a_value_are_one_line(capsys):
    for argv in (["--gin_fle=a.gin"], ["--gin.MODEL_DIR"]):
        with pytest.raises(SystemExit) as exit_info:
            train.parse(["paxlite.t5x.train", *argv])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("paxlite: error:"), lines


T5X_RUN = FIXTURES / "t5x" / "t5x_run"


def test_the_training_batches_are_t5x_s(monkeypatch):
    """Oracle: the first 6 batches T5X's own utils.get_dataset gave for the same gin files
    (tests/fixtures/t5x/t5x_run, tools/t5x_fixtures/make_t5x_run.py), by sha256."""
    user_dir = str(T5X_RUN / "user_dir")
    monkeypatch.syspath_prepend(user_dir)
    monkeypatch.setattr(t5x_modules, "_USERS_MODULES", {})
    own = registry.DEFAULT_SEARCH_PACKAGES
    t5x_modules.import_own_packages(own, REPO)  # As the command does, before the user's.
    try:
        run = gin_run.read_call(
            gin_run.TRAIN,
            ["finetune.gin"],
            ['MODEL_DIR = "/unused"', "INITIAL_CHECKPOINT_PATH = None"],
            [user_dir, str(gin_files.GIN_ROOT)],
            own,
        )
        knobs = translation.knobs(run.call, run.sources, run.config_text)
        experiment = with_overrides(registry.get(translation.EXPERIMENT, own), knobs)()
        inputs = config_lib.instantiate(experiment.datasets()[0])
        theirs = json.loads((T5X_RUN / "t5x_batches.json").read_text())["batches"]
        for index, expected in enumerate(theirs):
            batch = inputs.get_next()
            for key, meta in expected.items():
                ours = np.ascontiguousarray(np.asarray(batch[key]).astype(meta["dtype"]))
                assert hashlib.sha256(ours.tobytes()).hexdigest() == meta["sha256"], (index, key)
    finally:  # The user's module registered its task: gone for the next command's import.
        if "t5x_run_reverse" in seqio.TaskRegistry.names():
            seqio.TaskRegistry.remove("t5x_run_reverse")


MTF_PREFIX = FIXTURES / "mtf" / "t5_1_1" / "model.ckpt-1000"  # flan_legacy's weights, in MTF.


@pytest.mark.slow
def test_fine_tune_from_a_mesh_tensorflow_checkpoint_prefix(user_dir, tmp_path):
    """T5X's README: an MTF prefix (its .index beside it) as INITIAL_CHECKPOINT_PATH. The
    start, saved as checkpoint_1000 (T5X saves its start), is the MTF checkpoint's weights,
    step and Adafactor slots, read back by T5X's reader."""
    model_dir = tmp_path / "model"
    code, out, err = _fine_tune(
        user_dir,
        model_dir,
        MTF_PREFIX,
        "--gin.TRAIN_STEPS=1001",
        "--gin.train_script.train.infer_eval_dataset_cfg=None",  # No decoding: the start is
        "--gin.train_script.train.train_eval_dataset_cfg=None",  # what this test reads.
        "--gin.adafactor.Adafactor.min_dim_size_to_factor=32",
    )
    assert code == 0, err[-3000:]
    assert re.search(r"step\s+1001/1001", out), out[-2000:]
    assert _checkpoint_steps(model_dir) == [1000, 1001]
    start = checkpoint_sources.open_source(model_dir, step=1000)
    mtf = checkpoint_sources.open_source(MTF_PREFIX)
    pairs = {
        "encoder/layers_2/attention/query/kernel": "encoder/block_002/layer_000/SelfAttention/q",
        "decoder/logits_dense/kernel": "decoder/logits/kernel",
        "decoder/decoder_norm/scale": "decoder/rms_norm/scale",
    }
    for t5x_name, mtf_name in pairs.items():
        np.testing.assert_array_equal(
            start.read_whole(f"params/{t5x_name}"), mtf.read_whole(f"params/{mtf_name}")
        )
    assert int(start.read_whole("state/step")) == 1000
    # Adafactor's factors, through the run's optimizer state and out in T5X's layout: a
    # [32, 48] kernel's as they are; a square [32, 32] one's swapped (of two equal dims MTF's
    # _slot_vr keeps the second, T5X's v_row the first).
    slots = {
        ("encoder/layers_0/mlp/wi_0/kernel", "v_row"): (
            "encoder/block_000/layer_001/DenseReluDense/wi_0/kernel",
            "v_row",
        ),
        ("encoder/layers_0/mlp/wi_0/kernel", "v_col"): (
            "encoder/block_000/layer_001/DenseReluDense/wi_0/kernel",
            "v_col",
        ),
        ("decoder/layers_1/self_attention/query/kernel", "v_row"): (
            "decoder/block_001/layer_000/SelfAttention/q",
            "v_col",
        ),
        ("decoder/layers_1/self_attention/query/kernel", "v_col"): (
            "decoder/block_001/layer_000/SelfAttention/q",
            "v_row",
        ),
    }
    for (t5x_name, t5x_slot), (mtf_name, mtf_slot) in slots.items():
        np.testing.assert_array_equal(
            start.read_whole(f"state/param_states/{t5x_name}/{t5x_slot}"),
            mtf.read_whole(f"state/param_states/{mtf_name}/{mtf_slot}"),
            err_msg=f"{t5x_name}/{t5x_slot}",
        )


def test_t5x_s_readme_init_checkpoint_macro_names_initial_checkpoint_path(user_dir, tmp_path):
    """T5X's README sets INIT_CHECKPOINT, which no gin file uses: T5X would train from
    scratch in silence."""
    line = _run_bad(
        user_dir,
        tmp_path,
        "include 'finetune.gin'\n"
        "INIT_CHECKPOINT = 'gs://t5-data/pretrained_models/t5.1.1.base/model.ckpt-1000000'\n",
        f'--gin.INITIAL_CHECKPOINT_PATH="{FLAN_CHECKPOINT}"',
    )
    assert "INIT_CHECKPOINT (" in line and "binds nothing" in line
    assert "set INITIAL_CHECKPOINT_PATH" in line
