"""T5xGin: the experiment a T5X run becomes (knobs set by paxlite.formats.t5x.translation)."""

from fractions import Fraction

import jax
import pytest

from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite import config as config_lib
from tasks.t5.t5x_gin import CONFIG_GIN, T5xGin


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
