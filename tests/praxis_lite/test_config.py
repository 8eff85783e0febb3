"""The Fiddle API of layers: HParams.config/partial, typos, templates, sharing, JSON (and
the JSON earlier versions wrote)."""

import json

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite import config as config_lib
from praxis_lite import instantiate
from praxis_lite.base_layer import BaseLayer
from praxis_lite.config import template_field
from praxis_lite.layers import activations
from praxis_lite.layers.attentions import AttentionImpl, DotProductAttention, QueryScale
from praxis_lite.layers.linears import FeedForward, Linear
from praxis_lite.layers.normalizations import LayerNorm
from praxis_lite.layers.transformers import Transformer
from tests.praxis_lite.layers.numpy_refs import fast_jit


def _params(variables):
    return jax.tree_util.tree_map(np.asarray, fdl_unbox(variables["params"]))


def fdl_unbox(tree):
    import flax.linen as nn

    return nn.unbox(tree)


def test_hparams_config_and_partial():
    cfg = Linear.HParams.config(input_dims=1, output_dims=1)
    assert isinstance(cfg, fdl.Config)
    assert cfg.input_dims == 1 and cfg.__fn_or_cls__ is Linear
    part = Linear.HParams.partial(input_dims=3)
    assert isinstance(part, fdl.Partial)
    layer = fdl.build(part)(output_dims=5)
    assert isinstance(layer, Linear) and (layer.input_dims, layer.output_dims) == (3, 5)


def test_typo_in_field_raises_at_once_with_did_you_mean():
    cfg = Linear.HParams.config(input_dims=1, output_dims=1)
    with pytest.raises(AttributeError, match=r"no field 'input_dimz'.*Did you mean 'input_dims'"):
        cfg.input_dimz = 31337
    with pytest.raises(AttributeError, match="Valid fields: input_dims, output_dims"):
        Linear.HParams.config(outptu_dims=2)
    with pytest.raises(AttributeError, match="Did you mean 'output_dims'"):
        _ = cfg.output_dimz


def test_templates_are_prefilled_and_swappable():
    cfg = FeedForward.HParams.config(input_dims=3, output_dims=4)
    assert cfg.linear_tpl.__fn_or_cls__ is Linear
    assert cfg.activation_tpl.__fn_or_cls__ is activations.ReLU
    cfg.activation_tpl = activations.Tanh.HParams.config()
    layer = instantiate(cfg)
    x = jnp.arange(6.0).reshape(2, 3) - 2.0
    variables = layer.init(jax.random.key(0), x)
    p = _params(variables)
    expected = np.tanh(np.asarray(x) @ p["linear"]["w"] + p["bias"]["b"])
    np.testing.assert_allclose(layer.apply(variables, x), expected, rtol=1e-5, atol=1e-6)


def test_user_defined_layer_swaps_into_a_template():
    class ScaledLinear(Linear):
        """Linear times a fixed factor (a user's own layer class)."""

        factor: float = 2.0

        def __call__(self, x):
            return super().__call__(x) * self.factor

    cfg = FeedForward.HParams.config(input_dims=2, output_dims=2, use_bias=False)
    cfg.linear_tpl = ScaledLinear.HParams.config(factor=3.0)
    cfg.activation_tpl = activations.Identity.HParams.config()
    layer = instantiate(cfg)
    x = jnp.ones((1, 2))
    variables = layer.init(jax.random.key(0), x)
    w = _params(variables)["linear"]["w"]
    np.testing.assert_allclose(layer.apply(variables, x), 3.0 * np.asarray(x) @ w, rtol=1e-6)


@pytest.mark.slow
def test_shared_config_is_one_layer_with_one_set_of_weights():
    cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2)
    shared_ln = LayerNorm.HParams.config()
    cfg.ln_tpl = shared_ln
    cfg.tr_fflayer_tpl.ln_tpl = shared_ln
    layer = instantiate(cfg)
    x = jax.random.normal(jax.random.key(1), (2, 4, 8))
    variables = fast_jit(layer.init)(jax.random.key(0), x)
    params = variables["params"]
    assert "layer_norm" in params and "layer_norm" not in params["ff_layer"]

    # Gradient of the shared scale = sum of the gradients of two separate norms.
    unshared_cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2)
    unshared = instantiate(unshared_cfg)
    u_params = fdl_unbox(fast_jit(unshared.init)(jax.random.key(0), x)["params"])
    s_params = fdl_unbox(params)
    u_params["self_attention"] = s_params["self_attention"]
    u_params["ff_layer"].update({k: v for k, v in s_params["ff_layer"].items()})
    u_params["layer_norm"] = s_params["layer_norm"]
    u_params["ff_layer"]["layer_norm"] = s_params["layer_norm"]

    def loss(module, p):
        return jnp.sum(module.apply({"params": p}, x) ** 2)

    # Jitted: one compile each beats op-by-op dispatch of the gradients.
    s_loss, g_shared = fast_jit(jax.value_and_grad(lambda p: loss(layer, p)))(s_params)
    u_loss, g_two = fast_jit(jax.value_and_grad(lambda p: loss(unshared, p)))(u_params)
    np.testing.assert_allclose(s_loss, u_loss, rtol=1e-5)
    g_shared = g_shared["layer_norm"]["scale"]
    expected = g_two["layer_norm"]["scale"] + g_two["ff_layer"]["layer_norm"]["scale"]
    np.testing.assert_allclose(g_shared, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_unshared_copies_make_separate_layers():
    cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2)
    layer = instantiate(cfg)
    params = layer.init(jax.random.key(0), jnp.ones((1, 2, 8)))["params"]
    assert "layer_norm" in params["ff_layer"]


