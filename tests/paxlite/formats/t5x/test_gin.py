"""T5X's config.gin read for the model: the legacy fixture's operative config (written as T5X
writes it), T5X's own t5_1_1 sizes with macros, and one-line errors."""

from __future__ import annotations

import pytest

from paxlite.formats.t5x import gin as t5x_gin
from tests import FIXTURES

T5X = FIXTURES / "t5x" / "flan_legacy"


def test_the_fixtures_config_gin_describes_the_hf_fixtures_model():
    assert t5x_gin.find(T5X / "checkpoint_7") == T5X / "config.gin"
    shape = t5x_gin.t5_shape(T5X / "config.gin")
    assert (shape.num_encoder_layers, shape.num_decoder_layers, shape.model_dims) == (3, 2, 32)
    assert (shape.num_heads, shape.dims_per_head, shape.hidden_dims) == (4, 8, 48)
    assert (shape.vocab_size, shape.mlp_activations, shape.logits_via_embedding) == (
        256,
        ("gelu", "linear"),
        False,
    )


XXL_GIN = """
from __gin__ import dynamic_registration
from t5x.examples.t5 import network
from tests import FIXTURES

DROPOUT_RATE = 0.1
EMB = 4096
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 32128  # rounded up
  dtype = 'bfloat16'
  emb_dim = %EMB
  num_heads = 64
  num_encoder_layers = 24
  num_decoder_layers = 24
  head_dim = 64
  mlp_dim = 10240
  mlp_activations = ('gelu', 'linear')
  dropout_rate = %DROPOUT_RATE
  logits_via_embedding = False
train/network.T5Config.emb_dim = 8
"""


def test_block_bindings_macros_and_scopes_as_gin_reads_them(tmp_path):
    (tmp_path / "config.gin").write_text(XXL_GIN)
    shape = t5x_gin.t5_shape(tmp_path / "config.gin")
    assert shape.model_dims == 4096  # The macro, not the scoped binding.
    assert (shape.num_heads, shape.hidden_dims, shape.num_encoder_layers) == (64, 10240, 24)


@pytest.mark.parametrize(
    "text, message",
    [
        ("network.T5Config.emb_dim = %NOPE\n", "macro %NOPE is not bound"),
        ("network.T5Config.emb_dim = 32\n", "binds no network.T5Config.num_heads"),
        ("network.T5Config.emb_dim = (\n", "does not parse as gin"),
        (XXL_GIN.replace("('gelu', 'linear')", "('swish',)"), "mlp_activations"),
    ],
)
def test_configs_it_cannot_read_are_one_line(tmp_path, text, message):
    (tmp_path / "config.gin").write_text(text)
    with pytest.raises(t5x_gin.GinConfigError, match=message) as e:
        t5x_gin.t5_shape(tmp_path / "config.gin")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("checkpoint", ["flan_legacy", "flan_orbax"])
def test_from_pretrained_builds_a_t5x_checkpoint_from_its_config_gin(checkpoint):
    """No experiment named: the model dir's config.gin says which T5; the logits are those
    transformers computed for the same weights (the HF fixture they were written from)."""
    import numpy as np

    from paxlite.pretrained.loading import from_pretrained

    t5 = from_pretrained(T5X.parent / checkpoint)
    out = np.load(FIXTURES / "hf" / "t5_flan" / "outputs.npz")
    logits = t5.logits(out["input_ids"], decoder_input_ids=out["decoder_input_ids"])
    mask = out["decoder_mask"].astype(bool)
    scale = np.abs(out["logits"][mask]).max()
    np.testing.assert_allclose(logits[mask], out["logits"][mask], atol=1e-4 * scale, rtol=0)
    tokens = np.asarray(t5.generate([out["input_ids"][0].tolist()], max_new_tokens=8))[0]
    np.testing.assert_array_equal(tokens, out["greedy_0"])
