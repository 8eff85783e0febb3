"""Flan-T5 fine-tuned from a Hugging Face T5 directory or a T5X checkpoint (``--init_from``):
the first loss is the loss of transformers' own logits on the same batch; knobs that disagree
with the directory's config.json are one line; the job exports as Hugging Face T5 again.

The directory is the flan-t5-style fixture transformers wrote (tests/fixtures/hf/t5_flan);
the experiment's stacks are scanned, so each layer is read from its own tensor.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.formats.hf import tiny_models
from paxlite.pretrained import export
from paxlite.pretrained.loading import from_pretrained
from paxlite.runtime import job_config
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite import config as config_lib
from praxis_lite.inputs.synthetic_input import SyntheticSeq2SeqInput
from praxis_lite.py_utils import NestedMap
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tasks.t5.flan_t5 import FlanT5Small
from tasks.t5.text import T5TextTiny
from tests import FIXTURES
from tests.paxlite.pretrained.test_loading import assert_same_tokenizer

FIXTURE = FIXTURES / "hf" / "t5_flan"
T5X_FIXTURE = FIXTURES / "t5x" / "flan_legacy"
#: The fixture's config.json as knobs.
FIXTURE_KNOBS = {
    "NUM_ENCODER_LAYERS": 3,
    "NUM_DECODER_LAYERS": 2,
    "MODEL_DIMS": 32,
    "NUM_HEADS": 4,
    "DIMS_PER_HEAD": 8,
    "HIDDEN_DIMS": 48,
    "VOCAB_SIZE": 256,
}


class _FixtureBatch(SyntheticSeq2SeqInput):
    """The rows transformers scored (outputs.npz), as a training batch, every step."""

    def get_next(self) -> NestedMap:
        out = np.load(FIXTURE / "outputs.npz")
        return NestedMap(
            encoder_input_tokens=out["input_ids"],
            decoder_input_tokens=out["decoder_input_ids"],
            decoder_target_tokens=out["labels"],
            decoder_loss_weights=out["decoder_mask"].astype(np.float32),
        )


def _transformers_loss() -> float:
    """The mean cross-entropy of the labels under transformers' logits (their real tokens)."""
    out = np.load(FIXTURE / "outputs.npz")
    logits = out["logits"].astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, out["labels"][..., None], -1)[..., 0]
    mask = out["decoder_mask"].astype(bool)
    return float(-picked[mask].mean())


def _fine_tune(init_from: pathlib.Path, job_dir: pathlib.Path, steps: int) -> list[dict]:
    """FlanT5Small with the fixture's sizes (float32, no z-loss, no dropout) from
    ``init_from``, ``steps`` steps on the fixture's batch; the steps' summaries."""
    knobs = {
        **FIXTURE_KNOBS,
        "INIT_FROM": str(init_from),
        "FPROP_DTYPE": jnp.float32,
        "Z_LOSS_WEIGHT": 0.0,
        "DROPOUT_PROB": 0.0,
        "ICI_MESH_SHAPE": (1, 1, 1),
        "PERCORE_BATCH_SIZE": 2,
        "NUM_TRAIN_STEPS": steps,
        "SUMMARY_INTERVAL_STEPS": 1,
        "CHECKPOINT_EVERY_N_STEPS": steps,
        "EVAL_INTERVAL_STEPS": 0,
        "DECODE_VALIDATION": False,
    }
    exp = base_experiment.with_overrides(FlanT5Small, knobs)()
    datasets = [config_lib.Config(_FixtureBatch, batch_size=2)]
    job_config.write_config(job_dir, exp, exp.task(), datasets)
    job = build_job(exp, exp.task(), datasets, job_dir, jax.devices()[:1])
    return [summary for _, summary in train_loop.run(job, peak_tflops=1.0).history]


MTF_FIXTURE = FIXTURES / "mtf" / "t5_1_1" / "model.ckpt-1000"  # The same weights, in MTF.


