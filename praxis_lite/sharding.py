"""Logical axis names and the rules that map them onto mesh axes.

Layers name the axes of their weights and activations (``('embed', 'mlp')``);
they never see a mesh. The experiment owns a rule list that maps each logical
name to a mesh axis (or ``None`` for replicated), e.g.::

    RULES = (('batch', 'data'), ('embed', 'data'), ('mlp', 'mdl'), ('heads', 'mdl'))

With no mesh set, activation constraints are no-ops, so the same layer runs on
one CPU device and sharded over a pod.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh

LogicalAxes = tuple[str | None, ...]
LogicalAxisRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# Logical axis names used by the layers library. Experiments map these.
BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
VOCAB = "vocab"
LAYERS = "layers"
STAGES = "stages"
# The model dim of embedding tables (Pax's EMB_W_DATA_DIMS); follows EMBED unless a rule names it.
TABLE_EMBED = "table_embed"
# The model dim of the [batch, length, model] activations between and at the ends of
# layers (praxis's a_bld): split over 'mdl' for training, as praxis's training-optimized
# sharding does, so a chip keeps 1/mdl of each saved layer input and output.
ACTIVATION_EMBED = "activation_embed"
# The batch dim of the embeddings and the softmax, around the layer stack. Follows BATCH
# unless a rule names it: a pipelined LM maps it over ('stage', 'replica', 'data'), so
# those run data-parallel over every chip, as Pax's pipelined LMs do.
LM_BATCH = "lm_batch"
# The experts of a mixture-of-experts layer (its stacked weights' leading axis, and the
# expert axis of its dispatched activations). Replicated unless a rule names it: see
# EXPERTS_OVER_DATA_RULES (Pax's) and EXPERT_AXIS_RULES (MaxText's).
EXPERT = "exp"

# A sensible default for 'data' x 'mdl' meshes (Pax's DP + tensor parallelism).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    (BATCH, ("replica", "data")),
    (LENGTH, None),
    (EMBED, None),
    (MLP, "mdl"),
    (HEADS, "mdl"),
    (KV_HEADS, "mdl"),
    (HEAD_DIM, None),
    (VOCAB, "mdl"),
    (ACTIVATION_EMBED, "mdl"),
    (LAYERS, None),
    (STAGES, "stage"),
)


# Named strategies (experiments pick one or write their own). Flax assigns each
# mesh axis at most once per array, in rule order, so with FSDP an activation
# [batch, length, embed] keeps 'data' for its batch and leaves embed whole,
# while weights with an 'embed' axis are split over 'data'. Each also puts a
# pipeline's stages on a 'stage' mesh axis where the mesh has one.
DATA_PARALLEL_RULES = ((BATCH, ("replica", "data")), (STAGES, "stage"))
FSDP_RULES = ((BATCH, ("replica", "data")), (EMBED, "data"), (STAGES, "stage"))
TENSOR_PARALLEL_RULES = (
    (BATCH, ("replica", "data")),
    (MLP, "mdl"),
    (HEADS, "mdl"),
    (KV_HEADS, "mdl"),
    (VOCAB, "mdl"),
    (ACTIVATION_EMBED, "mdl"),
    (STAGES, "stage"),
)
FSDP_AND_TENSOR_PARALLEL_RULES = TENSOR_PARALLEL_RULES + ((EMBED, "data"),)
# Where an MoE layer's experts live; put these rules first (the first rule that names a
# mesh axis for an array's dims takes it): Pax 1.4 splits experts over its 'data' axis
# (their tokens then reach them by an all-to-all within 'data'); MaxText has a mesh axis
# of their own, 'expert', which leaves 'data' free for FSDP of the experts' weights.
EXPERTS_OVER_DATA_RULES = ((EXPERT, "data"),)
EXPERT_AXIS_RULES = ((EXPERT, "expert"),)


def with_defaults(rules: LogicalAxisRules) -> list[tuple[str, Any]]:
    """``rules``, plus TABLE_EMBED mapped as EMBED is and LM_BATCH as BATCH is, when no
    rule names them."""
    rules = list(rules)
    named = dict(reversed(rules))  # The first rule for a name wins.
    if TABLE_EMBED not in named and EMBED in named:
        rules.append((TABLE_EMBED, named[EMBED]))
    if LM_BATCH not in named and BATCH in named:
        rules.append((LM_BATCH, named[BATCH]))
    return rules


def filter_rules_for_mesh(rules: LogicalAxisRules, mesh: Mesh) -> list[tuple[str, Any]]:
    """Drops mesh axes that ``mesh`` does not have (e.g. 'replica' on a 2-D mesh); adds
    the default rules of :func:`with_defaults`."""
    kept = []
    for logical, mesh_axes in with_defaults(rules):
        if mesh_axes is None:
            kept.append((logical, None))
            continue
        names = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        names = tuple(n for n in names if n in mesh.axis_names)
        kept.append((logical, names if len(names) > 1 else (names[0] if names else None)))
    return kept


def logical_shardings(abstract_tree: Any, mesh: Mesh, rules: LogicalAxisRules) -> Any:
    """NamedShardings for a tree of (boxed) abstract variables from ``jax.eval_shape``.

    Leaves without logical-axis metadata are replicated.
    """
    specs = nn.get_partition_spec(abstract_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, filter_rules_for_mesh(rules, mesh))


def strip_boxes(tree: Any) -> Any:
    """Removes flax's axis-metadata boxes without applying sharding constraints."""
    return jax.tree_util.tree_map(
        lambda x: x.unbox(apply_constraint=False) if isinstance(x, nn.meta.AxisMetadata) else x,
        tree,
        is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata),
    )


def sharded_init(
    init_fn: Callable[..., Any], mesh: Mesh, rules: LogicalAxisRules, *args: Any
) -> tuple[Any, Any]:
    """Runs ``init_fn(*args)`` so each variable is created directly on its sharding.

    ``init_fn`` returns a tree of variables boxed with logical axis names (flax's
    ``nn.Partitioned``). Nothing is materialized on one device first: the
    shardings come from ``jax.eval_shape`` and go into ``jit(out_shardings=...)``.

    Returns:
      (variables, shardings): unboxed arrays and their NamedShardings.
    """
    filtered = filter_rules_for_mesh(rules, mesh)
    with nn.logical_axis_rules(filtered):
        abstract = jax.eval_shape(init_fn, *args)
        shardings = logical_shardings(abstract, mesh, rules)
        unboxed_shardings = strip_boxes(shardings)
        with jax.set_mesh(mesh):
            variables = init_with_shardings(init_fn, unboxed_shardings, *args)
    return variables, unboxed_shardings


def init_with_shardings(init_fn: Callable[..., Any], shardings: Any, *args: Any) -> Any:
    """``init_fn(*args)`` unboxed, jitted so each variable is created on its sharding.

    ``shardings`` (unboxed NamedShardings, e.g. from :func:`logical_shardings`)
    mirror the tree ``init_fn`` returns; nothing is materialized on one device first.
    """

    def initialised(*init_args: Any) -> Any:  # JAX's compile log names it.
        return nn.unbox(init_fn(*init_args))

    return jax.jit(initialised, out_shardings=shardings)(*args)
