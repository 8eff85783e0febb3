"""paxlite's copies of T5X's standard gin files: they bind what T5X's bind, and each runs.

Oracle: what T5X's own files bind (tests/fixtures/t5x/gin_bindings.json, written by
tools/t5x_fixtures/make_gin_bindings.py from a T5X source tree), every value with its
macros resolved.
"""

import ast
import json

import numpy as np
import pytest
import seqio

from paxlite.experiments import base_experiment
from paxlite.formats.t5x import gin_files, gin_run, gin_sources, translation
from tasks.t5.t5x_gin import T5xGin
from tests import FIXTURES

T5X_BINDINGS = json.loads((FIXTURES / "t5x" / "gin_bindings.json").read_text())
SPM = str(FIXTURES / "t5x" / "user_dir" / "spiece.model")


def test_paxlite_has_t5x_s_run_model_and_example_files():
    files = gin_files.standard_files()
    assert sorted(T5X_BINDINGS) == files
    for name in ("tiny", "small", "base", "large", "xl", "xxl"):
        assert f"t5x/examples/t5/t5_1_1/{name}.gin" in files
    runs = ("pretrain", "finetune", "eval", "infer")
    assert {f"t5x/configs/runs/{run}.gin" for run in runs} <= set(files)


@pytest.mark.parametrize("path", sorted(T5X_BINDINGS))
def test_each_copy_binds_what_t5x_s_file_binds(path):
    ours = gin_sources.read_sources([path], [], [str(gin_files.GIN_ROOT)])
    assert gin_sources.resolved_bindings(ours) == T5X_BINDINGS[path]


_RUNNABLE = [p for p in sorted(T5X_BINDINGS) if "/examples/t5/t5_1_1/examples/" in p]


@pytest.mark.parametrize("path", _RUNNABLE)
def test_each_example_run_reads_into_knobs(path, tmp_path):
    """Every example reads through gin (T5's tasks included) and every binding it makes is
    one paxlite honours."""
    run = gin_run.read_call(
        gin_run.TRAIN,
        [path],
        [f'MODEL_DIR = "{tmp_path}"'],
        [str(gin_files.GIN_ROOT)],
        spm_path=SPM,
    )
    knobs = translation.knobs(run.call, run.sources, run.config_text)
    t5x = T5X_BINDINGS[path]
    assert knobs["MIXTURE_OR_TASK_NAME"] == json.loads(
        t5x["train/utils.DatasetConfig.mixture_or_task_name"].replace("'", '"')
    )
    assert knobs["MODEL_DIMS"] == int(t5x["network.T5Config.emb_dim"])
    partitions = int(t5x.get("partitioning.PjitPartitioner.num_partitions", "1"))
    submesh = t5x.get("partitioning.PjitPartitioner.model_parallel_submesh", "None")
    if submesh != "None":  # It wins over num_partitions, as in T5X.
        partitions = int(np.prod(ast.literal_eval(submesh)))
    assert knobs["ICI_MESH_SHAPE"] == (1, -1, partitions)
    decodes = t5x.get("models.EncoderDecoderModel.predict_batch_with_aux.num_decodes", "1")
    assert knobs["NUM_DECODES"] == int(decodes)
    # The knobs as the command passes them (text), to the experiment and its inputs.
    knobs.pop("INIT_FROM", None)  # T5X's gs:// checkpoints: not read here.
    settings = [f"{name}={translation.knob_text(value)}" for name, value in knobs.items()]
    experiment = base_experiment.apply_knob_overrides(T5xGin, settings)()
    assert experiment.datasets()[0].mixture_name == knobs["MIXTURE_OR_TASK_NAME"]
    assert experiment.task().model is not None


def test_paxlite_s_own_files_are_apart_from_t5x_s():
    assert gin_files.own_files() == ["paxlite/tiny_reverse.gin"]
    assert not set(gin_files.own_files()) & set(gin_files.standard_files())


@pytest.mark.parametrize("path", gin_files.own_files())
def test_each_own_file_reads_into_knobs(path, tmp_path):
    """paxlite's own runs read through gin with nothing on PYTHONPATH: their task module is
    the package's, and every binding they make is one paxlite honours."""
    run = gin_run.read_call(
        gin_run.TRAIN, [path], [f'MODEL_DIR = "{tmp_path}"'], [str(gin_files.GIN_ROOT)]
    )
    knobs = translation.knobs(run.call, run.sources, run.config_text)
    assert seqio.get_mixture_or_task(knobs["MIXTURE_OR_TASK_NAME"])  # Imported while read.
    assert knobs["ICI_MESH_SHAPE"] == (1, -1, 1)
    settings = [f"{name}={translation.knob_text(value)}" for name, value in knobs.items()]
    experiment = base_experiment.apply_knob_overrides(T5xGin, settings)()
    assert experiment.datasets()[0].mixture_name == knobs["MIXTURE_OR_TASK_NAME"]
    assert experiment.task().model is not None
