"""NestedMap: attribute access, pytree behaviour, key checks."""

import jax
import jax.numpy as jnp
import pytest

from praxis_lite.py_utils import NestedMap


def test_attribute_access_and_pytree():
    m = NestedMap(a=1.0, b=NestedMap(c=jnp.ones(2)))
    m.d = 3.0
    assert m.a == 1.0 and m["d"] == 3.0 and m.b.c.shape == (2,)
    doubled = jax.tree_util.tree_map(lambda x: x * 2, m)
    assert isinstance(doubled, NestedMap) and isinstance(doubled.b, NestedMap)
    assert doubled.d == 6.0
    out = jax.jit(lambda t: t.transform(lambda x: x + 1))(m)
    assert float(out.a) == 2.0
    assert list(dict(m.flatten_items())) == ["a", "b.c", "d"]


def test_bad_keys_and_missing_attributes_raise():
    with pytest.raises(ValueError, match="shadows a dict method"):
        NestedMap(items=1)
    with pytest.raises(ValueError, match="identifiers"):
        NestedMap({"a b": 1})
    with pytest.raises(AttributeError, match="keys: \\['a'\\]"):
        _ = NestedMap(a=1).z
