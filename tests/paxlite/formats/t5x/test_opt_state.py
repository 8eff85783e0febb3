"""T5X Adafactor's state loaded into ours by the loading rules (``load_step``,
``load_opt_states``): FlanT5Small at the legacy fixture's sizes (tests/fixtures/t5x/flan_legacy,
written by tools/t5x_fixtures/make_t5x_fixtures.py; its factored ``v_row``/``v_col`` inline).

Oracles: the fixture's slots read whole (reshaped by hand), and T5X's factored Adafactor
second-moment step written in numpy on T5X's 2-D layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlite.checkpoints import checkpoint_sources, init_from
from paxlite.experiments import base_experiment
from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.runtime.job import build_job
from paxlite.train import train_setup
from praxis_lite import config as config_lib
from praxis_lite.optim import factored_adafactor as fa
from tasks.t5.flan_t5 import FlanT5Small
from tests.tasks.t5.test_t5_hf_finetune import FIXTURE_KNOBS, T5X_FIXTURE, _FixtureBatch

_SLOTS = "state/param_states/"


@pytest.fixture(scope="module")
def fresh_state(tmp_path_factory):
    knobs = {**FIXTURE_KNOBS, "FPROP_DTYPE": jnp.float32, "ICI_MESH_SHAPE": (1, 1, 1)}
    knobs["PERCORE_BATCH_SIZE"] = 2
    exp = base_experiment.with_overrides(FlanT5Small, knobs)()
    datasets = [config_lib.Config(_FixtureBatch, batch_size=2)]
    job = build_job(exp, exp.task(), datasets, tmp_path_factory.mktemp("job"), jax.devices()[:1])
    return train_setup.init_or_restore(job, train_setup.StateSource.FRESH).state


@pytest.fixture(scope="module")
def loaded(fresh_state):
    rules = {str(T5X_FIXTURE): CheckpointLoadingRules(load_step=True, load_opt_states=True)}
    return init_from.initialise(fresh_state, rules, {str(T5X_FIXTURE): (1, 1)})


def _slot(name):
    return np.asarray(checkpoint_sources.open_source(T5X_FIXTURE).read_whole(_SLOTS + name))


def _moments(state):
    return state.opt_state[0].moments["network"]


@pytest.mark.slow
def test_the_step_and_every_count_are_t5xs(loaded):
    assert int(loaded.step) == 7
    counts = [leaf for leaf in jax.tree.leaves(loaded.opt_state) if leaf.ndim == 0]
    assert counts and all(int(c) == 7 for c in counts)


def test_factored_moments_are_t5xs_reshaped_and_stacked_on_the_layers(loaded):
    """Our v_row is over 'embed', v_col over the joined heads; T5X's v_row keeps the smaller
    dim of a 2-D kernel, the first of two equal ones (its ``_factored_dims``): the query's
    [E=32, N*H=32] embed, the output projection's [N*H=32, E=32] joined heads."""
    moments = _moments(loaded)
    enc = moments["encoder"]["repeat"]["block"]
    for ours, theirs, embed_in in (("w_q", "query", "v_row"), ("w_post", "out", "v_col")):
        got = enc["self_attention"][ours]
        assert isinstance(got, fa.FactoredMoment)
        heads_in = "v_col" if embed_in == "v_row" else "v_row"
        for layer in range(3):
            name = f"encoder/layers_{layer}/attention/{theirs}/kernel/"
            np.testing.assert_array_equal(got.v_row[layer], _slot(name + embed_in))
            np.testing.assert_array_equal(got.v_col[layer], _slot(name + heads_in).reshape(4, 8))
    wo = moments["decoder"]["repeat"]["block"]["ff_layer"]["ffn_layer2"]["w"]
    np.testing.assert_array_equal(wo.v_row[1], _slot("decoder/layers_1/mlp/wo/kernel/v_row"))
    np.testing.assert_array_equal(wo.v_col[1], _slot("decoder/layers_1/mlp/wo/kernel/v_col"))
    scale = enc["layer_norm"]["scale"]
    np.testing.assert_array_equal(
        scale.v[2], _slot("encoder/layers_2/pre_attention_layer_norm/scale/v")
    )
    np.testing.assert_array_equal(
        moments["encoder"]["relative_bias"]["rel_embedding"].v,
        _slot("encoder/relpos_bias/rel_embedding/v"),
    )


