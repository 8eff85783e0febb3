"""T5xGin: the experiment a T5X run becomes (knobs set by paxlite.formats.t5x.translation)."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite import config as config_lib
from praxis_lite.layers import vocab_loss
from tasks.t5.t5x_gin import CONFIG_GIN, T5xGin, smoothing_over_all_classes


def test_batch_size_is_t5x_s_global_batch():
    experiment = with_overrides(T5xGin, {"BATCH_SIZE": 16})()
    assert experiment.global_batch_size(jax.device_count()) == 16
    assert experiment.infeed_batch_size() == 16
    assert experiment.infeed_batch_size(Fraction(8, jax.device_count())) == 8


def test_the_schedule_is_the_whole_rate_and_the_config_gin_is_kept():
    experiment = with_overrides(
        T5xGin,
        {"LR_FACTORS": "constant", "LEARNING_RATE": 1e-3, "T5X_CONFIG_GIN": "X = 1\n"},
    )()
    learner = config_lib.instantiate(experiment.learner())
    assert learner.optimizer.learning_rate == 1.0
    assert float(learner.optimizer.lr_schedule(7)) == pytest.approx(1e-3)
    assert experiment.job_texts()[CONFIG_GIN] == "X = 1\n"


def test_bad_factors_and_sampled_beams_are_refused():
    with pytest.raises(KnobError, match="LR_FACTORS"):
        with_overrides(T5xGin, {"LR_FACTORS": "constant * warmup"})()
    with pytest.raises(KnobError, match="NUM_DECODES=4 with SAMPLED_DECODING"):
        with_overrides(T5xGin, {"NUM_DECODES": 4, "SAMPLED_DECODING": True})()


def test_t5x_s_label_smoothing_has_t5x_s_gradients():
    """Oracle: T5X's smoothed cross entropy (label 1 - a, others a / (V - 1), minus the
    targets' entropy) written in numpy; the softmax's smoothing over all V classes gives the
    same gradients and a loss higher by that entropy."""
    a, vocab = 0.1, 7
    logits = np.array([[0.3, -1.2, 2.0, 0.1, 0.0, 1.1, -0.4]])
    label = 2
    soft = np.full(vocab, a / (vocab - 1))
    soft[label] = 1 - a
    log_softmax = logits - np.log(np.sum(np.exp(logits)))
    entropy = -np.sum(soft * np.log(soft))
    t5x_loss = -np.sum(soft * log_softmax) - entropy
    t5x_grad = np.exp(log_softmax) - soft

    b = smoothing_over_all_classes(a, vocab)

    def ours(raw):
        log_z, target, _ = vocab_loss.token_stats(raw, None, jnp.asarray([label]), 0.0, b)
        return jnp.sum(log_z - target)

    raw = jnp.asarray(logits, jnp.float32)
    assert float(ours(raw)) == pytest.approx(t5x_loss + entropy, rel=1e-5)
    np.testing.assert_allclose(jax.grad(ours)(raw), t5x_grad, rtol=1e-5, atol=1e-6)
    smoothed = with_overrides(T5xGin, {"LABEL_SMOOTHING": a, "VOCAB_SIZE": 256})().model()
    assert smoothed.encoder_decoder_tpl.softmax_tpl.label_smoothing == pytest.approx(a * 256 / 255)
