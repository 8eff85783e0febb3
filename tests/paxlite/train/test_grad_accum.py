"""GRAD_ACCUM_STEPS: a step's batch as K microbatches inside the step, gradients weighted by
tokens, one update: equal to K = 1 (fp32, no dropout) alone, sharded, and pipelined."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.experiments.tasks_lib import Learner, SingleTask
from paxlite.runtime.job import build_job
from paxlite.train import pure_steps, train_loop
from paxlite.train.train_state import TrainState
from praxis_lite import instantiate
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.lm import LanguageModel
from praxis_lite.optim.optimizers import Sgd
from praxis_lite.py_utils import NestedMap
from praxis_lite.sharding import FSDP_AND_TENSOR_PARALLEL_RULES
from tasks.lm.synthetic import LmSyntheticTiny, LmSyntheticTinyPipeline
from tests.paxlite.test_main import restore_params

BATCH, SEQ, VOCAB = 8, 8, 24
LR, FACTOR = 0.5, 100.0  # The SGD learning rate; a LOSS_NORMALIZING_FACTOR.


def _task(accum: int, loss_normalizing_factor: float | None = None) -> SingleTask:
    lm = TransformerLm.HParams.config(model_dims=16, vocab_size=VOCAB)
    lm.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(num_layers=2)
    block = lm.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads = 16, 32, 2
    model = instantiate(LanguageModel.HParams.config(lm_tpl=lm))
    # SGD: Adam's update of a weight whose gradient is zero up to rounding (a key bias under
    # softmax) is +-lr either way, which would hide the comparison.
    learner = Learner(
        optimizer=Sgd(learning_rate=LR, momentum=0.9),
        grad_accum_steps=accum,
        loss_normalizing_factor=loss_normalizing_factor,
    )
    return SingleTask(model=model, learner=learner)


def _batches(steps: int) -> list[NestedMap]:
    """Batches whose 4 microbatches (rows i, i + 4) hold very different numbers of tokens."""
    rng = np.random.default_rng(0)
    real_tokens = np.array([8, 7, 2, 1, 8, 6, 1, 1])  # Per row: part 0 has 16, part 3 has 2.
    paddings = (np.arange(SEQ)[None, :] >= real_tokens[:, None]).astype(np.float32)
    batches = []
    for _ in range(steps):
        ids, labels = (rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32) for _ in range(2))
        batches.append(NestedMap(ids=ids, labels=labels, paddings=paddings, weights=1.0 - paddings))
    return batches


def _train(
    accum: int,
    batches: list[NestedMap],
    start: TrainState,
    loss_normalizing_factor: float | None = None,
):
    task, key = _task(accum, loss_normalizing_factor), jax.random.key(0)
    step = jax.jit(pure_steps.make_train_step(task))
    state, history = start, []
    for batch in batches:
        state, metrics = step(state, batch, key)
        history.append(jax.device_get(metrics))
    return state, history


@pytest.fixture(scope="module")
def start() -> TrainState:
    """The initial state of every run here (batch 0 gives the shapes): the learner's
    accumulation and loss normalizing factor do not enter it, so one init serves every task."""
    task, batch = _task(1), _batches(1)[0]
    return jax.jit(lambda k: nn.unbox(pure_steps.make_init_fn(task)(k, batch)))(jax.random.key(0))


@pytest.fixture(scope="module")
def one_pass(start):
    """K = 1 over 3 batches, without a loss normalizing factor: the reference of the tests below
    (its first step is the run on ``_batches(1)``: the same first batch)."""
    return _train(1, _batches(3), start)


@pytest.mark.slow
def test_four_microbatches_equal_one_pass_weighted_by_tokens(start, one_pass):
    batches = _batches(3)
    one_state, one = one_pass
    four_state, four = _train(4, batches, start)
    for name in ("loss", "num_tokens", "grad_norm", "accuracy"):
        np.testing.assert_allclose(
            [m[name] for m in four], [m[name] for m in one], rtol=2e-5, err_msg=name
        )
    assert one[0]["num_tokens"] == 34
    four_leaves, one_leaves = jax.tree.leaves(four_state.params), jax.tree.leaves(one_state.params)
    for a, b in zip(four_leaves, one_leaves, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    # The token weighting matters here: the mean of the 4 parts' mean losses is another number.
    task = _task(1)
    part_loss = jax.jit(lambda p, rows: task.model.apply({"params": p}, rows).total_loss)
    part_means = [float(part_loss(start.params, _rows(batches[0], i))) for i in range(4)]
    assert abs(np.mean(part_means) - one[0]["loss"]) > 1e-2


@pytest.fixture(scope="module")
def first_update_of_the_summed_loss(start):
    """The params after one SGD step down the loss summed over batch 0's tokens / FACTOR
    (taken here from the model's own mean x weight), from the initial ones."""
    task, batch = _task(1), _batches(1)[0]

    def summed_over_factor(p):
        loss, weight = task.model.apply({"params": p}, batch).metrics["total_loss"]
        return loss * weight / FACTOR

    grads = jax.jit(jax.grad(summed_over_factor))(start.params)
    return jax.tree.map(lambda p, g: p - LR * g, start.params, grads)


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 4])
def test_a_loss_normalizing_factor_steps_down_the_summed_loss_over_it(
    accum, start, one_pass, first_update_of_the_summed_loss
):
    """T5X's LOSS_NORMALIZING_FACTOR F: the first update is -lr x the gradient of the loss
    summed over the batch's tokens / F, in one pass or in 4 microbatches of unequal tokens;
    the reported loss stays the mean."""
    expected = first_update_of_the_summed_loss
    state, history = _train(accum, _batches(1), start, loss_normalizing_factor=FACTOR)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    _, mean_history = one_pass
    np.testing.assert_allclose(history[0]["loss"], mean_history[0]["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        history[0]["grad_norm"], mean_history[0]["grad_norm"] * 34 / FACTOR, rtol=1e-5
    )


def _rows(batch: NestedMap, part: int) -> NestedMap:
    return NestedMap({k: v[part::4] for k, v in batch.items()})


SHARDED = {
    "ICI_MESH_SHAPE": (1, 2, 4),  # 'data' 2 x 'mdl' 4 on the 8 fake CPU devices.
    "LOGICAL_AXIS_RULES": FSDP_AND_TENSOR_PARALLEL_RULES,
    "PERCORE_BATCH_SIZE": 2,
    "NUM_TRAIN_STEPS": 3,
    "SUMMARY_INTERVAL_STEPS": 1,
    "CHECKPOINT_EVERY_N_STEPS": 3,
    "EVAL_INTERVAL_STEPS": 0,
}

PIPELINED = {k: v for k, v in SHARDED.items() if k not in ("ICI_MESH_SHAPE", "LOGICAL_AXIS_RULES")}


def _final_params(cls, job_dir, **knobs):
    exp = base_experiment.with_overrides(cls, knobs)()
    job = build_job(exp, exp.task(), exp.datasets(), job_dir)
    result = train_loop.run(job, peak_tflops=1.0)
    return restore_params(job_dir, knobs["NUM_TRAIN_STEPS"]), result


@pytest.mark.slow
@pytest.mark.parametrize(
    "cls, knobs",
    [
        (LmSyntheticTiny, SHARDED),  # Data, FSDP and tensor sharding.
        (LmSyntheticTinyPipeline, {**PIPELINED, "ICI_MESH_SHAPE": (2, 1, 2, 2)}),
    ],
    ids=["fsdp_tensor", "pipeline"],
)
def test_accumulation_composes_with_sharding_and_pipelining(tmp_path, cls, knobs):
    knobs = {**knobs, "NUM_TRAIN_STEPS": 2, "CHECKPOINT_EVERY_N_STEPS": 2}  # Two updates show it.
    one, one_run = _final_params(cls, tmp_path / "one", **knobs)
    four, four_run = _final_params(cls, tmp_path / "four", **knobs, GRAD_ACCUM_STEPS=4)
    for a, b in zip(jax.tree.leaves(four), jax.tree.leaves(one), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # Summaries count the whole step: its tokens, and the same loss.
    (_, s1), (_, s4) = one_run.history[-1], four_run.history[-1]
    assert s4["num_tokens"] == s1["num_tokens"]
    np.testing.assert_allclose(s4["loss"], s1["loss"], rtol=1e-5)


@pytest.mark.parametrize("value, message", [(0, "at least 1"), (3, "GRAD_ACCUM_STEPS=3")])
def test_bad_grad_accum_steps_are_one_line(value, message):
    with pytest.raises(KnobError, match=message) as e:
        base_experiment.with_overrides(LmSyntheticTiny, {**SHARDED, "GRAD_ACCUM_STEPS": value})()
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_the_compile_report_shows_temp_memory_falling_with_more_microbatches():
    """On the 8 fake CPU devices: a batch large enough that activations dominate."""
    from paxlite.cli import overrides
    from paxlite.perf import aot

    temps = []
    for steps in (1, 4):
        sets = ["ICI_MESH_SHAPE=1,8,1", "PERCORE_BATCH_SIZE=16", "MAX_SEQ_LEN=256"]
        sets.append(f"GRAD_ACCUM_STEPS={steps}")
        cls = overrides.resolve_experiment_class("tasks.lm.synthetic.LmSyntheticTiny", sets)
        exp = cls()
        task_cfg, dataset_cfgs, _ = overrides.resolve_configs(exp, [], [])
        job = aot.build_compile_job(exp, task_cfg, dataset_cfgs, None)
        temps.append(aot.compile_train_step(job)["temp_bytes_per_device"])
    assert temps[1] < 0.6 * temps[0], temps
