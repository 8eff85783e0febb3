"""Checkpoints written by paxml 1.4's own main.py load here and give praxis's logits.

The fixtures (tests/fixtures/pax/<Class>/) were made by tools/pax_fixtures/make_checkpoints.py
in a paxml 1.4.0 venv: three tiny Pax experiments (the LmCloudSpmd, C4SpmdAdam and GPT-3
models) trained 3 steps by paxml's main.py, and the logits praxis computed from the saved
parameters on a fixed batch. paxlite builds each model from its own class of the same Pax
name with the same knobs.
"""

import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from paxlite.checkpoints import checkpoint_sources, init_from
from paxlite.experiments.base_experiment import with_overrides
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from praxis_lite import config as config_lib
from praxis_lite.base_layer import AUX_LOSS
from praxis_lite.py_utils import NestedMap
from tasks.lm import c4, lm_cloud
from tests import FIXTURES

_FIXTURES = FIXTURES / "pax"
# tools/pax_fixtures/tiny_experiments.py's _Tiny, as knobs.
TINY = dict(
    NUM_LAYERS=2,
    MODEL_DIMS=32,
    HIDDEN_DIMS=64,
    NUM_HEADS=4,
    DIMS_PER_HEAD=8,
    VOCAB_SIZE=128,
    MAX_SEQ_LEN=16,
    FPROP_DTYPE=jnp.float32,
    ICI_MESH_SHAPE=(1, 1, 1),
    PERCORE_BATCH_SIZE=4,
)
OURS = {  # Pax's tiny experiment -> the paxlite class of its Pax base, and its own knobs
    "TinyLmCloudSpmd": (lm_cloud.LmCloudSpmd2B, {}),  # scanned layers
    "TinyC4SpmdAdam": (  # unscanned layers (x_layers_i), as Pax registers C4SpmdAdam
        c4.C4SpmdAdam,
        dict(
            NUM_LAYERS=3, MODEL_DIMS=48, HIDDEN_DIMS=96, NUM_HEADS=6, VOCAB_SIZE=96, MAX_SEQ_LEN=12
        ),
    ),
    "TinyC4SpmdGpt3AdamOrgHP": (
        c4.C4SpmdGpt3AdamOrgHP,
        dict(
            MODEL_DIMS=40, HIDDEN_DIMS=160, NUM_HEADS=5, VOCAB_SIZE=112, TRAINABLE_PE_MAX_SEQ_LEN=32
        ),
    ),
    # praxis' TransformerFeedForwardMoe (GShard top-2, 4 experts, 2 routing groups):
    "TinyLmCloudSpmdMoe": (  # scanned as 2 groups of (dense, MoE); second choices overflow
        lm_cloud.LmCloudSpmd2B,
        dict(
            NUM_LAYERS=4,
            NUM_EXPERTS=4,
            NUM_GROUPS=2,
            MOE_EVERY_N=2,
            EXPERT_CAPACITY_FACTOR=1.0,
        ),
    ),
    "TinyC4SpmdAdamMoe": (  # unscanned, gated experts in layers 0 and 2, 4 slots an expert
        c4.C4SpmdAdam,
        dict(
            NUM_LAYERS=3,
            MODEL_DIMS=48,
            HIDDEN_DIMS=96,
            NUM_HEADS=6,
            VOCAB_SIZE=96,
            MAX_SEQ_LEN=12,
            NUM_EXPERTS=4,
            NUM_GROUPS=2,
            MOE_LAYERS=(0, 2),
            EXPERT_CAPACITY_FACTOR=0.5,
            MOE_GATED_ACTIVATION=True,
        ),
    ),
}
_MOE = ("TinyC4SpmdAdamMoe", "TinyLmCloudSpmdMoe")


def _model_and_batch(name: str):
    base, knobs = OURS[name]
    experiment = with_overrides(base, {**TINY, **knobs})()
    model = config_lib.instantiate(experiment.task().model)
    fixture = np.load(_FIXTURES / name / "logits.npz")
    ids = jnp.asarray(fixture["ids"])
    batch = NestedMap(
        ids=ids, labels=ids, weights=jnp.ones(ids.shape), paddings=jnp.zeros(ids.shape)
    )
    return experiment, model, batch, fixture["logits"]


def _step_dir(name: str) -> pathlib.Path:
    return _FIXTURES / name / "checkpoints" / "checkpoint_00000003"


