"""T5X's standard logical axis rules, each partitioning case (T5X's table, partitioning.py)."""

import pytest

from paxlite.formats.t5x.api import partitioning

_REPLICATED = [
    ("relpos_buckets", None),
    ("abspos_buckets", None),
    ("length", None),
    ("layers", None),
    ("stack", None),
    ("mlp_activations", None),
]
_HEAD = [("batch", "data"), ("vocab", "model")]
_TAIL = [("mlp", "model"), ("heads", "model"), ("kv", None), ("joined_kv", "model")]


@pytest.mark.parametrize(
    "dims, expected",
    [
        ((1, 1), _HEAD + [("embed", None)] + _TAIL),
        ((2, 1), _HEAD + _TAIL + [("embed", "model")]),
        ((1, 2), _HEAD + _TAIL + [("embed", "data")]),
        ((2, 2), _HEAD + _TAIL + [("embed", "model"), ("embed", "data")]),
    ],
)
def test_each_case_of_partitioning_dims(dims, expected):
    assert partitioning.standard_logical_axis_rules(*dims) == expected + _REPLICATED


def test_additional_rules_come_last_and_other_dims_are_refused():
    rules = partitioning.standard_logical_axis_rules(additional_rules=[("expert", "data")])
    assert rules[-1] == ("expert", "data")
    with pytest.raises(ValueError, match="each must be 1 or 2"):
        partitioning.standard_logical_axis_rules(3, 1)
