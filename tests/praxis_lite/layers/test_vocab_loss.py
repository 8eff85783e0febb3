"""The vocabulary loss (``vocab_loss``): its custom gradient and its chunks against optax's
cross-entropy differentiated by JAX, ties in the accuracy, and the chunk count's check."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from praxis_lite.layers import embedding_softmax as es
from praxis_lite.layers import vocab_loss
from tests.praxis_lite.layers import numpy_refs as ref

B, T, D, V = 2, 8, 8, 11


def _optax_loss(logits, labels, weights, label_smoothing, z_loss_weight):
    """The objective from optax's cross-entropy and JAX's logsumexp, differentiated by JAX."""
    targets = optax.smooth_labels(jax.nn.one_hot(labels, V), label_smoothing)
    xent = optax.softmax_cross_entropy(logits, targets)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    total = jnp.sum(weights)
    return (jnp.sum(xent * weights) + z_loss_weight * jnp.sum(log_z**2 * weights)) / total


def _inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, T, D)) * 3, jnp.float32)  # logits past the cap
    labels = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    weights = jnp.asarray(rng.uniform(0.5, 2.0, (B, T)), jnp.float32).at[1, 5:].set(0.0)
    return x, labels, weights


@pytest.mark.slow
@pytest.mark.parametrize("num_chunks", [1, 2, 4])
@pytest.mark.parametrize("layer_cls", [es.FullSoftmax, es.SharedEmbeddingSoftmax])
def test_loss_and_gradients_equal_optax_differentiated_by_jax(layer_cls, num_chunks):
    """Bias, cap, label smoothing and z-loss on: the loss, the per-token xent and the
    gradients (weights, bias, inputs) of the fused passes, whole or in chunks, equal optax's
    loss on the layer's own logits differentiated by JAX."""
    smoothing, z_loss, cap = 0.1, 0.05, 2.0
    fields = dict(input_dims=D, num_classes=V, soft_cap_logits=cap)
    fields.update(label_smoothing=smoothing, z_loss_weight=z_loss)
    if layer_cls is es.SharedEmbeddingSoftmax:
        fields["use_bias"] = True
    layer = ref.build(layer_cls.HParams.config(num_chunks=num_chunks, **fields))
    x, labels, weights = _inputs()
    params = ref.init_variables(layer, x, labels)["params"]
    params = jax.tree.map(lambda p: p + 0.3 * jnp.sin(jnp.arange(p.size).reshape(p.shape)), params)

    def ours(params, x):
        out = layer.apply({"params": params}, x, labels, weights)
        return out.total_loss, out.per_token_xent

    def theirs(params, x):
        logits = layer.apply({"params": params}, x, method="get_logits")
        return _optax_loss(logits, labels, weights, smoothing, z_loss)

    logits = layer.apply({"params": params}, x, method="get_logits")
    assert np.abs(logits).max() > 0.9 * cap  # the cap is exercised
    (loss, xent), grads = jax.value_and_grad(ours, argnums=(0, 1), has_aux=True)(params, x)
    want_loss, want_grads = jax.value_and_grad(theirs, argnums=(0, 1))(params, x)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    flat, want_flat = jax.tree.leaves(grads), jax.tree.leaves(want_grads)
    assert len(flat) == (3 if "b" in params else 2)
    for got, want in zip(flat, want_flat, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    whole = ref.build(layer_cls.HParams.config(**fields)).apply({"params": params}, x, labels)
    np.testing.assert_allclose(xent, whole.per_token_xent, rtol=1e-6)  # eval's scores


def test_a_tie_for_the_max_logit_counts_as_correct():
    """Accuracy comes from the logsumexp's max: a label whose logit ties with another
    class's max is correct (an argmax would pick the first of the two)."""
    logits = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 0.0], [0.0, 1.0, 0.5, 0.0]])
    labels = jnp.array([2, 0, 2])  # tie (argmax says 1), tie (argmax agrees), wrong
    out = es.softmax_cross_entropy(logits, labels, jnp.ones(3))
    np.testing.assert_allclose(out.accuracy, 2 / 3, rtol=1e-6)
    assert int(jnp.argmax(logits[0])) == 1


def test_chunks_that_do_not_divide_the_sequence_are_one_line():
    layer = ref.build(es.FullSoftmax.HParams.config(input_dims=D, num_classes=V, num_chunks=3))
    x, labels, weights = _inputs()
    with pytest.raises(ValueError, match=r"NUM_LOSS_CHUNKS=3 must divide .* a divisor of 8") as e:
        ref.init_variables(layer, x, labels)
    assert "\n" not in str(e.value)


def test_the_backward_pass_keeps_only_the_raw_logits(capsys):
    """What JAX keeps between the passes (``print_saved_residuals``): the projection's raw
    bfloat16 output and per-token stats; no float32 ``[..., V]`` logits or probabilities
    (JAX's own logsumexp differentiated keeps three of those here)."""
    _, labels, weights = _inputs()
    raw = jnp.asarray(np.random.default_rng(1).normal(size=(B, T, V)), jnp.bfloat16)

    def ours(raw):
        stats = vocab_loss.token_stats(raw, None, labels, 30.0, 0.0)
        return vocab_loss.loss_terms(stats, weights).total_loss

    def autodiff(raw):
        logits = 30.0 * jnp.tanh(raw.astype(jnp.float32) / 30.0)
        return _optax_loss(logits, labels, weights, 0.0, 0.0)

    saved = {}
    for name, fn in (("ours", ours), ("autodiff", autodiff)):
        jax.ad_checkpoint.print_saved_residuals(fn, raw)
        saved[name] = capsys.readouterr().out
    assert saved["ours"].count(f"f32[{B},{T},{V}]") == 0, saved["ours"]
    assert saved["ours"].count(f"bf16[{B},{T},{V}]") == 1, saved["ours"]
    assert saved["autodiff"].count(f"f32[{B},{T},{V}]") >= 2, saved["autodiff"]