@pytest.mark.slow
@pytest.mark.parametrize("init_from", [T5X_FIXTURE, MTF_FIXTURE], ids=["t5x", "mtf"])
def test_flan_t5_fine_tunes_from_another_format_and_exports_as_hugging_face(tmp_path, init_from):
    """The same weights in T5X's legacy format (tests/fixtures/t5x, written from the HF
    fixture by tools/t5x_fixtures: its config.gin agrees with the knobs) or as an MTF prefix
    (scanned stacks, read layer by layer): the first loss is transformers'; the job keeps the
    config.json of the T5 they hold (from the tensors, for MTF), so it exports as HF T5."""
    job_dir = tmp_path / "job"
    (first,) = _fine_tune(init_from, job_dir, steps=1)
    np.testing.assert_allclose(first["loss"], _transformers_loss(), rtol=1e-5)
    export.export(job_dir, tmp_path / "hf")
    job = from_pretrained(job_dir)
    _assert_same_logits(from_pretrained(tmp_path / "hf"), job)
    assert job.tokenizer is None and job.origin is not None  # T5X and MTF keep no tokenizer.


def _logits(model) -> np.ndarray:
    """``model``'s logits for the fixture's rows (outputs.npz)."""
    out = np.load(FIXTURE / "outputs.npz")
    return model.logits(out["input_ids"], decoder_input_ids=out["decoder_input_ids"])


def _assert_same_logits(a, b) -> None:
    np.testing.assert_allclose(_logits(a), _logits(b), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_flan_t5_fine_tunes_from_a_hugging_face_directory_and_exports(tmp_path):
    """The job keeps the directory's tokenizer: loaded from the job, it generates from texts."""
    job_dir = tmp_path / "job"
    first, second = _fine_tune(FIXTURE, job_dir, steps=2)
    np.testing.assert_allclose(first["loss"], _transformers_loss(), rtol=1e-5)
    assert second["loss"] < first["loss"]  # Adafactor at 1e-3 on the same batch.

    files = export.export(job_dir, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    exported, job = from_pretrained(tmp_path / "hf"), from_pretrained(job_dir)
    _assert_same_logits(exported, job)
    assert_same_tokenizer(job.tokenizer, HfTokenizer.from_dir(FIXTURE))  # The job kept it.
    texts = job.generate(["summarize: The train", "The river"], max_new_tokens=4)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts), texts
    untuned = np.load(FIXTURE / "outputs.npz")["logits"]  # transformers', of the fixture.
    assert not np.allclose(_logits(exported), untuned, atol=1e-4)


@pytest.mark.parametrize(
    "init_from, overrides, disagrees, differences",
    [
        (
            FIXTURE,
            {"MODEL_DIMS": 64, "NUM_DECODER_LAYERS": 3},
            "disagrees with these knobs",
            "NUM_DECODER_LAYERS=3 (its 2); MODEL_DIMS=64 (its 32)",
        ),
        (
            MTF_FIXTURE,
            {"HIDDEN_DIMS": 64},
            "operative_config.gin disagrees with these knobs",
            "HIDDEN_DIMS=64 (its 48)",
        ),
    ],
    ids=["hf_config_json", "mtf_tensors"],
)
def test_knobs_that_disagree_with_the_checkpoint_are_one_line(
    init_from, overrides, disagrees, differences
):
    knobs = {**FIXTURE_KNOBS, **overrides, "INIT_FROM": str(init_from)}
    with pytest.raises(KnobError) as e:
        base_experiment.with_overrides(FlanT5Small, knobs)()
    message = str(e.value)
    assert "\n" not in message and disagrees in message
    assert differences in message


def test_pairs_from_a_hugging_face_t5_must_use_its_tokenizer(tmp_path):
    """T5TextTiny from a tiny Flan-T5 directory: VOCAB_PATH unset (bytes) or elsewhere is one
    line naming the directory's spiece.model; that model or the directory is accepted."""
    model_dir = tmp_path / "tiny-flan-t5"
    tiny_models.write("flan-t5", model_dir)

    def experiment(vocab: object) -> object:
        knobs = {"INIT_FROM": str(model_dir), "VOCAB_PATH": vocab, "TEXT_DATA_PATH": "pairs.jsonl"}
        return base_experiment.with_overrides(T5TextTiny, knobs)()

    for vocab in (None, str(FIXTURES / "hf" / "t5_flan" / "spiece.model")):
        with pytest.raises(KnobError) as e:
            experiment(vocab)
        assert "\n" not in str(e.value)
        assert f"set --set VOCAB_PATH={model_dir / 'spiece.model'}" in str(e.value)
    for vocab in (model_dir / "spiece.model", model_dir):
        experiment(str(vocab))
