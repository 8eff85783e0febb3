"""Frozen parameters (praxis's bprop_variable_inclusion / exclusion): no update, no
optimizer state, one-line errors for regexes that fit nothing or everything."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from paxlite.experiments import base_experiment
from paxlite.experiments.tasks_lib import Learner, SingleTask
from paxlite.perf import aot
from paxlite.runtime import partitioning
from paxlite.runtime.job import build_job
from paxlite.train import pure_steps, train_setup, trainable
from praxis_lite import instantiate
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.lm import LanguageModel
from praxis_lite.optim.optimizers import Adam
from praxis_lite.sharding import FSDP_AND_TENSOR_PARALLEL_RULES
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import main_in_process
from tests.paxlite.train.test_pure_steps import _batch, _jit

EMBEDDING = r"params/lm/(embedding|softmax)/.*"


def _task(**learner_fields) -> SingleTask:
    lm = TransformerLm.HParams.config(model_dims=16, vocab_size=24)
    lm.stacked_transformer_tpl.num_layers = 2
    lm.stacked_transformer_tpl.block_tpl.input_dims = 16
    lm.stacked_transformer_tpl.block_tpl.hidden_dims = 32
    lm.stacked_transformer_tpl.block_tpl.num_heads = 2
    model = instantiate(LanguageModel.HParams.config(lm_tpl=lm))
    learner = Learner(optimizer=Adam(learning_rate=0.1), **learner_fields)
    return SingleTask(model=model, learner=learner)


def _steps(task: SingleTask, num_steps: int = 2):
    batch, key = _batch(), jax.random.key(0)
    state = _jit(lambda k: nn.unbox(pure_steps.make_init_fn(task)(k, batch)))(key)
    step = _jit(pure_steps.make_train_step(task))
    first = jax.device_get(state)
    for _ in range(num_steps):
        state, metrics = step(state, batch, key)
    return first, jax.device_get(state), metrics


def _nbytes(tree) -> int:
    return sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree))


def _flat(params) -> dict[str, np.ndarray]:
    return traverse_util.flatten_dict(params, sep="/")


@pytest.mark.slow
@pytest.mark.parametrize(
    "fields",
    [
        dict(bprop_variable_exclusion=EMBEDDING),
        dict(bprop_variable_inclusion=[r".*/x_layers_1/.*", r".*/final_ln/.*"]),
    ],
)
def test_frozen_parameters_keep_their_bits_and_get_no_optimizer_state(fields):
    first, last, metrics = _steps(_task(**fields))
    _, whole, _ = _steps(_task())
    names = [f"params/{p}" for p in _flat(first.params)]
    trained = trainable.trainable_names(
        names,
        fields.get("bprop_variable_inclusion", ()),
        fields.get("bprop_variable_exclusion", ()),
    )
    assert 0 < len(trained) < len(names)
    for path, before in _flat(first.params).items():
        after = _flat(last.params)[path]
        if f"params/{path}" in trained:
            assert not np.array_equal(before, after), path
        else:
            np.testing.assert_array_equal(before, after, err_msg=path)  # Bit for bit.
    assert np.isfinite(metrics["grad_norm"])
    # Adam's two moments for the trained parameters only.
    opt_bytes = _nbytes(last.opt_state)
    trained_bytes = sum(v.nbytes for p, v in _flat(last.params).items() if f"params/{p}" in trained)
    assert opt_bytes < _nbytes(whole.opt_state)
    assert trained_bytes * 2 <= opt_bytes < trained_bytes * 2 + 64


def test_no_freezing_keeps_the_optimizer_state_of_every_parameter():
    first, last, _ = _steps(_task(), num_steps=1)
    assert _nbytes(last.opt_state) >= 2 * _nbytes(last.params)
    assert all(not np.array_equal(v, _flat(last.params)[p]) for p, v in _flat(first.params).items())


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(bprop_variable_exclusion=r".*/no_such_layer/.*"), "matches no parameter"),
        (dict(bprop_variable_inclusion=r"params/.*"), "matches every parameter"),
        (
            dict(
                bprop_variable_exclusion=[r".*/x_layers_.*", r".*/(embedding|softmax|final_ln)/.*"]
            ),
            "freezes every parameter",
        ),
    ],
)
def test_regexes_that_fit_nothing_or_everything_are_errors(fields, message):
    with pytest.raises(trainable.FreezeError, match=message):
        _steps(_task(**fields), num_steps=0)


def test_inclusion_and_exclusion_together_is_an_error():
    with pytest.raises(trainable.FreezeError, match="set one"):
        Learner(
            optimizer=Adam(learning_rate=0.1),
            bprop_variable_inclusion=".*a.*",
            bprop_variable_exclusion=".*b.*",
        )


def test_the_compile_report_counts_the_frozen_parameters_out_of_the_optimizer(tmp_path):
    overrides = {"ICI_MESH_SHAPE": (1, 4, 2), "LOGICAL_AXIS_RULES": FSDP_AND_TENSOR_PARALLEL_RULES}
    exp = base_experiment.with_overrides(LmSyntheticTiny, overrides)()

    def abstract_state(**learner_fields):
        task = exp.task()
        for name, value in learner_fields.items():
            setattr(task.learner, name, value)
        job = build_job(exp, task, exp.datasets(), tmp_path / str(len(learner_fields)))
        with job.scope():  # What aot.compile_train_step measures, without compiling.
            state = train_setup.init_or_restore(job, train_setup.StateSource.ABSTRACT).state
        return job, state

    (_, whole), (job, frozen) = abstract_state(), abstract_state(bprop_variable_exclusion=EMBEDDING)
    trained = aot._trained_params(job, frozen.params)
    total = sum(x.size for x in jax.tree_util.tree_leaves(frozen.params))
    assert 0 < trained < total
    whole_bytes = partitioning.per_device_bytes(whole.opt_state)
    frozen_bytes = partitioning.per_device_bytes(frozen.opt_state)
    assert frozen_bytes < whole_bytes
    assert frozen_bytes / whole_bytes == pytest.approx(trained / total, abs=0.03)
    figures = dict(
        num_devices=8,
        mesh={},
        num_params=total,
        trained_params=trained,
        global_batch=8,
        params_bytes_per_device=1,
        opt_state_bytes_per_device=frozen_bytes,
    )
    assert "trained parameters" in aot.format_report("tiny", figures)
    assert "trained parameters" not in aot.format_report(
        "tiny", {**figures, "trained_params": total}
    )


def test_a_regex_matching_nothing_is_one_line_from_main(tmp_path):
    code, err = main_in_process(
        f"--job_log_dir={tmp_path}",
        "--mode=train",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--fdl_set=task.learner.bprop_variable_inclusion='.*/nothing_like_this'",
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("paxlite: error: ") and "matches no parameter" in lines[-1]
    assert "Traceback" not in err
