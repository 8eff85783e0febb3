"""LoRA adapters as fields of Linear, TransformerFeedForward and DotProductAttention.

Numerics against numpy (``x @ W + scale * (x @ A) @ B``, written here), identity at init,
``lora.merged`` (adapted layer == base layer with merged weights: attention, gated FFN,
a scanned stack), KV-cache decoding of an adapted LM == its full pass, dropout only when
training (one mask for the shared q/k/v A), float32 adapters under a bfloat16 base, the
adapters' logical axes, the config round trip through JSON, and the errors of bad settings.
"""

import copy
import functools
import math

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fiddle import daglish
from flax import traverse_util

from praxis_lite import config as config_lib
from praxis_lite.layers import lora
from praxis_lite.layers.attentions import DotProductAttention
from praxis_lite.layers.linears import Linear
from praxis_lite.layers.lora import LoraSettings
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import Transformer, TransformerFeedForward
from praxis_lite.models.lm import LanguageModel
from tests.praxis_lite.layers import numpy_refs as ref

D, F, N, K, R, V = 8, 16, 4, 2, 2, 32  # model dims, hidden, heads, kv heads, rank, vocab
H = D // N
B, T, PROMPT = 2, 5, 3
ALPHA = 4.0


def _settings(*targets, rank=R, **fields):
    return config_lib.Config(LoraSettings, rank=rank, alpha=ALPHA, targets=targets, **fields)


def _attention(*targets, **fields):
    cfg = DotProductAttention.HParams.config(input_dims=D, num_heads=N, num_kv_heads=K)
    cfg.lora = _settings(*targets) if targets else None
    for name, value in fields.items():
        setattr(cfg, name, value)
    return cfg


def _ffn(*targets):
    cfg = TransformerFeedForward.HParams.config(
        input_dims=D, hidden_dims=F, use_gated_activation=True
    )
    cfg.lora = _settings(*targets) if targets else None
    return cfg


def _without_lora(cfg):
    """A deep copy of ``cfg`` whose every ``lora`` field is None (the base model)."""
    cfg = copy.deepcopy(cfg)
    for value, _ in daglish.iterate(cfg):
        if isinstance(value, fdl.Buildable) and "lora" in value.__arguments__:
            value.lora = None
    return cfg


def _random_params(model, *args, **kwargs):
    """Gaussian (0.2) weights in the shapes and dtypes of ``model.init`` (no init compile)."""
    init = functools.partial(model.init, **kwargs)
    shapes = nn.unbox(jax.eval_shape(init, jax.random.key(0), *args))
    rng = np.random.default_rng(0)
    normal = lambda s: (0.2 * rng.standard_normal(s.shape)).astype(s.dtype)  # noqa: E731
    return jax.tree.map(normal, shapes["params"])


def _merged_params(params, scale=ALPHA / R):
    flat = traverse_util.flatten_dict(params, sep="/")
    return traverse_util.unflatten_dict(lora.merged(flat, scale), sep="/")


# --- settings ------------------------------------------------------------------------
def test_scale_is_peft_scaling():
    assert LoraSettings(rank=4, alpha=8.0).scale == 2.0
    assert LoraSettings(rank=4, alpha=8.0, use_rslora=True).scale == 4.0
    assert LoraSettings(rank=1, alpha=1.0, targets=["query"]).targets == ("query",)


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"rank": 0}, "rank"),
        ({"rank": 2.0}, "rank"),
        ({"alpha": 0.0}, "alpha"),
        ({"dropout_prob": 1.0}, "dropout_prob"),
        ({"dropout_prob": -0.1}, "dropout_prob"),
        ({"targets": "query"}, "tuple"),
    ],
)
def test_bad_settings_raise(fields, match):
    with pytest.raises(ValueError, match=match):
        config_lib.instantiate(
            config_lib.Config(LoraSettings, **{"rank": 2, "alpha": 1.0, **fields})
        )


