"""StackedTransformerRepeated (scanned) equals StackedTransformer (loop) with the same weights."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import instantiate
from praxis_lite.layers.activations import SiLU
from praxis_lite.layers.embedding_softmax import RotaryPositionalEmbedding
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformers import StackedTransformer
from tests.praxis_lite.layers import numpy_refs as ref

NUM_LAYERS = 3


def _stack_config(cls, **fields):
    cfg = cls.HParams.config(num_layers=NUM_LAYERS, **fields)
    block = cfg.block_tpl
    block.input_dims, block.hidden_dims, block.num_heads, block.num_kv_heads = 8, 16, 4, 2
    block.tr_atten_tpl.rotary_tpl = RotaryPositionalEmbedding.HParams.config()
    block.tr_fflayer_tpl.use_gated_activation = True
    block.tr_fflayer_tpl.activation_tpl = SiLU.HParams.config()
    return cfg


def _stacked_to_loop_params(repeated_params):
    """params['repeat']['block'][...] with a leading layer axis -> x_layers_{i}."""
    block = repeated_params["repeat"]["block"]
    return {
        f"x_layers_{i}": jax.tree_util.tree_map(lambda a, i=i: a[i], block)
        for i in range(NUM_LAYERS)
    }


def _inputs():
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))
    paddings = jnp.zeros((2, 5)).at[1, 3:].set(1.0)
    return x, paddings


def _loss_and_grad(module, x, paddings):
    def loss(p):
        y = module.apply({"params": p}, x, paddings=paddings)
        return jnp.sum(jnp.sin(y)), y

    # Jitted: one compile beats op-by-op dispatch of the gradient.
    return ref.fast_jit(jax.value_and_grad(loss, has_aux=True))


@functools.cache
def _loop_reference():
    """Shared by every policy (none changes the weights): the repeated stack's initial
    weights, and the loop's loss, output and gradients with the same weights."""
    x, paddings = _inputs()
    repeated = instantiate(_stack_config(StackedTransformerRepeated))
    r_params = nn.unbox(ref.fast_jit(repeated.init)(jax.random.key(0), x)["params"])
    loop = instantiate(_stack_config(StackedTransformer))
    l_params = _stacked_to_loop_params(r_params)
    l_structure = jax.tree_util.tree_structure(
        nn.unbox(jax.eval_shape(loop.init, jax.random.key(0), x)["params"])
    )
    return r_params, l_params, l_structure, _loss_and_grad(loop, x, paddings)(l_params)


@pytest.mark.slow
@pytest.mark.parametrize(
    "remat",
    [
        AutodiffCheckpointType.NONE,
        AutodiffCheckpointType.SAVE_NOTHING,
        AutodiffCheckpointType.SAVE_DOT_WITH_NO_BATCH_DIM,
        AutodiffCheckpointType.SAVE_EVERYTHING,
        *[p for p in AutodiffCheckpointType if p.name.startswith(("SAVE_Q", "SAVE_C", "SAVE_O"))],
        AutodiffCheckpointType.SAVE_DOT_FOR_MLPERF_200B,
        AutodiffCheckpointType.SAVE_ITERATION_INPUT,
        AutodiffCheckpointType.SAVE_TRANSFORMER_LAYER_OUTPUT,
        AutodiffCheckpointType.SAVE_DOT_EXCEPT_LOGITS_FFN1,
        AutodiffCheckpointType.SAVE_DOT_EXCEPT_LOGITS,
    ],
    ids=lambda p: p.name,
)
def test_repeated_equals_loop_outputs_and_gradients(remat, offload=False):
    repeated = instantiate(
        _stack_config(StackedTransformerRepeated, checkpoint_policy=remat, offload_to_host=offload)
    )
    x, paddings = _inputs()
    r_params, l_params, l_structure, ((l_loss, l_out), l_grad) = _loop_reference()
    abstract = jax.eval_shape(repeated.init, jax.random.key(0), x)["params"]
    boxed = abstract["repeat"]["block"]["self_attention"]["w_q"]
    assert boxed.names == ("layers", "embed", "heads", "head_dim")
    assert jax.tree_util.tree_structure(nn.unbox(abstract)) == jax.tree_util.tree_structure(
        r_params
    )
    assert jax.tree_util.tree_structure(l_params) == l_structure

    (r_loss, r_out), r_grad = _loss_and_grad(repeated, x, paddings)(r_params)
    np.testing.assert_allclose(r_out, l_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r_loss, l_loss, rtol=1e-5)
    for a, b in zip(
        jax.tree_util.tree_leaves(_stacked_to_loop_params(r_grad)),
        jax.tree_util.tree_leaves(l_grad),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_layers_differ_after_init():
    params = _loop_reference()[0]  # The repeated stack's initial weights.
    w = params["repeat"]["block"]["ff_layer"]["ffn_layer1"]["w"]
    assert w.shape == (NUM_LAYERS, 8, 16)
    assert not np.allclose(w[0], w[1])


@pytest.mark.parametrize("combine_qkv", [False, True])
def test_named_policies_find_their_activations_in_the_block(combine_qkv):
    """Pax's named policies keep attention activations by name: the names are in the forward."""
    cfg = _stack_config(
        StackedTransformerRepeated,
        checkpoint_policy=AutodiffCheckpointType.SAVE_DOT_FOR_MLPERF_200B,
    )
    if combine_qkv:  # one [3, D, N, H] weight needs as many key/value heads as query heads
        cfg.block_tpl.num_kv_heads = None
    cfg.block_tpl.tr_atten_tpl.combine_qkv = combine_qkv
    repeated = instantiate(cfg)
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))
    params = nn.unbox(jax.eval_shape(repeated.init, jax.random.key(0), x)["params"])
    jaxpr = str(jax.make_jaxpr(lambda p: repeated.apply({"params": p}, x))(params))
    projections = ["combined_qkv_proj"] if combine_qkv else ["query_proj", "key_proj", "value_proj"]
    block_names = ["context", "out_proj", "ffn1", "ffn2", "transformer_layer_out"]
    for name in [*projections, *block_names, "iteration_input"]:
        assert f"name={name}" in jaxpr, name


@pytest.mark.slow
def test_offloading_a_named_policy_to_host_gives_the_same_gradients():
    """Kept activations in pinned host memory (a no-op on CPU's one memory): same numbers."""
    test_repeated_equals_loop_outputs_and_gradients(
        AutodiffCheckpointType.SAVE_DOT_FOR_MLPERF_200B, offload=True
    )
    with pytest.raises(ValueError, match="names what it keeps"):
        AutodiffCheckpointType.SAVE_NOTHING.checkpoint_policy(offload_to_host=True)
