"""T5's relative position bias against a scalar Python reference of mesh TensorFlow's
``_relative_position_bucket`` (the algorithm in T5's and T5X's public source)."""

import math

import jax
import numpy as np
import pytest

from praxis_lite.layers import relative_bias as rb
from tests.praxis_lite.layers import numpy_refs as ref


def _bucket(
    relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int
) -> int:
    """One distance's bucket, one step at a time, as mesh TensorFlow writes it (n = -rel)."""
    ret, n = 0, -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return ret + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20)])
def test_buckets_are_mesh_tensorflows(bidirectional, num_buckets, max_distance):
    distances = np.arange(-300, 301, dtype=np.int32)
    got = rb.relative_position_bucket(
        distances, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    want = [_bucket(int(d), bidirectional, num_buckets, max_distance) for d in distances]
    np.testing.assert_array_equal(np.asarray(got), want)
    assert 0 <= min(want) and max(want) == num_buckets - 1


@pytest.mark.parametrize("bidirectional", [True, False])
def test_bias_is_the_tables_entry_of_each_pairs_bucket(bidirectional):
    """Queries at positions 0..5 (a decoder's next steps: 3..5) against keys 0..9."""
    cfg = rb.RelativePositionBias.HParams.config(num_heads=3, bidirectional=bidirectional)
    layer = ref.build(cfg)
    queries, keys = np.arange(3, 9, dtype=np.int32), np.arange(10, dtype=np.int32)
    variables = ref.init_variables(layer, queries, keys)
    table = np.asarray(jax.device_get(variables["params"]["rel_embedding"]))
    assert table.shape == (3, 32)
    got = np.asarray(layer.apply(variables, queries, keys))
    want = np.empty((3, len(queries), len(keys)), np.float32)
    for t, q in enumerate(queries):
        for s, k in enumerate(keys):
            want[:, t, s] = table[:, _bucket(int(k - q), bidirectional, 32, 128)]
    np.testing.assert_array_equal(got, want)
