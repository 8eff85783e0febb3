"""Mixtral-8x7B's shape: its parameter count (46.7B) and active weights a token (12.9B with the
embedding and output tables, the figures Mistral published), built without an array."""

import jax
import jax.numpy as jnp
import numpy as np

from paxlite.experiments.base_experiment import with_overrides
from praxis_lite import config as config_lib
from praxis_lite.py_utils import NestedMap
from tasks.moe.synthetic import Mixtral8x7BSynthetic


def test_mixtral_8x7b_has_mixtrals_parameters_and_active_weights():
    experiment = with_overrides(Mixtral8x7BSynthetic, {"MAX_SEQ_LEN": 16})()
    experiment.validate()
    model = config_lib.instantiate(experiment.task().model)
    ids = jnp.zeros((1, 16), jnp.int32)
    batch = NestedMap(ids=ids, labels=ids, weights=jnp.ones(ids.shape))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"]
    total = sum(
        int(np.prod(x.value.shape))
        for x in jax.tree_util.tree_leaves(shapes, is_leaf=lambda x: hasattr(x, "value"))
    )
    assert round(total / 1e9, 1) == 46.7
    counted = model.train_flops(batch)
    tables = 2 * 32000 * 4096  # the input embedding and the output projection
    assert round((counted.non_embedding_params + tables) / 1e9, 1) == 12.9
    assert "MoE 32/32 layers E=8 top-2 F=14336 dropless" in counted.description
