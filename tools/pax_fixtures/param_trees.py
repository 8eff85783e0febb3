"""Writes the parameter tree (names and shapes) that paxml 1.4's own abstract init gives for every
experiment of its c4, c4_multislice and lm_cloud catalogues, as one JSON file.

Runs in the paxml venv (tools/pax_fixtures/make_venv.sh), not in paxlite's:

    JAX_PLATFORMS=cpu /tmp/paxml-venv/bin/python tools/pax_fixtures/param_trees.py \\
        tests/fixtures/pax/param_trees.json

Output: ``{"<module>.<Class>": {"<slash/separated/path>": [shape...]}}``; a scanned (repeated)
layer's weights carry its repeat prefix (``[layers, ...]``), as Pax's checkpoints store them.
Nothing is allocated: praxis's ``abstract_init_with_metadata``.
"""

import json
import sys

import jax
import jax.numpy as jnp
from paxml import experiment_registry
from paxml.tasks.lm.params import c4, c4_multislice, lm_cloud  # noqa: F401  (registers them)
from praxis import base_layer, pax_fiddle, py_utils

MODULES = ("c4", "c4_multislice", "lm_cloud")


def catalogue() -> list[str]:
    """``module.Class`` of every experiment registered in MODULES (paxml's own registry)."""
    prefix = "paxml.tasks.lm.params."
    names = experiment_registry.get_all()  # key -> class; keys include every suffix
    return sorted(
        {
            key[len(prefix) :]
            for key in names
            if key.startswith(prefix) and key[len(prefix) :].split(".")[0] in MODULES
        }
    )


def abstract_batch(experiment) -> py_utils.NestedMap:
    """A batch of the model's input, as shapes: one microbatch per pipeline stage (a pipeline
    needs whole microbatches), else one example."""
    rows = (getattr(experiment, "MICROBATCH_SIZE", None) or 1) * (
        getattr(experiment, "NUM_STAGES", None) or 1
    )
    ids = jax.ShapeDtypeStruct((rows, experiment.MAX_SEQ_LEN), jnp.int32)
    floats = jax.ShapeDtypeStruct((rows, experiment.MAX_SEQ_LEN), jnp.float32)
    return py_utils.NestedMap(
        ids=ids, labels=ids, weights=floats, paddings=floats, segment_ids=ids, segment_pos=ids
    )


def param_tree(name: str) -> dict[str, list[int]]:
    experiment = experiment_registry.get(name)()
    model_p = experiment.task().model
    model = pax_fiddle.instantiate(model_p)
    context = base_layer.JaxContext.HParams(do_eval=True)
    with base_layer.JaxContext.new_context(hparams=context):
        meta = model.abstract_init_with_metadata(abstract_batch(experiment))
    leaves = jax.tree_util.tree_flatten_with_path(
        meta["params"], is_leaf=lambda x: isinstance(x, base_layer.WeightHParams)
    )[0]
    tree = {}
    for path, weight in leaves:
        shape = list(weight.repeat_prefix or []) + list(weight.shape)
        tree["/".join(str(getattr(key, "key", key)) for key in path)] = shape
    return tree


def main(out_path: str) -> None:
    trees, failures = {}, {}
    for name in catalogue():
        try:
            trees[name] = param_tree(name)
        except Exception as e:  # Recorded, so one experiment cannot hide the others.
            failures[name] = f"{type(e).__name__}: {e}"[:500]
        print(name, "ok" if name in trees else failures[name], file=sys.stderr, flush=True)
    with open(out_path, "w") as f:
        json.dump(
            {"paxml": "1.4.0", "trees": trees, "failures": failures}, f, indent=0, sort_keys=True
        )
    print(f"{len(trees)} trees, {len(failures)} failures -> {out_path}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