@pytest.mark.parametrize(
    "cfg, match",
    [
        (_ffn("ffn_layer3"), "ffn_layer1, ffn_layer1_gate, ffn_layer2"),
        (_attention("qkv", "query"), "excludes"),
        (_attention("keys"), "query, key, value, post, qkv"),
        (_attention("query", combine_qkv=True, num_kv_heads=None), "combine_qkv"),
        (_attention(lora=config_lib.Config(LoraSettings, rank=1, alpha=1.0)), "no targets"),
    ],
    ids=["ffn_unknown", "qkv_and_query", "atten_unknown", "combine_qkv", "no_targets"],
)
def test_bad_targets_raise(cfg, match):
    layer = config_lib.instantiate(cfg)
    with pytest.raises(ValueError, match=match):
        jax.eval_shape(layer.init, jax.random.key(0), jnp.ones((1, 2, D)))


def test_gate_target_needs_a_gated_ffn():
    cfg = _ffn("ffn_layer1_gate")
    cfg.use_gated_activation = False
    layer = config_lib.instantiate(cfg)
    with pytest.raises(ValueError, match="needs use_gated_activation"):
        jax.eval_shape(layer.init, jax.random.key(0), jnp.ones((1, 2, D)))


# --- Linear --------------------------------------------------------------------------
@pytest.mark.parametrize("use_rslora", [False, True], ids=["lora", "rslora"])
def test_linear_matches_numpy(use_rslora):
    cfg = Linear.HParams.config(input_dims=D, output_dims=F, lora=_settings(use_rslora=use_rslora))
    layer = ref.build(cfg)
    w, a, b = ref.normal((D, F), 1), ref.normal((D, R), 2), ref.normal((R, F), 3)
    x = ref.normal((B, T, D), 4)
    got = layer.apply({"params": {"w": w, "w_lora_a": a, "w_lora_b": b}}, x)
    scale = ALPHA / (math.sqrt(R) if use_rslora else R)
    x, w, a, b = ref.to_numpy((x, w, a, b))
    ref.assert_close(got, x @ w + scale * (x @ a) @ b, jnp.float32)


def test_linear_is_its_base_at_init():
    layer = ref.build(Linear.HParams.config(input_dims=D, output_dims=F, lora=_settings()))
    x = ref.normal((B, D))
    params = nn.unbox(ref.fast_jit(layer.init)(jax.random.key(0, impl="rbg"), x))["params"]
    np.testing.assert_array_equal(params["w_lora_b"], 0.0)
    a, bound = np.asarray(params["w_lora_a"]), 1 / math.sqrt(D)  # PEFT's kaiming_uniform(a=√5)
    assert np.all(np.abs(a) <= bound) and np.abs(a).max() > bound / 2
    base = ref.build(Linear.HParams.config(input_dims=D, output_dims=F))
    np.testing.assert_array_equal(
        layer.apply({"params": params}, x), base.apply({"params": {"w": params["w"]}}, x)
    )


def test_linear_dropout_only_when_training():
    """With ``A = B = I`` the adapter adds ``scale * dropout(x)``: in training each entry is
    0 or ``x / (1 - p)``, some of each; in eval it is ``x``; the base path is never dropped."""
    p = 0.5
    cfg = Linear.HParams.config(input_dims=R, output_dims=R, lora=_settings(dropout_prob=p))
    layer = ref.build(cfg)
    x = ref.normal((64, R)) + 3.0  # no zeros
    eye, w = np.eye(R, dtype=np.float32), ref.normal((R, R), 1)
    params = {"w": w, "w_lora_a": eye, "w_lora_b": eye}
    apply = ref.jit_apply(layer)
    added = lambda y: (np.asarray(y) - x @ w) / (ALPHA / R)  # noqa: E731
    np.testing.assert_allclose(added(apply({"params": params}, x)), x, rtol=1e-5)
    y = apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})
    kept = np.isclose(added(y), x / (1 - p), rtol=1e-4)
    dropped = np.isclose(added(y), 0.0, atol=1e-4)
    assert np.all(kept | dropped) and kept.any() and dropped.any()
    params["w_lora_b"] = np.zeros_like(eye)
    y = apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_allclose(y, x @ w, rtol=1e-5)


