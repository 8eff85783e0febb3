"""Compiles the Pax train step ``lower_pax.py`` saved with paxlite's TPU compiler (step 2 of 2),
and records what the compiler says about it in ``tests/fixtures/pax/tpu_memory.json``.

The saved ``CompileOptions`` are used as they are (only ``xla_dump_to`` is added), on the
topology's devices in the saved device order. Recorded per experiment: whether the compiler
took the program, the HBM its buffer assignment places on a chip (the default memory space of
XLA's memory-usage report; for a refused program the figure in its refusal, the same number),
the chip's HBM, and the lowering's facts (parameters, per-device state, global batch).

Runs in paxlite's venv (the ``[tpu]`` extra):

    python tools/pax_fixtures/tpu_memory/compile_pax.py v4:4x4x4 /tmp/pax-tpu/LmCloudSpmd32B \\
        tests/fixtures/pax/tpu_memory.json
"""

import importlib.metadata
import json
import os
import pathlib
import sys
import tempfile
import time

import jax
from jax._src.interpreters import mlir
from jax._src.lib import _jax, xla_client
from jax.experimental import topologies

from paxlite.runtime import tpu_topology


def compile_saved(topology_name: str, saved: pathlib.Path) -> dict:
    """The compiler's answer for the program saved in ``saved``: figures (JSON-ready)."""
    devices = topologies.get_topology_desc(
        platform="tpu", topology_name=topology_name, chip_config_name="megacore"
    ).devices
    facts = json.loads((saved / "lowered.json").read_text())
    by_id = {d.id: d for d in devices}
    ordered = xla_client.DeviceList(tuple(by_id[i] for i in facts["device_ids"]))
    options = xla_client.CompileOptions.ParseFromString((saved / "compile_options.pb").read_bytes())
    with mlir.make_ir_context():
        module = _jax.mlir.deserialize_portable_artifact((saved / "module.vhlo").read_bytes())
        with tempfile.TemporaryDirectory() as dump:
            options.env_option_overrides = [("xla_dump_to", dump)]
            start = time.perf_counter()
            try:
                client = devices[0].client
                client.compile(module, executable_devices=ordered, compile_options=options)
                compiled, refusal = True, None
            except jax.errors.JaxRuntimeError as e:
                compiled, refusal = False, tpu_topology.hbm_shortfall(e)
                if refusal is None:
                    raise
            seconds = time.perf_counter() - start
            assigned = tpu_topology.assigned_hbm_bytes(dump)
    return {
        **{k: v for k, v in facts.items() if k != "device_ids"},
        "compiled": compiled,
        "hbm_assigned_bytes_per_chip": assigned if assigned is not None else refusal[0],
        "hbm_bytes_per_chip": None if compiled else refusal[1],
        "compile_seconds": round(seconds, 1),
        "libtpu": importlib.metadata.version("libtpu"),
        "jax": jax.__version__,
    }


def main(topology_name: str, saved: str, fixture: str) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # Before JAX starts a backend or libtpu.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    row = compile_saved(topology_name, pathlib.Path(saved))
    path = pathlib.Path(fixture)
    table = json.loads(path.read_text()) if path.exists() else {}
    table[row["experiment"]] = row
    path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    print(json.dumps(row))
    sys.stdout.flush()
    os._exit(0)  # libtpu's compile-only client can abort in interpreter teardown.


if __name__ == "__main__":
    main(*sys.argv[1:4])
