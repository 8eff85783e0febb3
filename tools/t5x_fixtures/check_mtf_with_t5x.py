"""Reads the Mesh TensorFlow fixtures (tests/fixtures/mtf, written by make_mtf_checkpoints.py)
with T5X's own ``checkpoint_importer.restore_from_t5_checkpoint`` and checks that it gives the
Hugging Face fixtures' weights under T5X's names (``make_t5x_fixtures.t5x_params``), bit for
bit (the bfloat16 fixture: to bfloat16's precision), and the step and Adafactor slots.

Runs in the T5X side venv (../shared/STACK-NOTES.md; build_t5x_venv.sh), outside the
repository root so that ``import t5x`` is T5X's:

    cd /tmp && PYTHONPATH=/path/to/repo/tools/t5x_fixtures \
        /tmp/t5x_side/venv/bin/python /path/to/repo/tools/t5x_fixtures/check_mtf_with_t5x.py \
        /path/to/repo/tests/fixtures
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
from flax import traverse_util
from make_t5x_fixtures import t5x_params
from safetensors.numpy import load_file
from t5x import checkpoint_importer


def check(fixtures: pathlib.Path, mtf: str, hf: str, step: int, rtol: float) -> None:
    hf_weights = load_file(fixtures / "hf" / hf / "model.safetensors")
    gated = "lm_head.weight" in hf_weights
    if not gated:  # T5 1.0: logits through the table; no logits_dense.
        hf_weights = {**hf_weights, "lm_head.weight": hf_weights["shared.weight"]}
    want = t5x_params(hf_weights, gated)
    if not gated:
        del want["decoder/logits_dense/kernel"]
    prefix = str(fixtures / "mtf" / mtf / f"model.ckpt-{step}")
    # The state dict T5X checks shapes against: its own translation's (every key must match).
    translated = checkpoint_importer._maybe_correct_relpos_bias(  # noqa: SLF001
        checkpoint_importer._add_missing_param_states(  # noqa: SLF001
            checkpoint_importer.t5_importer.apply(checkpoint_importer.load_tf_ckpt(prefix))
        )
    )
    state_dict = traverse_util.unflatten_dict(
        {tuple(k.split("/")): np.zeros(v.shape) for k, v in translated.items()}
    )
    restored = checkpoint_importer.restore_from_t5_checkpoint(state_dict, prefix)
    target = traverse_util.flatten_dict(restored["target"], sep="/")
    assert set(target) == set(want), sorted(set(target) ^ set(want))
    for name, value in want.items():
        np.testing.assert_allclose(
            np.asarray(target[name], np.float32), value, rtol=rtol, err_msg=name
        )
    assert int(restored["state"]["step"]) == step
    slots = traverse_util.flatten_dict(restored["state"]["param_states"], sep="/")
    used = {k for k, v in slots.items() if np.asarray(v).shape != (1,)}
    print(f"{mtf}: {len(want)} parameters as T5X reads them, step {step}, {len(used)} slots")


def main() -> None:
    fixtures = pathlib.Path(sys.argv[1])
    check(fixtures, "t5_1_1", "t5_flan", 1000, rtol=0.0)
    check(fixtures, "t5_1_0_bf16", "t5_v1_0", 500, rtol=2.0**-8)


if __name__ == "__main__":
    main()