# --- attention -----------------------------------------------------------------------
def _folded(p, scale=ALPHA / R):
    """The attention weights with each adapter folded in, in numpy (independent of merged)."""
    p = dict(p)
    shared = p.pop("w_qkv_lora_a", None)
    for name in ("w_q", "w_k", "w_v", "w_post"):
        if name + "_lora_b" in p:
            a = p.pop(name + "_lora_a", shared)
            b = p.pop(name + "_lora_b")
            p[name] = p[name] + scale * np.tensordot(a, b, axes=1)
    return p


@pytest.mark.parametrize("targets", [("query", "value", "post"), ("qkv", "post")])
def test_attention_matches_numpy(targets):
    layer = ref.build(_attention(*targets))
    x = ref.normal((B, T, D))
    variables = {"params": _random_params(layer, x)}
    got = ref.jit_apply(layer)(variables, x)
    p = ref.to_numpy(variables["params"])
    assert {k for k in p if "lora" in k} == {
        ("query", "value", "post"): {f"w_{n}_lora_{m}" for n in "q v post".split() for m in "ab"},
        ("qkv", "post"): {"w_qkv_lora_a", "w_q_lora_b", "w_k_lora_b", "w_v_lora_b"}
        | {"w_post_lora_a", "w_post_lora_b"},
    }[targets]
    ref.assert_close(got, ref.attention(ref.to_numpy(x), _folded(p)), jnp.float32)


def test_attention_dropout_only_when_training():
    layer = ref.build(_attention("qkv", "post", lora=_settings("qkv", "post", dropout_prob=0.5)))
    x = ref.normal((B, T, D))
    variables = {"params": _random_params(layer, x)}
    apply = ref.jit_apply(layer)
    eval_out = apply(variables, x)
    ref.assert_close(
        eval_out, ref.attention(ref.to_numpy(x), _folded(variables["params"])), jnp.float32
    )
    train_out = apply(variables, x, train=True, rngs={"dropout": jax.random.key(0)})
    assert not np.allclose(train_out, eval_out, atol=1e-3)


@pytest.mark.parametrize("targets", [("qkv",), ("query", "key", "value")])
def test_shared_qkv_adapter_draws_one_dropout_mask(targets):
    """Zero base weights, ``A = I`` and the same B for q, k and v: the adapters' outputs
    are equal when they share A (one mask of x, as PEFT's one module on ``c_attn``) and
    differ when each adapter draws its own mask."""
    d = 4
    cfg = DotProductAttention.HParams.config(input_dims=d, num_heads=2, use_bias=False)
    cfg.lora = _settings(*targets, rank=d, dropout_prob=0.5)
    layer = ref.build(cfg)
    x = ref.normal((B, T, d)) + 3.0
    params = jax.tree.map(np.zeros_like, _random_params(layer, x))
    eye = np.eye(d, dtype=np.float32)
    for name in params:
        if name.endswith("_lora_a"):
            params[name] = eye
        elif name.endswith("_lora_b"):
            params[name] = eye.reshape(d, 2, 2)
    project = functools.partial(layer.apply, method=layer.project_qkv, train=True)
    q, k, v = ref.fast_jit(project)({"params": params}, x, rngs={"dropout": jax.random.key(0)})
    same = np.array_equal(q, k) and np.array_equal(k, v)
    assert same == (targets == ("qkv",))
    kept = np.isclose(q, ALPHA / d * 2 * x.reshape(q.shape), rtol=1e-5)  # x / (1 - p)
    assert np.all(kept | (np.asarray(q) == 0)) and not kept.all()


# --- merged ----------------------------------------------------------------------------
def _block(atten_targets, ffn_targets):
    block = Transformer.HParams.config(input_dims=D, hidden_dims=F, num_heads=N, num_kv_heads=K)
    block.tr_atten_tpl.lora = _settings(*atten_targets)
    block.tr_fflayer_tpl.use_gated_activation = True
    block.tr_fflayer_tpl.lora = _settings(*ffn_targets)
    return block