def test_a_table_factored_by_t5x_but_whole_in_ours_is_t5xs_estimate(loaded):
    """The [V, E] table (too small for our size rule) is whole here: T5X's v_row (embed) times
    v_col (vocab) over the mean of v_row."""
    emb = _moments(loaded)["embedding"]["emb_var"]
    assert isinstance(emb, fa.FullMoment)
    v_row, v_col = (_slot(f"token_embedder/embedding/{s}") for s in ("v_row", "v_col"))
    np.testing.assert_allclose(emb.v, v_col[:, None] * v_row[None, :] / v_row.mean(), rtol=1e-6)


def test_a_step_from_the_loaded_moments_is_t5xs_step_from_its_own(loaded):
    """Our factored second-moment step on the loaded state equals T5X's (numpy, on its 2-D
    [E, N*H] kernel, T5X's ``_factored_dims``: v_row keeps dim 0 of two equal ones) from the
    fixture's v_row and v_col, at step 7. (Where T5X's v_row is over the heads, as in the
    [N*H, E] output projection, ours is T5X's v_col: the same estimate for T5X's own states,
    whose v_row and v_col have one mean, not for the fixture's random ones.)"""
    attention = _moments(loaded)["encoder"]["repeat"]["block"]["self_attention"]
    moments = {k: attention[k] for k in ("w_q",)}
    rng = np.random.default_rng(0)
    grads = {
        k: rng.normal(size=m.v_row.shape[:1] + (32, 32)).astype(np.float32)
        for k, m in moments.items()
    }  # [L, E, N*H]
    shaped = {"w_q": (3, 32, 4, 8)}
    tx = fa.scale_by_factored_rms(lambda p: None)
    updates, _ = tx.update(
        {k: jnp.asarray(g.reshape(shaped[k])) for k, g in grads.items()},
        fa.FactoredRmsState(loaded.opt_state[0].count, moments),
    )
    decay = 1.0 - 8.0**-0.8  # T5X's at step 7.
    for ours, theirs, embed_axis in (("w_q", "query", 0),):
        for layer in range(3):
            name = f"encoder/layers_{layer}/attention/{theirs}/kernel/"
            g = grads[ours][layer]
            g2 = g * g + 1e-30
            v_row = decay * _slot(name + "v_row") + (1 - decay) * g2.mean(axis=1 - embed_axis)
            v_col = decay * _slot(name + "v_col") + (1 - decay) * g2.mean(axis=embed_axis)
            row_factor = np.expand_dims((v_row / v_row.mean()) ** -0.5, 1 - embed_axis)
            want = g * row_factor * np.expand_dims(v_col**-0.5, embed_axis)
            got = np.asarray(updates[ours][layer]).reshape((32, 32))
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{ours} {layer}")


def test_a_slot_t5x_lacks_is_one_line_naming_it(fresh_state, tmp_path):
    source = checkpoint_sources.open_source(T5X_FIXTURE)
    name = _SLOTS + "encoder/relpos_bias/rel_embedding/v"
    source._leaves[name] = np.zeros((1,), np.float32)  # As an unused T5X slot.
    with pytest.raises(checkpoint_sources.CheckpointSourceError) as e:
        source.read_train_state(init_from.abstract_of(fresh_state), opt_state=True)
    message = str(e.value)
    assert "\n" not in message and "encoder/relpos_bias/rel_embedding holds no" in message


