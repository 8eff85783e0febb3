"""TransformerLm initializes directly sharded on an 8-device CPU mesh, per a golden file.

The golden file (``golden/transformer_lm_sharding.json``: every parameter's PartitionSpec) is
never written by the test: a missing or different file fails. After a deliberate change to the
sharding, regenerate it with

    python -m tests.praxis_lite.test_sharding --update

and review its diff before committing it.
"""

import json
import pathlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from praxis_lite import instantiate
from praxis_lite.layers.embedding_softmax import RotaryPositionalEmbedding
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.sharding import sharded_init

GOLDEN = pathlib.Path(__file__).parent / "golden" / "transformer_lm_sharding.json"
UPDATE_COMMAND = "python -m tests.praxis_lite.test_sharding --update"
RULES = (
    ("batch", "data"),
    ("embed", "data"),
    ("mlp", "mdl"),
    ("heads", "mdl"),
    ("kv_heads", "mdl"),
)


def _lm_config():
    cfg = TransformerLm.HParams.config(model_dims=16, vocab_size=64)
    cfg.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(num_layers=2)
    block = cfg.stacked_transformer_tpl.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads, block.num_kv_heads = 16, 32, 4, 4
    block.tr_atten_tpl.rotary_tpl = RotaryPositionalEmbedding.HParams.config()
    return cfg


def _spec_table(tree) -> dict[str, str]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): str(tuple(leaf.sharding.spec)) for path, leaf in flat}


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(1, 2, 4), ("replica", "data", "mdl"))


def _init_fn(key):
    ids = jnp.zeros((4, 8), jnp.int32)
    return instantiate(_lm_config()).init(key, ids, labels=ids)


@pytest.mark.optimized  # Two programs' numbers equal to 1e-6: as compiled for users.
@pytest.mark.slow
def test_transformer_lm_initializes_sharded_as_golden():
    assert jax.device_count() == 8
    variables, shardings = sharded_init(_init_fn, _mesh(), RULES, jax.random.key(0))
    params = variables["params"]

    # Every array came out of the jitted init already split over its shards.
    w_q = params["transformer"]["repeat"]["block"]["self_attention"]["w_q"]
    assert w_q.shape == (2, 16, 4, 4)
    assert w_q.sharding.spec == PartitionSpec(None, "data", "mdl", None)
    assert {s.data.shape for s in w_q.addressable_shards} == {(2, 8, 1, 4)}
    w1 = params["transformer"]["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    assert w1.sharding.spec == PartitionSpec(None, "data", "mdl")
    for leaf in jax.tree_util.tree_leaves(params):
        assert len(leaf.addressable_shards) == 8

    # The whole table matches the golden file, which only UPDATE_COMMAND writes.
    assert GOLDEN.exists(), f"The golden file {GOLDEN} is missing; write it with {UPDATE_COMMAND}"
    assert _spec_table(params) == json.loads(GOLDEN.read_text()), (
        f"The shardings differ from {GOLDEN}. If the change is intended, rewrite it with "
        f"{UPDATE_COMMAND} and review its diff."
    )

    # Init under shardings gives the same numbers as a plain single-device init.
    plain = nn.unbox(_init_fn(jax.random.key(0))["params"])
    for a, b in zip(
        jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(plain), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


@pytest.mark.slow
def test_activation_constraints_are_noops_without_a_mesh():
    model = instantiate(_lm_config())
    ids = jnp.ones((2, 8), jnp.int32)
    with nn.logical_axis_rules(RULES):
        variables = model.init(jax.random.key(0), ids)
        out = model.apply(variables, ids)
    assert out.logits.shape == (2, 8, 64)


def _update_golden() -> None:
    """Rewrites the golden file from the current code, on 8 CPU devices like the tests."""
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 8)
    variables, _ = sharded_init(_init_fn, _mesh(), RULES, jax.random.key(0))
    GOLDEN.write_text(json.dumps(_spec_table(variables["params"]), indent=1, sort_keys=True) + "\n")
    print(f"Wrote {GOLDEN}; review its diff (git diff {GOLDEN.parent}) before committing it.")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE_COMMAND}")
    _update_golden()
