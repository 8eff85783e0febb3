"""LmTextTiny with VOCAB_PATH at a Hugging Face tokenizer directory whose id 0 is "!": the
loss counts every real token, the "!"s included."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from paxlite.runtime import partitioning
from praxis_lite import config as config_lib
from tasks.lm.text import TextFormat
from tests.praxis_lite.tokenizers.test_hf_tokenizer import write_bpe_dir
from tests.tasks.lm.test_text import experiment, write

DOCS = [f"wow!! doc {i}: the cat sat on the mat! ! hi !" for i in range(20)]


@pytest.mark.slow
def test_loss_counts_the_id_0_tokens(tmp_path):
    exp = experiment(
        TEXT_DATA_PATH=write(tmp_path, TextFormat.LINES, DOCS),
        VOCAB_PATH=write_bpe_dir(tmp_path / "tokenizer"),
        TEXT_TASK_NAME="text_hf",
        ICI_MESH_SHAPE=(1, 1, 1),
    )
    (train_cfg,) = exp.datasets()
    batch = partitioning.instantiate_input(train_cfg).get_next()
    real = batch.weights > 0
    assert (batch.labels[real] == 0).sum() >= 10  # "!" tokens, in the loss.
    assert real.all()  # Packed pieces of the concatenated documents: no padding.
    np.testing.assert_array_equal(batch.paddings, 1.0 - batch.weights)
    model = config_lib.instantiate(exp.task().model)

    @jax.jit
    def loss_and_tokens(batch):
        out = model.apply(model.init(jax.random.key(0), batch), batch)
        return out.metrics["total_loss"], out.num_tokens

    (loss, weight), num_tokens = loss_and_tokens(batch)
    assert np.isfinite(loss) and weight == num_tokens == batch.weights.size
