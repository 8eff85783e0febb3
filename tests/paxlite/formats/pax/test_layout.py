"""paxlite's parameter trees against the trees paxml 1.4 itself builds for its catalogue.

tests/fixtures/pax/param_trees.json was written by tools/pax_fixtures/param_trees.py in a
paxml 1.4.0 venv (praxis's abstract init of every experiment of c4, c4_multislice and
lm_cloud). Each of our experiments, mapped to Pax's names by paxlite.formats.pax.layout, must
give the same names and shapes.
"""

import functools
import json

import flax.linen as nn
import jax
import pytest

from paxlite.experiments import registry
from paxlite.formats.pax import layout as pax_layout
from tests import FIXTURES
from tests.tasks.lm.test_lm_cloud_catalogue import _abstract_params

_FIXTURE = FIXTURES / "pax" / "param_trees.json"
PAX = json.loads(_FIXTURE.read_text())
#: Where our vocabulary is Pax's padded to an even split over 'mdl' (docs/pax-differences.md).
PADDED_VOCAB = {
    "c4.C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas": (51200, 51216),
    "c4.C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas": (51200, 51204),
    "c4.C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas": (51200, 51204),
    "c4.C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas": (51200, 51204),
    "c4.C4SpmdGpt3L16AdamOrgHP": (50257, 50260),
    "c4_multislice.C4SpmdGpt3AdamDataParallel2x16x16": (50257, 50272),
}
_NAMES = sorted(PAX["trees"])


def test_the_fixture_is_paxs_whole_catalogue():
    assert PAX["paxml"] == "1.4.0" and not PAX["failures"]
    assert len(_NAMES) == 55


@functools.cache
def _ours_in_paxs_layout(name: str) -> dict[str, list[int]]:
    cls = registry.get(f"tasks.lm.{name}")
    params = nn.unbox(_abstract_params(cls))
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in path): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    stages = getattr(cls, "NUM_STAGES", 1)  # (the classification MLP has no pipeline knobs)
    repeat = getattr(cls, "CIRCULAR_REPEAT", 1)
    mapped = jax.eval_shape(lambda p: pax_layout.to_pax(p, stages, repeat), flat)
    return {path: list(leaf.shape) for path, leaf in mapped.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", _NAMES)
def test_our_parameters_are_paxs(name):
    want = PAX["trees"][name]
    if name in PADDED_VOCAB:
        pax_vocab, ours = PADDED_VOCAB[name]
        want = {k: [ours if d == pax_vocab else d for d in v] for k, v in want.items()}
    got = _ours_in_paxs_layout(name)
    assert sorted(set(got) - set(want)) == [] and sorted(set(want) - set(got)) == []
    assert {k: v for k, v in got.items() if want[k] != v} == {}


def test_a_layer_pax_has_no_place_for_is_named():
    with pytest.raises(pax_layout.PaxLayoutError, match="lm/transformer/x_layers_0/extra/w"):
        pax_layout.to_pax({"lm/transformer/x_layers_0/extra/w": jax.numpy.zeros(2)})


@pytest.mark.parametrize("stages, repeat", [(2, 1), (2, 3)])
def test_pipeline_layers_land_in_paxs_stage_order(stages, repeat):
    """Pax's x_layers_j[r, s] is layer (r S + s) L / (S R) + j (praxis's circular layout)."""
    import numpy as np

    layers = 12
    per_stage = layers // (stages * repeat)
    ids = np.arange(layers, dtype=np.float32)
    ours = ids if repeat == 1 else ids.reshape(repeat, layers // repeat)
    path = "lm/transformer/repeat/block/layer_norm/scale"
    pax = pax_layout.to_pax({path: ours}, stages, repeat)
    assert len(pax) == per_stage
    for j in range(per_stage):
        got = np.asarray(pax[f"lm/transformer/pipeline/body/x_layers_{j}/layer_norm/scale"])
        want = np.array(
            [[(r * stages + s) * per_stage + j for s in range(stages)] for r in range(repeat)]
        )
        np.testing.assert_array_equal(got, want if repeat > 1 else want[0])
