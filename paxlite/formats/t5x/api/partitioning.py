"""``t5x.partitioning``: how T5X lays a model over devices."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

#: ``(logical axis, mesh axis or None)`` pairs, T5X's mesh axes being 'data' and 'model'.
LogicalAxisRules = Sequence[tuple[str, str | None]]

#: Where 'embed' goes for each (activation, parameter) partitioning dims.
_EMBED_RULES = {
    (1, 1): [("embed", None)],
    (2, 1): [("embed", "model")],
    (1, 2): [("embed", "data")],
    (2, 2): [("embed", "model"), ("embed", "data")],
}
_REPLICATED = ("relpos_buckets", "abspos_buckets", "length", "layers", "stack", "mlp_activations")


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: LogicalAxisRules | None = None,
) -> list[tuple[str, str | None]]:
    """T5X's standard rules: batch over 'data'; vocab, mlp, heads over 'model'; 'embed'
    replicated (1, 1), over 'model' (activations 2-D) and/or 'data' (parameters 2-D).

    Raises:
      ValueError: a partitioning-dims value other than 1 or 2 (as T5X).
    """
    dims = (activation_partitioning_dims, parameter_partitioning_dims)
    if dims not in _EMBED_RULES:
        raise ValueError(
            f"activation_partitioning_dims = {dims[0]}, parameter_partitioning_dims = {dims[1]}: "
            "each must be 1 or 2 (as in T5X's standard_logical_axis_rules)."
        )
    rules = [("batch", "data"), ("vocab", "model")]
    if dims == (1, 1):  # T5X lists 'embed' here in this case only.
        rules.append(("embed", None))
    rules += [("mlp", "model"), ("heads", "model"), ("kv", None), ("joined_kv", "model")]
    if dims != (1, 1):
        rules += _EMBED_RULES[dims]
    rules.extend((name, None) for name in _REPLICATED)
    rules.extend(additional_rules or ())
    return rules


@dataclasses.dataclass(frozen=True)
class PjitPartitioner:
    """T5X's ``partitioning.PjitPartitioner`` (its fields and defaults).

    ``num_partitions``: devices each model copy spans (the 'model' mesh axis); the rest of
    the devices are the 'data' axis. ``model_parallel_submesh``: on TPU, the ``(x, y, z,
    core)`` block of chips each copy spans; elsewhere the devices form a line, so only its
    size (the product) counts.
    """

    num_partitions: int | None = None
    model_parallel_submesh: tuple[int, ...] | None = None
    params_on_devices: bool = True
    backend: str | None = None
    ici_mesh_shape: tuple[int, ...] | None = None
    dcn_mesh_shape: tuple[int, ...] | None = None
    logical_axis_rules: LogicalAxisRules | None = None