def test_missing_field_names_layer_and_field():
    with pytest.raises(TypeError, match=r"Linear.*output_dims"):
        instantiate(Linear.HParams.config(input_dims=2))

    class Holder(BaseLayer):
        sub_tpl: object = template_field(Linear)

        def setup(self):
            self.sub = self.create_child(self.sub_tpl, input_dims=2)

        def __call__(self, x):
            return self.sub(x)

    with pytest.raises(TypeError, match=r"Holder.*sub_tpl.*Linear.*output_dims"):
        instantiate(Holder.HParams.config()).init(jax.random.key(0), jnp.ones((1, 2)))


def test_config_prints_and_round_trips_through_json():
    cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2, num_kv_heads=1)
    cfg.tr_fflayer_tpl.activation_tpl = activations.GELU.HParams.config(approximate=True)
    cfg.fprop_dtype = jnp.bfloat16
    text = str(cfg)
    assert "Transformer" in text and "num_heads=2" in text
    restored = config_lib.from_json(config_lib.to_json(cfg))
    assert restored == cfg
    assert restored.tr_fflayer_tpl.activation_tpl.approximate is True
    layer = instantiate(restored)
    assert layer.num_kv_heads == 1


def test_set_dtypes_sets_every_layer_explicitly():
    cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2)
    config_lib.set_dtypes(cfg, fprop_dtype=jnp.bfloat16)
    assert cfg.tr_atten_tpl.fprop_dtype == jnp.bfloat16
    assert cfg.tr_fflayer_tpl.ln_tpl.fprop_dtype == jnp.bfloat16
    layer = instantiate(cfg)
    x = jnp.ones((1, 3, 8))
    variables = layer.init(jax.random.key(0), x)
    assert all(v.dtype == jnp.float32 for v in jax.tree_util.tree_leaves(fdl_unbox(variables)))
    assert layer.apply(variables, x).dtype == jnp.bfloat16


class _SubclassedAttention(DotProductAttention):
    """A user's subclass: the rules of its base class hold for it."""


def _as_written_before(text: str, then: dict[str, tuple[str, object]]) -> str:
    """``text`` (config JSON) with each value that ``then`` names (an enum member,
    ``"QueryScale.PER_DIM"``) written as an earlier version did: ``(field, value)``."""
    tree = json.loads(text)
    objects = tree["objects"]
    for obj in list(objects.values()):
        metadata = obj.get("metadata")
        if not (isinstance(metadata, dict) and metadata.get("type") == "ref"):
            continue
        names_ref = dict(objects[metadata["key"]]["items"]).get("Attr(name='argument_names')")
        for index, item in enumerate(obj["items"]):
            if isinstance(item[1], dict) and item[1].get("name") in then:
                field, value = then[item[1]["name"]]
                item[:] = [f"Attr(name={field!r})", {"type": "leaf", "value": value, "paths": []}]
                objects[names_ref["key"]]["items"][index][1] = field
    return json.dumps(tree)


def test_a_config_json_of_earlier_field_names_builds_as_todays():
    """Before one field scaled the queries and attention_impl was an enum (config.json of an
    old job dir: praxis_lite.moved.MOVED_FIELDS), in templates and subclasses too."""
    cfg = Transformer.HParams.config(input_dims=8, hidden_dims=16, num_heads=2)
    cfg.tr_atten_tpl.query_scale = QueryScale.PER_DIM
    cfg.tr_atten_tpl.attention_impl = AttentionImpl.XLA
    cfg.cross_atten_tpl = DotProductAttention.HParams.config(query_scale=QueryScale.IN_INIT)
    sub = _SubclassedAttention.HParams.config(input_dims=8, num_heads=2)
    sub.query_scale = QueryScale.PER_DIM
    text = config_lib.to_json({"block": cfg, "sub": sub})
    old = _as_written_before(
        text,
        {
            "QueryScale.PER_DIM": ("per_dim_scale", True),
            "QueryScale.IN_INIT": ("query_scale_in_init", True),
            "AttentionImpl.XLA": ("attention_impl", "xla"),
        },
    )
    assert '"per_dim_scale"' in old and '"query_scale_in_init"' in old and "PER_DIM" not in old
    restored = config_lib.from_json(old)
    assert restored == {"block": cfg, "sub": sub}
    assert restored["block"].tr_atten_tpl.attention_impl is AttentionImpl.XLA
    assert config_lib.from_json(config_lib.to_json(restored)) == restored
    x = jnp.ones((1, 3, 8))
    for new, was in ((sub, restored["sub"]), (cfg.tr_atten_tpl, restored["block"].tr_atten_tpl)):
        built = instantiate(was, input_dims=8, num_heads=2)
        variables = built.init(jax.random.key(0), x)
        assert "per_dim_scale" in variables["params"]
        want = instantiate(new, input_dims=8, num_heads=2).apply(variables, x)
        np.testing.assert_array_equal(built.apply(variables, x), want)