def test_partial_load_takes_the_loaded_variables_slots_and_leaves_the_rest_fresh(fresh_state):
    rules = CheckpointLoadingRules(
        load_rules=[(r"params/(encoder/.*)", "params/{}")], partial_load_opt_states=True
    )
    state = init_from.initialise(fresh_state, {str(T5X_FIXTURE): rules}, {str(T5X_FIXTURE): (1, 1)})
    moments = _moments(state)
    q = moments["encoder"]["repeat"]["block"]["self_attention"]["w_q"]
    np.testing.assert_array_equal(
        q.v_row[0], _slot("encoder/layers_0/attention/query/kernel/v_row")
    )
    decoder_q = moments["decoder"]["repeat"]["block"]["self_attention"]["w_q"]
    assert not np.asarray(decoder_q.v_row).any()  # Fresh.
    assert not np.asarray(moments["embedding"]["emb_var"].v).any()
    assert int(state.step) == 0 and int(state.opt_state[0].count) == 0


def test_the_step_alone_reads_from_a_legacy_and_an_orbax_step():
    for model_dir in (T5X_FIXTURE, T5X_FIXTURE.parent / "flan_orbax"):
        source = checkpoint_sources.open_source(model_dir)
        assert source.read_train_state(None, opt_state=False) == {"step": 7}


#: T5X's factored v_row of the tables this run keeps whole: written back as the means of
#: T5X's estimate ``v_row * v_col / mean(v_row)``, i.e. ``v_row * mean(v_col) / mean(v_row)``
#: (v_col comes back as it was). The fixture's factors are random, not a pair T5X's updates
#: make (theirs have equal means), so the two differ here.
_WHOLE_HERE = ("logits_dense/kernel/v_row", "token_embedder/embedding/v_row")


def test_t5x_s_format_holds_the_t5x_state_it_was_loaded_from_and_reads_back(loaded, tmp_path):
    """Oracle: the fixture T5X wrote. The state loaded from it (scanned stacks; factored
    kernels; the [V, E] table whole here, factored by T5X) saved in T5X's format
    (``checkpoint_7/``) holds T5X's slots again, each of T5X's shape and value; and
    restored through the Checkpointer it is the state that was saved."""
    from paxlite.checkpoints import train_checkpoints
    from paxlite.formats.t5x.api import partitioning
    from paxlite.formats.t5x.model_dir import T5xCheckpoints

    rules = tuple(partitioning.standard_logical_axis_rules())
    checkpoint_format = T5xCheckpoints(logical_axis_rules=rules, min_dim_size_to_factor=32)
    checkpointer = train_checkpoints.Checkpointer(
        tmp_path, max_to_keep=None, checkpoint_format=checkpoint_format
    )
    try:
        checkpointer.save(7, loaded, {"index": 3})
        checkpointer.finish_pending()
        assert checkpointer.all_steps() == [7]
        written = checkpoint_sources.open_source(tmp_path / "checkpoint_7")
        theirs = checkpoint_sources.open_source(T5X_FIXTURE)
        names = {**theirs.variables(), **theirs.state_variables()}
        assert {**written.variables(), **written.state_variables()}.keys() == names.keys()
        for name, variable in names.items():
            got, want = written.read_whole(name), theirs.read_whole(name)
            assert got.shape == variable.shape, name
            if name.endswith(_WHOLE_HERE):  # The means of T5X's estimate (see below).
                v_col = theirs.read_whole(name.removesuffix("v_row") + "v_col")
                want = want * v_col.mean() / want.mean()
            if not name.endswith("/m"):  # T5X's (1,) placeholders hold whatever T5X left.
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, err_msg=name)
        restored, input_state = checkpointer.restore(7, init_from.abstract_of(loaded))
    finally:
        checkpointer.close()
    assert input_state == {"index": 3}
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(loaded)[0], jax.tree.leaves(restored), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, err_msg=str(path))