@pytest.mark.parametrize(
    "kind", ["attention_qkv", "attention_separate", "ffn_gated", "scanned_stack"]
)
def test_merged_weights_give_the_adapted_outputs(kind):
    cfg = {
        "attention_qkv": lambda: _attention("qkv", "post"),
        "attention_separate": lambda: _attention("query", "key", "value", "post"),
        "ffn_gated": lambda: _ffn("ffn_layer1", "ffn_layer1_gate", "ffn_layer2"),
        "scanned_stack": lambda: StackedTransformerRepeated.HParams.config(
            num_layers=2,
            block_tpl=_block(("qkv", "post"), ("ffn_layer1_gate", "ffn_layer2")),
            checkpoint_policy=AutodiffCheckpointType.NONE,
        ),
    }[kind]()
    layer, base = ref.build(cfg), ref.build(_without_lora(cfg))
    x = ref.normal((B, T, D))
    params = _random_params(layer, x)
    merged = _merged_params(params)
    assert not lora.adapter_paths(traverse_util.flatten_dict(merged, sep="/"))
    base_params = nn.unbox(jax.eval_shape(base.init, jax.random.key(0), x))["params"]
    assert jax.tree.map(np.shape, merged) == jax.tree.map(np.shape, base_params)
    if kind == "scanned_stack":
        assert params["repeat"]["block"]["self_attention"]["w_qkv_lora_a"].shape == (2, D, R)
    want = ref.jit_apply(layer)({"params": params}, x)
    ref.assert_close(ref.jit_apply(base)({"params": merged}, x), want, jnp.float32)


def test_merged_on_numpy_and_its_errors():
    w, a, b = ref.normal((3, 4), 1), ref.normal((3, 2), 2), ref.normal((2, 4), 3)
    got = lora.merged({"x/w": w.astype(jnp.bfloat16), "x/w_lora_a": a, "x/w_lora_b": b}, 0.5)
    assert isinstance(got["x/w"], np.ndarray) and got["x/w"].dtype == jnp.bfloat16
    want = w.astype(jnp.bfloat16).astype(np.float32) + 0.5 * a @ b
    np.testing.assert_allclose(got["x/w"].astype(np.float32), want, rtol=1e-2)
    with pytest.raises(ValueError, match="has no A"):
        lora.merged({"x/w": w, "x/w_lora_b": b}, 0.5)
    with pytest.raises(ValueError, match="have no B"):
        lora.merged({"x/w": w, "x/w_lora_a": a}, 0.5)
    with pytest.raises(ValueError, match="does not fit"):
        lora.merged({"x/w": w.T, "x/w_lora_a": a, "x/w_lora_b": b}, 0.5)


# --- in a model ----------------------------------------------------------------------
def _lm(dtype=None):
    lm = TransformerLm.HParams.config(model_dims=D, vocab_size=V)
    lm.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(
        num_layers=2,
        block_tpl=_block(("qkv", "post"), ("ffn_layer1", "ffn_layer2")),
        checkpoint_policy=AutodiffCheckpointType.NONE,  # no remat: a faster compile
    )
    cfg = LanguageModel.HParams.config(lm_tpl=lm)
    if dtype is not None:
        config_lib.set_dtypes(cfg, dtype=dtype, fprop_dtype=dtype)
    return cfg


def _lm_call(model, ids):
    return model.lm(ids).logits