def _read_pax(step_dir: pathlib.Path, model, batch, layout=(1, 1)):
    """The model's parameters read from a paxml step by LOAD_ALL, onto one device."""
    abstract = nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch))["params"])
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    run_params = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device)
        for k, v in traverse_util.flatten_dict(abstract, sep="/").items()
    }
    rules = {str(step_dir): CheckpointLoadingRules()}
    with init_from.opened(rules, {str(step_dir): layout}) as entries:
        params = init_from.read_params(entries, run_params)
        assert init_from.fresh_params(entries, run_params) == []
    return traverse_util.unflatten_dict(params, sep="/")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OURS))
def test_a_pax_checkpoint_gives_praxiss_logits(name):
    experiment, model, batch, want = _model_and_batch(name)
    layout = (experiment.NUM_STAGES, experiment.CIRCULAR_REPEAT)
    params = _read_pax(_step_dir(name), model, batch, layout)
    got = np.asarray(model.apply({"params": params}, batch, method=model.logits))
    experiment_vocab = experiment.VOCAB_SIZE
    assert got.shape == want.shape == (2, experiment.MAX_SEQ_LEN, experiment_vocab)
    scale = np.abs(want).max()
    assert scale > 0.1  # trained, not all zeros
    np.testing.assert_allclose(got, want, atol=1e-4 * scale, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", _MOE)
def test_a_pax_moe_checkpoint_gives_praxiss_aux_loss(name):
    """The summed GShard load-balancing losses of praxis' forward pass on the logits batch
    (the routing of every MoE layer, groups and overflow included)."""
    experiment, model, batch, _ = _model_and_batch(name)
    params = _read_pax(_step_dir(name), model, batch)
    _, mutables = model.apply({"params": params}, batch, mutable=[AUX_LOSS])
    ours = sum(float(np.sum(leaf)) for leaf in jax.tree_util.tree_leaves(mutables[AUX_LOSS]))
    want = float(np.load(_FIXTURES / name / "logits.npz")["aux_loss"])
    assert want > 1.0  # GShard's loss is 1 at a perfect balance, more otherwise
    np.testing.assert_allclose(ours, want, rtol=1e-5)


def test_another_models_checkpoint_is_named_not_loaded():
    """The GPT-3 model's weights into the LmCloudSpmd model: every mismatch is listed."""
    _, model, batch, _ = _model_and_batch("TinyLmCloudSpmd")
    with pytest.raises(init_from.InitFromError) as e:
        _read_pax(_step_dir("TinyC4SpmdGpt3AdamOrgHP"), model, batch)
    message = str(e.value)
    first, *listed = message.splitlines()
    assert "do not fit" in first
    per_dim = "params/lm/transformer/repeat/sub/x_layers_0/self_attention/per_dim_scale"
    assert any(per_dim in line and "no such array" in line for line in listed)
    assert any(
        "params/lm/softmax/logits_ffn/linear/w" in line and "shape" in line for line in listed
    )


def test_a_directory_that_is_not_a_pax_step_says_so(tmp_path):
    with pytest.raises(checkpoint_sources.CheckpointSourceError) as e:
        checkpoint_sources.identify(tmp_path)
    assert "holds no checkpoint paxlite can read" in str(e.value)
    assert "state/mdl_vars.params.*" in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_or_missing_array_is_one_line_naming_its_directory(tmp_path):
    _, model, batch, _ = _model_and_batch("TinyLmCloudSpmd")
    step = shutil.copytree(_step_dir("TinyLmCloudSpmd"), tmp_path / "checkpoint_00000003")
    state = step / "state"
    final_ln = state / "mdl_vars.params.lm.final_ln.scale"
    (final_ln / "0").write_bytes(b"not a chunk")  # Overwritten.
    with pytest.raises(checkpoint_sources.CheckpointSourceError) as e:
        _read_pax(step, model, batch)
    assert str(e.value).startswith(f"{final_ln}: paxml array mdl_vars.params.lm.final_ln.scale ")
    assert "cannot be read (" in str(e.value) and "\n" not in str(e.value)
    (final_ln / ".zarray").write_text("{not json")  # Its metadata.
    with pytest.raises(checkpoint_sources.CheckpointSourceError, match="cannot be opened") as e:
        _read_pax(step, model, batch)
    assert str(e.value).startswith(f"{final_ln}: paxml array") and "\n" not in str(e.value)
