"""paxlite.checkpoints.train_checkpoints on 8 CPU devices: a save compiles nothing, and
what it wrote restores equal onto another sharding."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from paxlite.checkpoints.train_checkpoints import Checkpointer
from paxlite.train.train_state import TrainState

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def _state(mesh: Mesh) -> TrainState:
    """Replicated parameters of several shapes and a sharded optimizer state."""
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, "mdl"))
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": jax.device_put(rng.normal(size=(8, 16 + i)).astype(np.float32), replicated)
        for i in range(6)
    }
    mu = {f"w{i}": jax.device_put(np.full((8, 16), i, np.float32), sharded) for i in range(3)}
    scalar = jax.device_put(jnp.int32(7), replicated)
    return TrainState(
        step=scalar,
        params=params,
        opt_state=mu,
        nonfinite_steps=scalar,
        first_nonfinite_step=scalar,
    )


def test_a_save_on_8_cpu_devices_compiles_nothing_and_restores_equal(tmp_path):
    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "mdl"))
    state = _state(mesh)
    compiles = []

    def on_duration(event: str, duration: float, **_: object) -> None:
        if event == _BACKEND_COMPILE:
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        checkpointer = Checkpointer(tmp_path / "job", max_to_keep=1)
        checkpointer.save(3, state, {"position": 1})
        checkpointer.finish_pending()
    finally:
        jax.monitoring.unregister_event_duration_listener(on_duration)
    # orbax's replica-parallel save would slice each replicated array per replica: one
    # compiled program per shape and replica (train_checkpoints._save_whole_arrays_on_cpu).
    assert compiles == []

    other = Mesh(np.array(jax.devices()[:2]).reshape(2, 1), ("data", "mdl"))
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(other, P())),
        state,
    )
    restored, position = checkpointer.restore(3, abstract)
    checkpointer.close()
    assert position == {"position": 1}
    for want, got in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert got.sharding == NamedSharding(other, P())
