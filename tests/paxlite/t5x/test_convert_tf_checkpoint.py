"""``python -m paxlite.t5x.convert_tf_checkpoint`` in this process, on the Mesh TensorFlow
fixture tests/fixtures/mtf/t5_1_1 (t5_flan's weights saved by TensorFlow).

Oracles: transformers' logits for those weights (tests/fixtures/hf/t5_flan/outputs.npz): each
of the three outputs loads back to them; TensorFlow's reader for the Adafactor slots T5X's
output carries. By hand (closing note): T5X's own ``checkpoints.load_t5x_checkpoint`` reads
the t5x output to the same arrays, and transformers loads the hf output to the same logits
(tools/hf_fixtures/make_mtf_outputs.py).
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest

from paxlite.checkpoints import checkpoint_sources
from paxlite.pretrained.loading import from_pretrained
from paxlite.t5x import convert_tf_checkpoint
from tests import FIXTURES
from tests.paxlite.t5x.commands import refusal, run_in_process
from tests.processes import run_python

MTF = FIXTURES / "mtf" / "t5_1_1"
SPM = FIXTURES / "hf" / "t5_flan" / "spiece.model"
OUTPUTS = FIXTURES / "hf" / "t5_flan" / "outputs.npz"
#: The fixture's sizes as knobs of a paxlite T5 experiment (for the paxlite output).
FIXTURE_KNOBS = [
    "NUM_ENCODER_LAYERS=3",
    "NUM_DECODER_LAYERS=2",
    "MODEL_DIMS=32",
    "NUM_HEADS=4",
    "DIMS_PER_HEAD=8",
    "HIDDEN_DIMS=48",
    "VOCAB_SIZE=256",
    "ICI_MESH_SHAPE=1,1,1",
    "FPROP_DTYPE=float32",
]


def run_convert(*argv: str) -> tuple[int, str, str]:
    """``python -m paxlite.t5x.convert_tf_checkpoint ARGV``: ``(exit code, stdout, stderr)``."""
    return run_in_process(convert_tf_checkpoint.main, "convert_tf_checkpoint", argv)


def _logits_gap(t5) -> float:
    out = dict(np.load(OUTPUTS))
    logits = t5.logits(out["input_ids"], decoder_input_ids=out["decoder_input_ids"])
    mask = out["decoder_mask"].astype(bool)
    return float(np.abs(logits[mask] - out["logits"][mask]).max() / np.abs(out["logits"]).max())


def _converted(tmp_path: pathlib.Path, output_format: str, *extra: str) -> pathlib.Path:
    output = tmp_path / output_format
    code, out, err = run_convert(
        f"--tf_checkpoint_path={MTF}/model.ckpt-1000",
        f"--output_dir={output}",
        f"--output_format={output_format}",
        *extra,
    )
    assert code == 0, err[-3000:]
    assert "T5 3+2 blocks, d_model 32, 4 heads x 8, d_ff 48 gelu/linear, vocab 256" in out
    return output


@pytest.mark.slow
def test_the_t5x_output_loads_back_to_transformers_logits_with_mtf_s_step_and_slots(tmp_path):
    output = _converted(tmp_path, "t5x")
    assert (output / "checkpoint_1000" / "checkpoint").is_file()
    assert _logits_gap(from_pretrained(output)) <= 1e-4  # Its config.gin names the T5.
    source = checkpoint_sources.open_source(output)
    assert source.kind == "t5x checkpoint" and source.step == 1000
    mtf = checkpoint_sources.open_source(MTF)
    name = "encoder/layers_1/mlp/wi_0/kernel"
    mtf_name = "encoder/block_001/layer_001/DenseReluDense/wi_0/kernel"
    for slot in ("v_row", "v_col"):  # [32, 48]: MTF's and T5X's keep the same dims.
        np.testing.assert_array_equal(
            source.read_whole(f"state/param_states/{name}/{slot}"),
            mtf.read_whole(f"state/param_states/{mtf_name}/{slot}"),
        )
    assert source.state_variables()[f"state/param_states/{name}/v"].shape == (1,)  # T5X's.
    query, q = (
        "encoder/layers_0/attention/query/kernel",
        "encoder/block_000/layer_000/SelfAttention/q",
    )
    for ours, theirs in (("v_row", "v_col"), ("v_col", "v_row")):  # Square: swapped for T5X.
        np.testing.assert_array_equal(
            source.read_whole(f"state/param_states/{query}/{ours}"),
            mtf.read_whole(f"state/param_states/{q}/{theirs}"),
        )


@pytest.mark.slow
def test_the_hf_output_loads_back_with_its_sentencepiece_model_in_bfloat16(tmp_path):
    output = _converted(tmp_path, "hf", f"--sentencepiece_model={SPM}", "--save_dtype=bfloat16")
    assert (output / "spiece.model").read_bytes() == SPM.read_bytes()
    t5 = from_pretrained(output)
    assert t5.tokenizer is not None
    assert str(next(iter(t5.params["network"]["embedding"].values())).dtype) == "bfloat16"
    assert _logits_gap(from_pretrained(output, dtype=np.float32)) <= 2e-2  # bfloat16 weights.


@pytest.mark.slow
def test_the_paxlite_output_is_a_scanned_checkpoint_a_t5_experiment_loads(tmp_path):
    output = _converted(tmp_path, "paxlite")
    assert (output / "checkpoints" / "1000").is_dir()
    t5 = from_pretrained(output, exp="FlanT5Small", overrides=FIXTURE_KNOBS)
    assert _logits_gap(t5) <= 1e-4


def _gin_form(tmp_path: pathlib.Path, sizes: str) -> tuple[int, str, str]:
    gin_file = tmp_path / "convert.gin"
    gin_file.write_text(
        "from __gin__ import dynamic_registration\n"
        "from t5x.examples.t5 import network\n"
        "include 't5x/examples/t5/t5_1_1/tiny.gin'\n"
        "DROPOUT_RATE = 0.0\n"  # %gin.REQUIRED in T5 1.1's base.gin, for T5X's script too.
        f"network.T5Config:\n{sizes}"
    )
    return run_convert(
        f"--gin_file={gin_file}",
        "--gin.convert_checkpoint.model=%MODEL",
        f'--gin.convert_checkpoint.tf_checkpoint_path="{MTF}/model.ckpt-1000"',
        f'--gin.convert_checkpoint.output_dir="{tmp_path / "out"}"',
    )


_FIXTURE_SIZES = (
    "  vocab_size = 256\n  emb_dim = 32\n  num_heads = 4\n  num_encoder_layers = 3\n"
    "  num_decoder_layers = 2\n  head_dim = 8\n  mlp_dim = 48\n"
)


@pytest.mark.slow
def test_t5x_s_gin_form_writes_what_its_flags_write(tmp_path):
    code, out, err = _gin_form(tmp_path, _FIXTURE_SIZES)
    assert code == 0, err[-3000:]
    assert "a T5X checkpoint" in out
    assert _logits_gap(from_pretrained(tmp_path / "out")) <= 1e-4


def _refused(code: int, err: str, output: pathlib.Path | None = None) -> str:
    """The one error line of a refused conversion, checked: exit 2, nothing written in
    ``output`` (when given)."""
    line = refusal(code, err)
    if output is not None:
        assert not output.exists() or not any(output.iterdir())
    return line


def test_a_gin_model_of_other_sizes_is_named(tmp_path):
    code, _, err = _gin_form(tmp_path, "  vocab_size = 256\n")  # tiny.gin's sizes otherwise.
    line = _refused(code, err, tmp_path / "out")
    assert "convert_checkpoint.model is not the model of" in line
    assert "model_dims 8 (the checkpoint's 32)" in line


def test_an_output_dir_with_files_is_not_overwritten(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("kept")
    code, _, err = run_convert(f"--tf_checkpoint_path={MTF}", f"--output_dir={tmp_path / 'out'}")
    assert "is not empty" in _refused(code, err)
    assert (tmp_path / "out" / "mine.txt").read_text() == "kept"


def test_no_checkpoint_at_the_path_and_no_flags(tmp_path):
    code, _, err = run_convert(
        f"--tf_checkpoint_path={tmp_path}/model.ckpt-5", f"--output_dir={tmp_path / 'out'}"
    )
    assert "does not exist" in _refused(code, err, tmp_path / "out")
    code, _, err = run_convert()
    assert "give --tf_checkpoint_path" in _refused(code, err)


BF16 = FIXTURES / "mtf" / "t5_1_0_bf16"  # Tied logits, ReLU, bfloat16 variables.


@pytest.mark.slow
def test_the_tied_bfloat16_checkpoint_converts_without_a_vocabulary_said_so(tmp_path):
    output = tmp_path / "hf"
    code, out, err = run_convert(
        f"--tf_checkpoint_path={BF16}", f"--output_dir={output}", "--output_format=hf"
    )
    assert code == 0, err[-3000:]
    assert "no spiece.model will be written: give --sentencepiece_model=FILE" in out
    assert "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model" in out  # Its config's.
    assert not (output / "spiece.model").exists()
    want = dict(np.load(BF16 / "outputs.npz"))  # transformers on the bfloat16 weights.
    t5 = from_pretrained(output, dtype=np.float32)
    logits = t5.logits(want["input_ids"], decoder_input_ids=want["decoder_input_ids"])
    mask = want["decoder_mask"].astype(bool)
    np.testing.assert_allclose(
        logits[mask], want["logits"][mask], atol=1e-4 * np.abs(want["logits"][mask]).max()
    )


def test_a_flag_of_another_output_format_is_refused(tmp_path):
    code, _, err = run_convert(
        f"--tf_checkpoint_path={MTF}",
        f"--output_dir={tmp_path / 'out'}",
        f"--sentencepiece_model={SPM}",
    )
    assert "--sentencepiece_model is for --output_format=hf" in _refused(
        code, err, tmp_path / "out"
    )


@pytest.mark.slow
def test_a_truncated_shard_at_the_command_line_is_one_line_and_nothing_written(tmp_path):
    """The command as users run it (its own process: exit codes and error lines are
    paxlite.cli's): the shard ends early, found while writing."""
    checkpoint = pathlib.Path(shutil.copytree(MTF, tmp_path / "mtf"))
    data = checkpoint / "model.ckpt-1000.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    output = tmp_path / "out"
    done = run_python(
        [
            "-m",
            "paxlite.t5x.convert_tf_checkpoint",
            f"--tf_checkpoint_path={checkpoint}",
            f"--output_dir={output}",
        ]
    )
    line = _refused(done.returncode, done.stderr, output)
    assert "cannot be read from its data shards" in line and "nothing written" in line