def test_bf16_lm_config_round_trips_runs_and_its_adapters_have_their_axes():
    """A bf16 base (``set_dtypes``) keeps float32 adapters, with the logical axes of the
    contract (a scanned stack's leading 'layers'), after a JSON round trip of its config."""
    cfg = config_lib.from_json(config_lib.to_json(_lm(jnp.bfloat16)))
    model = config_lib.instantiate(cfg)
    ids = np.random.default_rng(0).integers(0, V, (B, T)).astype(np.int32)
    boxed = jax.eval_shape(functools.partial(model.init, method=_lm_call), jax.random.key(0), ids)
    block = boxed["params"]["lm"]["transformer"]["repeat"]["block"]
    atten, ffn = block["self_attention"], block["ff_layer"]
    got = {
        name: (tuple(box.value.shape), box.names, box.value.dtype)
        for name, box in {
            "w_qkv_lora_a": atten["w_qkv_lora_a"],
            "w_k_lora_b": atten["w_k_lora_b"],
            "w_post_lora_a": atten["w_post_lora_a"],
            "w_post_lora_b": atten["w_post_lora_b"],
            "ffn1_a": ffn["ffn_layer1"]["w_lora_a"],
            "ffn2_b": ffn["ffn_layer2"]["w_lora_b"],
        }.items()
    }
    f32 = jnp.dtype(jnp.float32)  # set_dtypes left adapter_dtype alone
    assert got == {
        "w_qkv_lora_a": ((2, D, R), ("layers", "embed", None), f32),
        "w_k_lora_b": ((2, R, K, H), ("layers", None, "kv_heads", "head_dim"), f32),
        "w_post_lora_a": ((2, N, H, R), ("layers", "heads", "head_dim", None), f32),
        "w_post_lora_b": ((2, R, D), ("layers", None, "embed"), f32),
        "ffn1_a": ((2, D, R), ("layers", "embed", None), f32),
        "ffn2_b": ((2, R, D), ("layers", None, "embed"), f32),
    }
    assert atten["w_q"].value.dtype == jnp.bfloat16
    params = _random_params(model, ids, method=_lm_call)
    logits = ref.fast_jit(functools.partial(model.apply, method=_lm_call))({"params": params}, ids)
    assert logits.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(logits, np.float32)))


def test_adapter_maths_runs_in_the_adapter_dtype():
    """A bf16 Linear's adapter products take float32 operands (not the bf16 ``fprop_dtype``)."""
    cfg = Linear.HParams.config(input_dims=D, output_dims=F, lora=_settings())
    config_lib.set_dtypes(cfg, dtype=jnp.bfloat16, fprop_dtype=jnp.bfloat16)
    layer = config_lib.instantiate(cfg)
    x = jnp.ones((B, D), jnp.bfloat16)
    variables = jax.eval_shape(layer.init, jax.random.key(0), x)
    jaxpr = jax.make_jaxpr(layer.apply)(variables, x)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    operands = sorted(tuple(str(v.aval.dtype) for v in e.invars) for e in dots)
    assert operands == [("bfloat16", "bfloat16")] + [("float32", "float32")] * 2
    assert jaxpr.out_avals[0].dtype == jnp.bfloat16


def test_lm_prefill_then_steps_equals_full_pass():
    model = ref.build(_lm())
    ids = np.random.default_rng(0).integers(0, V, (B, T)).astype(np.int32)
    variables = {"params": _random_params(model, ids, method=_lm_call)}
    full = ref.fast_jit(functools.partial(model.apply, method=_lm_call))(variables, ids)
    positions = np.tile(np.arange(T, dtype=np.int32), (B, 1))

    def incremental(variables):
        logits, cache = model.apply(
            variables,
            ids[:, :PROMPT],
            paddings=np.zeros((B, PROMPT), np.float32),
            positions=positions[:, :PROMPT],
            max_len=T,
            method=model.prefill,
            mutable=["cache"],
        )
        cache, steps = nn.unbox(cache["cache"]), []
        for t in range(PROMPT, T):
            out, mutated = model.apply(
                {**variables, "cache": cache},
                ids[:, t],
                positions=positions[:, t],
                method=model.extend_step,
                mutable=["cache"],
            )
            steps.append(out)
            cache = mutated["cache"]
        return jnp.concatenate([logits, jnp.stack(steps, axis=1)], axis=1)

    np.testing.assert_allclose(ref.fast_jit(incremental)(variables), full, rtol=2e-5, atol=2e-5)
