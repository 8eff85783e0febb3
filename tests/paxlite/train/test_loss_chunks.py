"""NUM_LOSS_CHUNKS: the output projection and the loss over chunks of the sequence train as
the whole logits do, under data, FSDP and tensor-parallel rules (the vocabulary split over
'mdl') on 8 fake devices and with gradient accumulation; bad counts are one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.train.test_grad_accum import SHARDED, _final_params

#: The cap and the z-loss on, so the chunks carry them too.
LOSS_KNOBS = {**SHARDED, "SOFTMAX_CAP_LOGITS": 5.0, "Z_LOSS_WEIGHT": 1e-3}


@pytest.mark.slow
def test_chunked_loss_trains_as_the_whole_logits_under_tensor_parallel_rules(tmp_path):
    exp = base_experiment.with_overrides(LmSyntheticTiny, {"NUM_LOSS_CHUNKS": 4})()
    assert exp.model().lm_tpl.softmax_tpl.num_chunks == 4
    whole, whole_run = _final_params(LmSyntheticTiny, tmp_path / "whole", **LOSS_KNOBS)
    chunked, chunked_run = _final_params(
        LmSyntheticTiny,
        tmp_path / "chunked",
        **LOSS_KNOBS,
        NUM_LOSS_CHUNKS=4,
        GRAD_ACCUM_STEPS=2,
    )
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    for (_, got), (_, want) in zip(chunked_run.history, whole_run.history, strict=True):
        for name in ("loss", "accuracy", "grad_norm"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("value, message", [(0, "at least 1"), (3, "does not divide MAX_SEQ_LEN")])
def test_bad_loss_chunk_counts_are_one_line(value, message):
    with pytest.raises(KnobError, match=message) as e:
        base_experiment.with_overrides(LmSyntheticTiny, {"NUM_LOSS_CHUNKS": value})()
    assert "\n" not in str(e.value)
