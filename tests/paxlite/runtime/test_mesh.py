"""create_mesh: ICI x DCN layouts on 8 fake devices and clear errors."""

import jax
import numpy as np
import pytest

from paxlite.runtime.mesh import MeshShapeError, create_mesh

AXES = ("replica", "data", "mdl")


def test_single_slice_mesh_shape():
    mesh = create_mesh((1, 4, 2), None, AXES)
    assert dict(mesh.shape) == {"replica": 1, "data": 4, "mdl": 2}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


def test_two_slices_are_contiguous_blocks_on_the_dcn_axis():
    mesh = create_mesh((1, 4, 1), (2, 1, 1), AXES)
    assert dict(mesh.shape) == {"replica": 2, "data": 4, "mdl": 1}
    first, second = mesh.devices[0].flatten(), mesh.devices[1].flatten()
    devices = jax.devices()
    assert {d.id for d in first} == {d.id for d in devices[:4]}
    assert {d.id for d in second} == {d.id for d in devices[4:]}


@pytest.mark.parametrize(
    "ici, dcn, message",
    [
        ((1, 2, 2), None, "needs 4 devices, but this job has 8"),
        ((1, 4), None, "same length"),
        ((1, 2, 2), (3, 1, 1), "needs 12 devices"),
    ],
)
def test_bad_shapes_fail_clearly(ici, dcn, message):
    with pytest.raises(MeshShapeError, match=message):
        create_mesh(ici, dcn, AXES)


def test_explicit_device_subset():
    mesh = create_mesh((1, 1, 1), None, AXES, devices=jax.devices()[:1])
    assert np.asarray(mesh.devices).size == 1
