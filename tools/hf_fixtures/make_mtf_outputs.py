"""transformers' outputs for the bfloat16 Mesh TensorFlow fixture, and transformers' check of
the Hugging Face directories paxlite's converter writes.

Runs in the Hugging Face fixture venv (make_venv.sh), by hand, from the repository root:

    PYTHONPATH=tools/hf_fixtures /tmp/hf-venv/bin/python tools/hf_fixtures/make_mtf_outputs.py \
        tests/fixtures [CONVERTED_HF_DIR ...]

``tests/fixtures/mtf/t5_1_0_bf16`` holds ``t5_v1_0``'s weights rounded to bfloat16
(make_mtf_checkpoints.py, TensorFlow's cast: round to nearest even, as torch's): its
``outputs.npz`` is ``t5_v1_0``'s, with the logits, encoder outputs and greedy tokens
transformers computes (in float32) from those rounded weights. Each ``CONVERTED_HF_DIR``
(``python -m paxlite.t5x.convert_tf_checkpoint --output_format=hf``) is loaded by
transformers and must give the logits of the fixture it came from (named by its parent
directory's name: ``t5_1_1`` or ``t5_1_0_bf16``) within 1e-4 of their scale.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import torch
import transformers
from make_t5_fixtures import forward, greedy

_SOURCES = {"t5_1_1": "t5_flan", "t5_1_0_bf16": "t5_v1_0"}


def rounded_model(hf_dir: pathlib.Path) -> transformers.PreTrainedModel:
    model = transformers.T5ForConditionalGeneration.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))
    return model


@torch.no_grad()
def write_bf16_outputs(fixtures: pathlib.Path) -> None:
    source = dict(np.load(fixtures / "hf" / "t5_v1_0" / "outputs.npz"))
    model = rounded_model(fixtures / "hf" / "t5_v1_0")
    logits, encoder_out = forward(model, source)
    arrays = {
        k: source[k] for k in ("input_ids", "attention_mask", "decoder_input_ids", "decoder_mask")
    }
    arrays.update(logits=logits, encoder_out=encoder_out)
    for i in range(2):
        arrays[f"greedy_{i}"] = greedy(model, source, i)
    np.savez(fixtures / "mtf" / "t5_1_0_bf16" / "outputs.npz", **arrays)
    print("t5_1_0_bf16: greedy", arrays["greedy_0"], arrays["greedy_1"])


@torch.no_grad()
def check_converted(fixtures: pathlib.Path, converted: pathlib.Path) -> None:
    name = converted.parent.name
    outputs = fixtures / "mtf" / name / "outputs.npz"
    if not outputs.exists():
        outputs = fixtures / "hf" / _SOURCES[name] / "outputs.npz"
    want = dict(np.load(outputs))
    model = transformers.T5ForConditionalGeneration.from_pretrained(converted).eval()
    logits, _ = forward(model, want)
    mask = want["decoder_mask"].astype(bool)
    gap = np.abs(logits[mask] - want["logits"][mask]).max() / np.abs(want["logits"][mask]).max()
    assert gap <= 1e-4, (converted, gap)
    print(f"{converted}: transformers loads it; logits within {gap:.1e} of the scale")


def main() -> None:
    fixtures = pathlib.Path(sys.argv[1])
    write_bf16_outputs(fixtures)
    for converted in sys.argv[2:]:
        check_converted(fixtures, pathlib.Path(converted))


if __name__ == "__main__":
    main()
