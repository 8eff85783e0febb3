"""Eval pass semantics: eval_loop_num_batches vs. run-to-exhaustion with reset, and the
metrics against a numpy computation over the same batches."""

import jax
import numpy as np
import pytest

from paxlite.evaluation.eval_lib import run_eval_pass
from praxis_lite.inputs.synthetic_input import SyntheticLmInput


def _sum_step(params, batch):
    ids = np.asarray(batch["ids"])
    return {"sums": {"loss": float(ids.sum())}, "weights": {"loss": float(ids.size)}}


def test_fixed_number_of_batches():
    inp = SyntheticLmInput(batch_size=2, seq_len=4, eval_loop_num_batches=3, is_training=False)
    metrics = run_eval_pass(_sum_step, None, inp, lambda b: b)
    assert metrics["num_batches"] == 3 and metrics["num_tokens"] == 24
    assert inp.get_state() == {"index": 3}  # not reset: the next pass continues


def test_reset_for_eval_runs_to_exhaustion_then_rewinds():
    inp = SyntheticLmInput(
        batch_size=2, seq_len=4, num_batches=5, reset_for_eval=True, is_training=False
    )
    first = run_eval_pass(_sum_step, None, inp, lambda b: b)
    second = run_eval_pass(_sum_step, None, inp, lambda b: b)
    assert first["num_batches"] == 5
    assert first == second


def test_a_repeating_reset_eval_reads_its_first_batches_each_pass():
    inp = SyntheticLmInput(
        batch_size=2,
        seq_len=4,
        eval_loop_num_batches=3,
        reset_for_eval=True,
        repeat=True,
        is_training=False,
    )
    first = run_eval_pass(_sum_step, None, inp, lambda b: b)
    assert first["num_batches"] == 3
    assert inp.get_state() == {"index": 0}  # rewound: the next pass reads the same batches
    assert run_eval_pass(_sum_step, None, inp, lambda b: b) == first


class _ScoredInput(SyntheticLmInput):
    """Synthetic eval input whose task has a score metric; row 0 is padding."""

    def get_next(self):
        batch = super().get_next()
        batch.weights[0] = 0.0
        batch.labels[0] = 0
        return batch

    @property
    def score_metric_fns(self):
        def mean_score(targets, scores):
            _ScoredInput.seen = (list(targets), list(scores))
            return {"num_scored": len(scores), "mean_score": float(np.mean(scores))}

        return (mean_score,)


def _tiny_lm_task():
    from paxlite.experiments.base_experiment import with_overrides
    from paxlite.experiments.tasks_lib import Learner, SingleTask
    from praxis_lite import config as config_lib
    from praxis_lite.optim import optimizers
    from tasks.lm.synthetic import LmSyntheticTiny

    sizes = dict(NUM_LAYERS=1, MODEL_DIMS=16, HIDDEN_DIMS=32, NUM_HEADS=2, VOCAB_SIZE=64)
    knobs = {**sizes, "USE_REPEATED_LAYER": False, "ICI_MESH_SHAPE": (1, 1, 1)}
    model_cfg = with_overrides(LmSyntheticTiny, knobs)().model()
    return SingleTask(
        model=config_lib.instantiate(model_cfg),
        learner=Learner(optimizer=optimizers.Sgd(learning_rate=0.1)),
    )


class _PaddedInput(SyntheticLmInput):
    """Batch ``i`` has its last ``PADS[i]`` positions padded (paddings 1, weights 0)."""

    PADS = (0, 13, 2, 9)

    def get_next(self):
        batch = super().get_next()
        pad = self.PADS[self._index - 1]
        if pad:
            batch.paddings[:, -pad:] = 1.0
            batch.weights[:, -pad:] = 0.0
            batch.labels[:, -pad:] = 0
            batch.ids[:, -pad:] = 0
        return batch


@pytest.mark.slow
def test_loss_and_accuracy_are_token_weighted_over_the_pass():
    """Against numpy over the same batches: sum of per-token xent (and hits) over the real
    tokens of all batches, divided by the number of real tokens. The batches hold different
    numbers of real tokens, so a mean of per-batch means (or a sum over batches) differs."""
    from paxlite.train import pure_steps

    task = _tiny_lm_task()
    inp = _PaddedInput(
        batch_size=3, seq_len=16, num_batches=4, reset_for_eval=True, is_training=False
    )
    batches = [inp.get_next() for _ in range(4)]
    inp.reset()
    params = task.model.init(jax.random.key(0), batches[0])["params"]
    # Sharper logits than at init, so per-token losses (and the batches' means) spread.
    params = jax.tree_util.tree_map(lambda x: 4.0 * x, params)
    metrics = run_eval_pass(jax.jit(pure_steps.make_eval_step(task)), params, inp, lambda b: b)

    logits_fn = jax.jit(lambda p, b: task.model.apply({"params": p}, b, method="logits"))
    xent_sums, hit_sums, weight_sums = [], [], []
    for batch in batches:
        logits = np.asarray(logits_fn(params, batch), np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        xent = -np.take_along_axis(log_probs, batch.labels[..., None], -1)[..., 0]
        hits = logits.argmax(-1) == batch.labels
        xent_sums.append(np.sum(xent * batch.weights))
        hit_sums.append(np.sum(hits * batch.weights))
        weight_sums.append(np.sum(batch.weights))
    loss = sum(xent_sums) / sum(weight_sums)
    accuracy = sum(hit_sums) / sum(weight_sums)
    assert len(set(weight_sums)) == 4  # each batch has its own number of real tokens
    batch_mean = np.mean(np.divide(xent_sums, weight_sums))
    assert abs(batch_mean - loss) > 1e-3 * loss  # the test can tell the two apart
    assert metrics["num_batches"] == 4 and metrics["num_tokens"] == sum(weight_sums)
    np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["log_pplx"], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], accuracy, rtol=1e-5)
    assert 0 < accuracy < 1


@pytest.mark.slow
def test_score_metric_fns_get_every_real_example_once():
    import jax.numpy as jnp

    from paxlite.train import pure_steps

    task = _tiny_lm_task()
    inp = _ScoredInput(
        batch_size=3, seq_len=6, num_batches=2, reset_for_eval=True, is_training=False
    )
    first = inp.get_next()
    inp.reset()
    params = task.model.init(jax.random.key(0), first)["params"]
    eval_step = jax.jit(pure_steps.make_eval_step(task, per_example=True))
    metrics = run_eval_pass(eval_step, params, inp, lambda b: b)
    assert metrics["num_scored"] == 4  # 2 batches x 3 rows, minus the padded row 0 of each
    targets, scores = _ScoredInput.seen
    assert targets[0] == inp.ids_to_strings(first.labels[1:2])[0]
    out = task.model.apply({"params": params}, first)
    expected = -np.sum(np.asarray(out.per_token_xent) * first.weights, axis=-1)[1:]
    np.testing.assert_allclose(scores[:2], expected, rtol=1e-5)
    assert jnp.isfinite(metrics["mean_score"])
