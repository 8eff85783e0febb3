"""ATTENTION_IMPL: the kernels inside DotProductAttention against its einsums (outputs and
gradients, causal + packed + GQA (+ cap for splash), on a sharded mesh), training runs
with each implementation this CPU can run giving the same losses, the default by the
mesh's platform, and one-line errors or one-line fallbacks where a kernel cannot run.

Splash runs in Pallas' interpret mode here (tiny shapes); cuDNN cannot run on a CPU: its
selection and errors are tested, its numerics on a GPU when one is at hand.
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.runtime import attention_choice
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite import sharding
from praxis_lite.layers import attention_kernels, attentions
from praxis_lite.layers.attentions import AttentionImpl, AttentionImplError, DotProductAttention
from tasks.lm.synthetic import LmSyntheticTiny
from tests.paxlite.test_main import main_in_process

B, T, D, N, K = 2, 128, 32, 4, 2


def _layer(impl: AttentionImpl, **fields) -> DotProductAttention:
    blocks = attention_kernels.SplashBlockSizes(*(128,) * 8)  # the kernel's least
    return DotProductAttention(
        input_dims=D,
        num_heads=N,
        num_kv_heads=K,
        dims_per_head=16,
        attention_impl=impl,
        splash_block_sizes=blocks,
        **fields,
    )


def _inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    segments = np.ones((B, T), np.int32)
    segments[:, T // 3 :] = 2  # two packed sequences a row
    paddings = np.zeros((B, T), np.float32)
    paddings[1, -16:] = 1.0
    segments[1, -16:] = 0
    return x, jnp.asarray(segments), jnp.asarray(paddings)


@pytest.mark.slow
@pytest.mark.parametrize("impl, cap", [(AttentionImpl.XLA, 0.0), (AttentionImpl.SPLASH, 5.0)])
def test_kernels_equal_the_einsums_outputs_and_gradients_on_a_sharded_mesh(impl, cap):
    x, segments, paddings = _inputs()
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 2), ("data", "mdl"), axis_types=auto, devices=jax.devices()[:4])
    rules = (("batch", "data"), ("heads", "mdl"), ("kv_heads", "mdl"))
    einsum, kernel = (
        _layer(AttentionImpl.EINSUM, atten_logit_cap=cap),
        _layer(impl, atten_logit_cap=cap),
    )
    params = einsum.init(jax.random.key(0), x)
    real = (1.0 - paddings)[:, :, None]

    def loss(layer, params, x):
        out = layer.apply(params, x, segment_ids=segments, paddings=paddings)
        return jnp.sum((out * real) ** 2), out

    results = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        for layer in (einsum, kernel):
            fn = jax.jit(jax.value_and_grad(lambda p, x, lay=layer: loss(lay, p, x), (0, 1), True))
            (_, out), grads = fn(params, x)
            results.append((out * real, grads))
    (want, want_grads), (got, got_grads) = results
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def _losses(tmp_path, impl: str) -> list[float]:
    cls = base_experiment.with_overrides(
        LmSyntheticTiny,
        {
            "ICI_MESH_SHAPE": (1, 4, 2),
            "LOGICAL_AXIS_RULES": sharding.TENSOR_PARALLEL_RULES,
            "NUM_TRAIN_STEPS": 2,
            "SUMMARY_INTERVAL_STEPS": 1,
            "CHECKPOINT_EVERY_N_STEPS": 1000,
            "PERCORE_BATCH_SIZE": 1,
            "ATTENTION_IMPL": impl,
            "MAX_SEQ_LEN": 128,  # splash's least block
        },
    )
    exp = cls()
    job = build_job(exp, exp.task(), exp.datasets(), tmp_path / impl)
    assert job.attention_impl is AttentionImpl(impl)
    result = train_loop.run(job, peak_tflops=1.0)
    return [s["loss"] for _, s in result.history]


@pytest.mark.slow
def test_training_with_each_implementation_gives_the_same_losses(tmp_path):
    reference = _losses(tmp_path, "einsum")
    for impl in ("xla", "splash"):
        np.testing.assert_allclose(_losses(tmp_path, impl), reference, rtol=2e-5, err_msg=impl)


def _device(platform: str, kind: str):
    return types.SimpleNamespace(platform=platform, device_kind=kind)


def test_the_default_follows_the_meshs_platform():
    tpu, gpu = _device("tpu", "TPU v5 lite"), _device("gpu", "NVIDIA H100 80GB HBM3")
    assert attention_choice.choose(None, [tpu]) == (AttentionImpl.SPLASH, False)
    assert attention_choice.choose(None, [gpu]) == (AttentionImpl.CUDNN, False)
    assert attention_choice.choose(None, jax.devices()) == (AttentionImpl.EINSUM, False)
    assert attention_choice.choose(AttentionImpl.XLA, jax.devices()) == (AttentionImpl.XLA, True)


def test_the_knobs_reach_every_attention_layer():
    """ATTENTION_IMPL (by name or value) and the SA_BLOCK_* knobs, through the experiment's
    attention_settings()."""
    cls = base_experiment.with_overrides(
        LmSyntheticTiny, {"ATTENTION_IMPL": "XLA", "SA_BLOCK_KV_DQ": 128}
    )
    exp = cls()
    task_cfg = exp.task()
    assert attention_choice.apply(task_cfg, exp, jax.devices()) is AttentionImpl.XLA
    atten = task_cfg.model.lm_tpl.stacked_transformer_tpl.block_tpl.tr_atten_tpl
    assert atten.attention_impl is AttentionImpl.XLA and not atten.attention_fallback
    assert atten.splash_block_sizes.block_kv_dq == 128 and atten.splash_block_sizes.block_q == 512


def test_what_cudnn_cannot_run_is_one_error_asked_for_and_one_line_by_default(caplog):
    x, _, _ = _inputs()
    bf16 = dict(atten_logit_cap=50.0, fprop_dtype=jnp.bfloat16)
    params = _layer(AttentionImpl.EINSUM).init(jax.random.key(0), x)
    with pytest.raises(AttentionImplError, match="logit cap") as info:
        _layer(AttentionImpl.CUDNN, **bf16).apply(params, x)
    assert "\n" not in str(info.value) and "pick another ATTENTION_IMPL" in str(info.value)
    default = _layer(AttentionImpl.CUDNN, attention_fallback=True, **bf16)
    attentions._warn_fallback.cache_clear()  # One line per message and process.
    want = _layer(AttentionImpl.EINSUM, **bf16).apply(params, x)
    np.testing.assert_array_equal(default.apply(params, x), want)
    assert any("uses the einsums" in r.getMessage() for r in caplog.records)


def test_splash_with_an_additive_bias_is_one_error_line():
    x, _, _ = _inputs()
    params = _layer(AttentionImpl.EINSUM).init(jax.random.key(0), x)
    layer = _layer(AttentionImpl.SPLASH)
    with pytest.raises(AttentionImplError, match="bias"):
        layer.apply(params, x, attention_bias=jnp.zeros((N, T, T)))


def test_an_unknown_attention_impl_is_one_error_line(tmp_path):
    code, stderr = main_in_process(
        f"--job_log_dir={tmp_path / 'job'}",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=ATTENTION_IMPL=flash",
    )
    assert code == 2 and stderr.startswith(
        "paxlite: error: cannot set LmSyntheticTiny.ATTENTION_IMPL"
    )
    assert "pass one of EINSUM, XLA, CUDNN, SPLASH" in stderr
    assert stderr.count("\n") == 1
