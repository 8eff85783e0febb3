"""The train step: layers' aux losses join the differentiated loss, summaries become metrics.

Through the plain scanned stack and the pipelined stack (where they are recorded inside
the pipeline's stages), with the same weights.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlite.experiments.tasks_lib import Learner, SingleTask
from paxlite.train import pure_steps
from praxis_lite import instantiate
from praxis_lite.base_layer import AUX_LOSS, SUMMARIES, summaries_and_aux_losses
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.models.lm import LanguageModel
from praxis_lite.optim.optimizers import Sgd
from praxis_lite.py_utils import NestedMap
from tests.praxis_lite.layers.test_pipeline import _RecordingBlock

LR = 0.5
_FAST_COMPILE = {"xla_backend_optimization_level": 0}  # Tiny programs: compile time dominates.
SUMMARY = "summaries/lm/transformer/repeat/block/output_mean"


def _recording_block():
    block = _RecordingBlock.HParams.config()
    block.input_dims, block.hidden_dims, block.num_heads = 16, 32, 2
    return block


def _task(stack: str) -> SingleTask:
    """A 2-layer LM whose blocks record an aux loss and a summary; plain or 2-stage pipeline."""
    lm = TransformerLm.HParams.config(model_dims=16, vocab_size=24)
    if stack == "repeated":
        lm.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(
            num_layers=2, block_tpl=_recording_block()
        )
    else:
        lm.stacked_transformer_tpl = LayerwiseShardablePipelined.HParams.config(
            num_stages=2, num_microbatches=2
        )
        lm.stacked_transformer_tpl.stage_tpl.num_layers = 1
        lm.stacked_transformer_tpl.stage_tpl.block_tpl = _recording_block()
    model = instantiate(LanguageModel.HParams.config(lm_tpl=lm))
    return SingleTask(model=model, learner=Learner(optimizer=Sgd(learning_rate=LR)))


def _batch() -> NestedMap:
    rng = np.random.default_rng(0)
    ids, labels = (jnp.asarray(rng.integers(0, 24, (4, 8)), jnp.int32) for _ in range(2))
    return NestedMap(ids=ids, labels=labels, paddings=jnp.zeros((4, 8)), weights=jnp.ones((4, 8)))


def _jit(fn):
    return jax.jit(fn, compiler_options=_FAST_COMPILE)


@pytest.fixture(scope="module")
def plain_step():
    """The plain stack's initial state, and its first step's new state and metrics."""
    task, batch, key = _task("repeated"), _batch(), jax.random.key(0)
    init = lambda k: nn.unbox(pure_steps.make_init_fn(task)(k, batch))  # noqa: E731
    state = _jit(init)(key)
    return state, *_jit(pure_steps.make_train_step(task))(state, batch, key)


@pytest.mark.slow
def test_aux_loss_is_added_to_the_objective_and_summaries_are_metrics(plain_step):
    state, new_state, metrics = plain_step
    model, batch = _task("repeated").model, _batch()

    def objective(params):
        out, mutables = model.apply(
            {"params": params}, batch, train=True, mutable=[SUMMARIES, AUX_LOSS]
        )
        return out.total_loss + summaries_and_aux_losses(mutables)[1]

    grads = _jit(jax.grad(objective))(state.params)
    want = jax.tree_util.tree_map(lambda p, g: p - LR * g, state.params, grads)
    for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(metrics["aux_loss"]) > 0.1  # Mean squares of unit-scale activations.
    assert np.isfinite(float(metrics[SUMMARY])) and float(metrics[SUMMARY]) != 0.0


@pytest.mark.slow
def test_pipelined_stages_report_the_plain_stacks_aux_loss_and_summaries(plain_step):
    state, new_state, metrics = plain_step
    pipelined = _task("pipelined")  # GPipe weights are stored like the plain stack's.
    p_state, p_metrics = _jit(pure_steps.make_train_step(pipelined))(
        state, _batch(), jax.random.key(0)
    )
    for name in ("loss", "aux_loss", SUMMARY):
        np.testing.assert_allclose(p_metrics[name], metrics[name], rtol=1e-5, err_msg=name)
    for a, b in zip(
        jax.tree.leaves(p_state.params), jax.tree.leaves(new_state.params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
