"""Embeddings, softmax layers with their losses, and position embeddings against numpy."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from praxis_lite.layers import embedding_softmax as es
from tests.praxis_lite.layers import numpy_refs as ref

VOCAB = 11
DIMS = 8  # D of the softmax layers


def _ids(shape, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


@functools.cache
def _variables(layer_cls, *init_args, **fields):
    """Weights of a float32 layer, shared by the tests of every input shape and dtype.

    ``init_args`` are ``"ids"`` (token ids), ``"x"`` (``[1, D]`` inputs), or ints.
    """
    layer = ref.build(layer_cls.HParams.config(**fields))
    samples = {"ids": np.zeros((1,), np.int32), "x": np.zeros((1, DIMS), np.float32)}
    return ref.init_variables(layer, *(samples.get(a, a) for a in init_args))


# --- Embedding -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("ids_shape, dims", [((5,), 8), ((2, 4), 6)])
@pytest.mark.parametrize("scale_sqrt_depth", [False, True])
def test_embedding(scale_sqrt_depth, ids_shape, dims, dtype):
    cfg = es.Embedding.HParams.config(
        num_classes=VOCAB, input_dims=dims, scale_sqrt_depth=scale_sqrt_depth
    )
    layer = ref.build(cfg, dtype)
    ids = _ids(ids_shape)
    variables = _variables(es.Embedding, "ids", num_classes=VOCAB, input_dims=dims)
    table = ref.to_numpy(variables["params"]["emb_var"])
    assert table.shape == (VOCAB, dims) and variables["params"]["emb_var"].dtype == jnp.float32

    y = layer.apply(variables, ids)
    assert y.shape == ids_shape + (dims,) and y.dtype == dtype
    want = table[ids] * (math.sqrt(dims) if scale_sqrt_depth else 1.0)
    ref.assert_close(y, want, dtype)


# --- FullSoftmax / SharedEmbeddingSoftmax ----------------------------------------------
def _full_logits(p, x):
    return x @ p["w"] + p["b"]


def _shared_logits(p, x):
    return x @ p["emb_var"].T


SOFTMAX_LAYERS = [
    pytest.param(es.FullSoftmax, _full_logits, id="full"),
    pytest.param(es.SharedEmbeddingSoftmax, _shared_logits, id="shared"),
]

# label_smoothing, z_loss_weight, soft_cap_logits
LOSS_VARIANTS = [
    pytest.param(0.0, 0.0, 0.0, id="plain"),
    pytest.param(0.1, 0.0, 0.0, id="smoothing"),
    pytest.param(0.0, 0.1, 0.0, id="zloss"),
    pytest.param(0.2, 0.05, 2.0, id="smoothing-zloss-cap"),
]

SOFTMAX_SHAPES = [(6,), (2, 3)]  # leading shapes of x [..., D]


def _softmax_inputs(lead_shape):
    x = ref.normal(lead_shape + (DIMS,), scale=3.0)  # logits of a few units: the cap matters
    labels = _ids(lead_shape, seed=1)
    weights = np.random.default_rng(2).uniform(0.5, 2.0, lead_shape).astype(np.float32)
    weights.flat[::3] = 0.0  # padding
    return x, labels, weights


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("lead_shape", SOFTMAX_SHAPES)
@pytest.mark.parametrize("label_smoothing, z_loss_weight, cap", LOSS_VARIANTS)
@pytest.mark.parametrize("layer_cls, logits_fn", SOFTMAX_LAYERS)
def test_softmax_logits_and_losses(
    layer_cls, logits_fn, label_smoothing, z_loss_weight, cap, lead_shape, dtype
):
    cfg = layer_cls.HParams.config(
        input_dims=DIMS,
        num_classes=VOCAB,
        label_smoothing=label_smoothing,
        z_loss_weight=z_loss_weight,
        soft_cap_logits=cap,
    )
    layer = ref.build(cfg, dtype)
    x, labels, weights = _softmax_inputs(lead_shape)
    variables = _variables(layer_cls, "x", "ids", input_dims=DIMS, num_classes=VOCAB)
    logits = logits_fn(ref.to_numpy(variables["params"]), x.astype(np.float64))
    if cap:
        assert np.max(np.abs(logits)) > cap  # the cap is exercised
        logits = cap * np.tanh(logits / cap)
    labels.flat[1::2] = logits.argmax(-1).flat[1::2]  # half the tokens right: accuracy counts
    out = layer.apply(variables, x, labels, weights)
    assert all(v.shape in ((), lead_shape) for v in out.values())  # no [..., V] array

    got_logits = layer.apply(variables, x, method="get_logits")
    assert got_logits.shape == lead_shape + (VOCAB,) and got_logits.dtype == dtype
    ref.assert_close(got_logits, logits, dtype)

    want = ref.cross_entropy(
        logits, labels, weights.astype(np.float64), label_smoothing, z_loss_weight
    )
    del want["log_probs"]
    correct = logits.argmax(-1) == labels
    want["accuracy"] = (correct * weights).sum() / weights.sum()
    assert 0 < want["accuracy"] < 1
    for name, value in want.items():
        assert out[name].dtype == jnp.float32, name
        ref.assert_close(out[name], value, dtype)
    np.testing.assert_allclose(float(out.total_weight), weights.sum(), rtol=1e-6)
    if z_loss_weight:
        assert float(out.total_loss) > float(out.log_pplx)
    else:
        np.testing.assert_array_equal(np.asarray(out.total_loss), np.asarray(out.log_pplx))


@pytest.mark.parametrize("layer_cls, logits_fn", SOFTMAX_LAYERS)
def test_zero_weight_examples_do_not_count(layer_cls, logits_fn):
    layer = ref.build(
        layer_cls.HParams.config(input_dims=DIMS, num_classes=VOCAB, z_loss_weight=0.1)
    )
    x, labels, weights = _softmax_inputs((6,))
    variables = _variables(layer_cls, "x", "ids", input_dims=DIMS, num_classes=VOCAB)
    base = layer.apply(variables, x, labels, weights)

    # Changing the label and the input of a zero-weight example changes no average.
    padded = weights == 0
    labels2 = np.where(padded, (labels + 1) % VOCAB, labels)
    x2 = np.where(padded[:, None], -x, x)
    moved = layer.apply(variables, x2, labels2, weights)
    for name in ("log_pplx", "z_loss", "total_loss", "total_weight"):
        np.testing.assert_allclose(moved[name], base[name], rtol=1e-6, err_msg=name)
    # ... but its per-example xent is still reported.
    assert not np.allclose(moved.per_token_xent[padded], base.per_token_xent[padded])

    # No weights at all: finite zeros, not NaN.
    empty = layer.apply(variables, x, labels, np.zeros_like(weights))
    for name in ("log_pplx", "z_loss", "total_loss", "total_weight"):
        assert float(empty[name]) == 0.0, name

    # Omitted weights mean weight 1 everywhere.
    default = layer.apply(variables, x, labels)
    ones = layer.apply(variables, x, labels, np.ones_like(weights))
    np.testing.assert_allclose(default.total_loss, ones.total_loss, rtol=1e-6)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("ids_shape", [(5,), (2, 4)])
@pytest.mark.parametrize("scale_sqrt_depth", [False, True])
def test_shared_embedding_lookup_uses_the_softmax_table(scale_sqrt_depth, ids_shape, dtype):
    cfg = es.SharedEmbeddingSoftmax.HParams.config(
        input_dims=DIMS, num_classes=VOCAB, scale_sqrt_depth=scale_sqrt_depth
    )
    layer = ref.build(cfg, dtype)
    variables = _variables(
        es.SharedEmbeddingSoftmax, "x", "ids", input_dims=DIMS, num_classes=VOCAB
    )
    assert set(variables["params"]) == {"emb_var"}  # one table for both directions
    table = ref.to_numpy(variables["params"]["emb_var"])

    ids = _ids(ids_shape)
    y = layer.apply(variables, ids, method="emb_lookup")
    assert y.shape == ids_shape + (DIMS,) and y.dtype == dtype
    ref.assert_close(y, table[ids] * (math.sqrt(DIMS) if scale_sqrt_depth else 1.0), dtype)


# --- position embeddings -------------------------------------------------------------
@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("seq_length, dims", [(5, 8), (9, 7)])
def test_sinusoidal_positions(seq_length, dims, dtype):
    layer = ref.build(es.PositionalEmbedding.HParams.config(input_dims=dims), dtype)
    y = layer.apply({}, seq_length)
    assert y.shape == (1, seq_length, dims) and y.dtype == dtype
    want = ref.sinusoids(np.arange(seq_length, dtype=np.float64)[None], dims)
    ref.assert_close(y, want, dtype)
    # Layout: sin half first (zero at position 0), then cos half (one at position 0).
    half = dims // 2
    np.testing.assert_array_equal(np.asarray(y[0, 0, :half], np.float32), 0.0)
    np.testing.assert_array_equal(np.asarray(y[0, 0, half : 2 * half], np.float32), 1.0)


@pytest.mark.parametrize("max_timescale", [10_000.0, 100.0])
def test_sinusoidal_explicit_positions(max_timescale):
    cfg = es.PositionalEmbedding.HParams.config(input_dims=6, max_timescale=max_timescale)
    layer = ref.build(cfg)
    positions = np.array([[3, 4, 5, 0], [0, 1, 2, 3]], np.int32)  # e.g. packed or offset
    y = layer.apply({}, 4, positions)
    want = ref.sinusoids(positions.astype(np.float64), 6, max_timescale=max_timescale)
    ref.assert_close(y, want, jnp.float32)


def test_sinusoidal_min_timescale_is_the_shortest_timescale():
    cfg = es.PositionalEmbedding.HParams.config(
        input_dims=4, min_timescale=2.0, max_timescale=100.0
    )
    y = ref.build(cfg).apply({}, 3)
    positions = np.arange(3, dtype=np.float64)[None, :, None]
    timescales = np.array([2.0, 100.0])  # min_timescale .. max_timescale, geometric
    angles = positions / timescales
    want = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
    ref.assert_close(y, want, jnp.float32)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("seq_length, dims", [(5, 8), (3, 6)])
def test_trainable_positions(seq_length, dims, dtype):
    cfg = es.TrainablePositionalEmbedding.HParams.config(max_seq_length=6, input_dims=dims)
    layer = ref.build(cfg, dtype)
    variables = _variables(es.TrainablePositionalEmbedding, 1, max_seq_length=6, input_dims=dims)
    table = ref.to_numpy(variables["params"]["emb_var"])
    assert table.shape == (6, dims)

    y = layer.apply(variables, seq_length)
    assert y.shape == (1, seq_length, dims) and y.dtype == dtype
    ref.assert_close(y, table[None, :seq_length], dtype)

    positions = np.array([[5, 0, 2], [1, 1, 4]], np.int32)
    ref.assert_close(layer.apply(variables, 3, positions), table[positions], dtype)


def test_trainable_positions_too_long_raises():
    layer = ref.build(
        es.TrainablePositionalEmbedding.HParams.config(max_seq_length=4, input_dims=2)
    )
    with pytest.raises(ValueError, match="max_seq_length"):
        layer.init(jax.random.PRNGKey(0), 5)


@pytest.mark.parametrize("dtype", ref.DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 7, 2, 4)])
def test_rope(shape, dtype):
    b, t, _, h = shape
    layer = ref.build(es.RotaryPositionalEmbedding.HParams.config(input_dims=h), dtype)
    x = ref.normal(shape)
    y = layer.apply({}, jnp.asarray(x, dtype))
    assert y.shape == shape and y.dtype == dtype
    ref.assert_close(y, ref.rope(x.astype(np.float64), np.arange(t)[None, :]), dtype)

    positions = np.random.default_rng(3).integers(0, 50, (b, t))
    y = layer.apply({}, jnp.asarray(x, dtype), positions)
    ref.assert_close(y, ref.rope(x.astype(np.float64), positions.astype(np.float64)), dtype)


def test_rope_max_timescale():
    cfg = es.RotaryPositionalEmbedding.HParams.config(input_dims=6, max_timescale=50.0)
    x = ref.normal((1, 4, 2, 6))
    positions = np.array([[0, 3, 9, 20]])
    y = ref.build(cfg).apply({}, x, positions)
    want = ref.rope(x.astype(np.float64), positions.astype(np.float64), max_timescale=50.0)
    ref.assert_close(y, want, jnp.float32)


def test_rope_min_timescale_is_the_shortest_timescale():
    """Pair ``i`` turns by ``position / (min * (max / min) ** (2i / H))``, as in Praxis.

    (The class docstring writes ``position * min * (max / min) ** (-2i / H)``: the same
    only for ``min_timescale = 1``.)
    """
    cfg = es.RotaryPositionalEmbedding.HParams.config(
        input_dims=4, min_timescale=2.0, max_timescale=100.0
    )
    x = np.zeros((1, 3, 1, 4), np.float32)
    x[..., :2] = 1.0  # first feature of each pair: the rotation shows as (cos, sin)
    y = np.asarray(ref.build(cfg).apply({}, x), np.float64)[0, :, 0]
    angles = np.arange(3.0)[:, None] / (2.0 * 50.0 ** (2 * np.arange(2) / 4))
    np.testing.assert_allclose(
        y, np.concatenate([np.cos(angles), np.sin(angles)], -1), rtol=1e-5, atol=1e-6
    )


def _scaled_frequencies(h, base, scaling, factor, low=1.0, high=4.0, original=64):
    """Each pair's turn per position, as Llama 3.1's paper and config describe the scaling:
    wavelengths below ``original / high`` kept, above ``original / low`` divided by
    ``factor``, blended between; LINEAR divides all of them."""
    out = []
    for f in 1.0 / base ** (np.arange(0, h, 2) / h):
        wavelength = 2 * math.pi / f
        if scaling is es.RopeScaling.LINEAR or wavelength > original / low:
            out.append(f / factor)
        elif wavelength < original / high:
            out.append(f)
        else:
            blend = (original / wavelength - low) / (high - low)
            out.append((1 - blend) * f / factor + blend * f)
    return np.array(out)


@pytest.mark.parametrize("scaling", [es.RopeScaling.LINEAR, es.RopeScaling.LLAMA3])
def test_rope_scaling(scaling):
    """H = 16, base 1e4, original context 64: the pairs' wavelengths run from 6.3 to 2e4,
    so LLAMA3 keeps some, blends some and scales the rest."""
    h, factor = 16, 8.0
    cfg = es.RotaryPositionalEmbedding.HParams.config(
        input_dims=h, scaling=scaling, scaling_factor=factor, original_max_position=64
    )
    want = _scaled_frequencies(h, 1e4, scaling, factor)
    if scaling is es.RopeScaling.LLAMA3:
        plain = 1.0 / 1e4 ** (np.arange(0, h, 2) / h)
        kept, scaled = np.isclose(want, plain), np.isclose(want, plain / factor)
        assert kept.any() and scaled.any() and (~kept & ~scaled).any()
    layer = ref.build(cfg)
    np.testing.assert_allclose(layer.apply({}, method=layer.frequencies), want, rtol=1e-6)
    x = ref.normal((1, 4, 2, h))
    positions = np.array([[0, 3, 40, 300]])
    y = layer.apply({}, x, positions)
    angles = positions[:, :, None, None] * want  # ref.rope with these frequencies:
    x1, x2 = x[..., : h // 2].astype(np.float64), x[..., h // 2 :].astype(np.float64)
    rotated = [x1 * np.cos(angles) - x2 * np.sin(angles), x1 * np.sin(angles) + x2 * np.cos(angles)]
    ref.assert_close(y, np.concatenate(rotated, -1), jnp.float32)


def test_rope_properties():
    """Position 0 is the identity; pair norms are kept; q.k depends on the offset only."""
    h = 8
    layer = ref.build(es.RotaryPositionalEmbedding.HParams.config(input_dims=h))
    q, k = ref.normal((1, 1, 1, h), seed=1), ref.normal((1, 1, 1, h), seed=2)

    def at(v, pos):
        return np.asarray(layer.apply({}, v, np.array([[pos]])), np.float64)[0, 0, 0]

    np.testing.assert_allclose(at(q, 0), q[0, 0, 0], rtol=1e-6)
    pair_norm = lambda v: v[: h // 2] ** 2 + v[h // 2 :] ** 2
    np.testing.assert_allclose(pair_norm(at(q, 7)), pair_norm(q[0, 0, 0].astype(float)), rtol=1e-5)
    dots = [at(q, m) @ at(k, m - 3) for m in (3, 5, 11)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-5, atol=1e-5)


def test_rope_rejects_odd_or_mismatched_dims():
    layer = ref.build(es.RotaryPositionalEmbedding.HParams.config(input_dims=8))
    with pytest.raises(ValueError, match="input_dims"):
        layer.apply({}, jnp.ones((1, 2, 1, 6)))
    odd = ref.build(es.RotaryPositionalEmbedding.HParams.config(input_dims=5))
    with pytest.raises(ValueError, match="even"):
        odd.apply({}, jnp.ones((1, 2, 1, 5)))


def test_shared_softmax_bias_and_matmul_lookup_are_praxiss():
    """use_bias adds b [V] to the logits before the cap; lookup_style='matmul' (one-hot x
    table) gives the rows a gather gives."""
    fields = dict(input_dims=DIMS, num_classes=VOCAB, soft_cap_logits=2.0)
    cfg = es.SharedEmbeddingSoftmax.HParams.config(use_bias=True, **fields)
    layer = ref.build(cfg)
    variables = ref.init_variables(layer, np.zeros((1, DIMS), np.float32), np.zeros((1,), np.int32))
    p = ref.to_numpy(variables["params"])
    assert p["b"].shape == (VOCAB,) and np.abs(p["b"]).max() > 0  # noised: it matters below
    x = ref.normal((3, DIMS), scale=3.0)
    want = 2.0 * np.tanh((x.astype(np.float64) @ p["emb_var"].T + p["b"]) / 2.0)
    ref.assert_close(layer.apply(variables, x, method="get_logits"), want, jnp.float32)

    ids = _ids((2, 4))
    matmul = ref.build(es.SharedEmbeddingSoftmax.HParams.config(lookup_style="matmul", **fields))
    np.testing.assert_allclose(
        matmul.apply(variables, ids, method="emb_lookup"),
        layer.apply(variables, ids, method="emb_lookup"),
        rtol=1e-6,
    )
