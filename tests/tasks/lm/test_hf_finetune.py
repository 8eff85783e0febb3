"""Fine-tuning a Hugging Face model as an experiment (tasks.lm.hf.HfCausalLm) and exporting it.

Oracles: the loss of transformers' own logits on a fixture batch (the first step's loss);
the loss falling on every family's fixture; an exported directory read back against the
job it came from (transformers loads it to the same logits: tools/hf_fixtures --check).
"""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from safetensors import safe_open

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.pretrained import export
from paxlite.pretrained.loading import from_pretrained
from paxlite.runtime import job_config
from paxlite.runtime.job import build_job
from paxlite.train import train_loop
from praxis_lite import config as config_lib
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tasks.lm.hf import HfCausalLm, Records
from tasks.lm.text import TextFormat
from tests import FIXTURES
from tests.paxlite.checkpoints.test_init_from import FixtureBatches
from tests.paxlite.formats.hf.test_checkpoint import assert_written_with_umask
from tests.paxlite.pretrained.test_loading import assert_same_tokenizer
from tests.paxlite.test_main import run_main_in_process

_HF = FIXTURES / "hf"
FAMILIES = ["llama2", "llama3", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2"]
LINES = [
    "The quick brown fox jumps over the lazy dog!",
    "Hello, world! How are you today?",
    "Numbers: 1 2 3 4 5 6 7 8 9 10!",
]
FAST = {
    "ICI_MESH_SHAPE": (1, 1, 1),
    "PERCORE_BATCH_SIZE": 0.5,  # 4 rows: the batch is per device of this 8-device process.
    "MAX_SEQ_LEN": 32,
    "NUM_TRAIN_STEPS": 4,
    "LEARNING_RATE": 1e-2,
    "SUMMARY_INTERVAL_STEPS": 1,
    "CHECKPOINT_EVERY_N_STEPS": 1000,
    "FPROP_DTYPE": np.float32,
}


def _experiment(name: str, **knobs) -> HfCausalLm:
    return base_experiment.with_overrides(
        HfCausalLm, {"HF_MODEL": str(_HF / name), **FAST, **knobs}
    )()


def _run(experiment, job_dir):
    """Trains on one device; a given peak (MFU is not checked here) spares each run the
    calibrating matmuls (about a second of the 2 cores)."""
    job = build_job(
        experiment, experiment.task(), experiment.datasets(), job_dir, jax.devices()[:1]
    )
    return train_loop.run(job, peak_tflops=1.0)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "train.txt"
    path.write_text("\n".join(LINES * 20) + "\n")
    return str(path)


def _transformers_loss(fixture: pathlib.Path) -> float:
    """Mean next-token cross-entropy (labels: the ids shifted left, wrapping) of the logits
    transformers computed on the fixture's batch, in float64 numpy."""
    out = np.load(fixture)
    logits, labels = out["logits"].astype(np.float64), np.roll(out["ids"], -1, axis=1)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(log_probs, labels[..., None], -1).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_fine_tunes_from_transformers_loss(name, tmp_path):
    """Each family on its fixture's batch, from its weights at step 0: the first step's loss is
    transformers' (its stored logits), and 4 steps lower it."""
    fixture = _HF / name / "outputs.npz"
    knobs = {
        "HF_MODEL": str(_HF / name), **FAST, "TEXT_DATA_PATH": "unused",
        "PERCORE_BATCH_SIZE": 0.25,  # The fixture's 2 rows.
        "USE_REPEATED_LAYER": name != "gemma2",  # Its layers' windows alternate.
    }  # fmt: skip

    class OnFixtureBatch(base_experiment.with_overrides(HfCausalLm, knobs)):
        def datasets(self):
            return [config_lib.Config(FixtureBatches, batch_size=2, path=str(fixture))]

    losses = [s["loss"] for _, s in _run(OnFixtureBatch(), tmp_path / "job").history]
    np.testing.assert_allclose(losses[0], _transformers_loss(fixture), rtol=1e-5)
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses


@pytest.mark.slow
def test_text_files_tokenized_by_the_models_tokenizer(tmp_path):
    """llama3 (its "!" is id 0) on a text file through SeqIO: the loss falls. Its batch is
    shaped as llama3's fixture batch (2 unpacked rows of 16 tokens), so this job's train step
    is that of test_each_family_fine_tunes_from_transformers_loss[llama3], compiled once in a
    test run (JAX's persistent cache)."""
    text = tmp_path / "train.txt"
    text.write_text("\n".join(LINES * 20) + "\n")
    batch = dict(PERCORE_BATCH_SIZE=0.25, MAX_SEQ_LEN=16, PACKED_INPUT=False)
    exp = _experiment("llama3", TEXT_DATA_PATH=str(text), DECODE_PROMPT_LEN=8, **batch)
    losses = [s["loss"] for _, s in _run(exp, tmp_path / "job").history]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses


@pytest.mark.slow
def test_prompt_completion_records_fine_tune_and_export_round_trips(tmp_path):
    """qwen2 on prompt/completion JSONL; the job keeps the model's files (written with its
    config, as main.py writes them); paxlite-export writes the fine-tuned weights under the
    original names (its files as the umask says), read back to the job's own logits; loaded
    from the job, the model has the directory's tokenizer (text in, text out) and
    save_pretrained writes what export does."""
    pairs = tmp_path / "pairs.jsonl"
    records = [{"prompt": f"{w} = ", "completion": w[::-1]} for w in ("abc", "hello", "world!")]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in records * 20))
    exp = _experiment(
        "qwen2",
        TEXT_DATA_PATH=str(pairs),
        RECORDS=Records.PROMPT_COMPLETION,
        TEXT_FORMAT=TextFormat.JSONL,
        MAX_PROMPT_LEN=12,
    )
    job = tmp_path / "job"
    job_config.write_config(job, exp, exp.task(), exp.datasets())
    assert {p.name for p in (job / "hf_model").iterdir()} >= {"config.json", "tokenizer.json"}
    losses = [s["loss"] for _, s in _run(exp, job).history]
    assert losses[-1] < losses[0], losses

    out, files = tmp_path / "exported", []
    assert_written_with_umask(lambda: files.extend(export.export(job, out, dtype="float32")), out)
    assert "model.safetensors" in files and "tokenizer.json" in files
    exported = _tensors(out)
    with safe_open(str(_HF / "qwen2" / "model.safetensors"), "numpy") as f:
        assert set(exported) == set(f.keys())
    ids = np.load(_HF / "qwen2" / "outputs.npz")["ids"]
    lm = from_pretrained(job / "checkpoints" / str(FAST["NUM_TRAIN_STEPS"]))  # The job's step.
    want = lm.logits(ids)
    np.testing.assert_allclose(from_pretrained(out).logits(ids), want, rtol=1e-5, atol=1e-5)
    assert_same_tokenizer(lm.tokenizer, HfTokenizer.from_dir(_HF / "qwen2"))
    texts = lm.generate(["abc = ", "The river"], max_new_tokens=4)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts), texts
    lm.save_pretrained(tmp_path / "saved")  # The job's model as Hugging Face's: as exported.
    saved = _tensors(tmp_path / "saved")
    assert set(saved) == set(exported)
    for name, value in exported.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    with pytest.raises(export.ExportError, match="keeps no hf_model/config.json") as e:
        export.export(tmp_path, tmp_path / "nothing")
    assert "\n" not in str(e.value)


def _tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """The tensors of ``directory``'s model.safetensors, by name."""
    with safe_open(str(directory / "model.safetensors"), "numpy") as f:
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118


def test_a_size_knob_is_not_one_and_names_config_json(text_file):
    with pytest.raises(KnobError) as e:
        _experiment("llama3", TEXT_DATA_PATH=text_file, NUM_LAYERS=4, MODEL_DIMS=32)
    message = str(e.value)
    assert "\n" not in message and "has no knob 'NUM_LAYERS'" in message
    assert "config.json (num_hidden_layers) builds the model" in message


@pytest.mark.slow
def test_a_model_without_weights_is_refused_unless_random_weights_are_asked(
    tmp_path, text_file, capsys
):
    """A download that fetched config.json and the tokenizer only: HfCausalLm refuses it in
    one line (exit 2, the job dir it made removed); HF_RANDOM_INIT=True trains it, and says so."""
    no_weights = shutil.copytree(
        _HF / "llama3", tmp_path / "no_weights", ignore=lambda *_: ("model.safetensors",)
    )
    job_dir = tmp_path / "job"
    code, _, err = run_main_in_process(
        "--mode=train",
        f"--job_log_dir={job_dir}",
        f"--set=HF_MODEL={no_weights}",
        f"--set=TEXT_DATA_PATH={text_file}",
        "--set=MAX_SEQ_LEN=32",
        "--set=ICI_MESH_SHAPE=1,8,1",
        exp="tasks.lm.hf.HfCausalLm",
    )
    assert code == 2 and err.count("paxlite: error:") == 1, err[-2000:]
    assert f"{no_weights} has config.json but no weights" in err
    assert not job_dir.exists()  # Nothing of the refused start: no config, model files, step 0.
    knobs = {"HF_MODEL": str(no_weights), "TEXT_DATA_PATH": text_file, "HF_RANDOM_INIT": True}
    experiment = base_experiment.with_overrides(HfCausalLm, {**FAST, **knobs})()
    capsys.readouterr()
    _run(experiment, tmp_path / "random")
    out = capsys.readouterr().out
    assert "Every parameter initialised from the seed (SEED=1234): no checkpoint loads them." in out
    assert "Initialised" not in out.replace("Every parameter initialised", "")


def test_random_weights_and_init_from_are_one_error(text_file):
    with pytest.raises(KnobError, match="HF_RANDOM_INIT=True and INIT_FROM=/ckpt both say"):
        _experiment("llama3", TEXT_DATA_PATH=text_file, HF_RANDOM_INIT=True, INIT_FROM="/ckpt")


@pytest.mark.slow
def test_a_config_alone_sizes_the_job(tmp_path):
    """--mode=compile with HF_MODEL a directory of config.json only (no weights, no
    tokenizer) on the 8 fake CPU devices."""
    only = tmp_path / "config_only"
    only.mkdir()
    (only / "config.json").write_text((_HF / "mistral" / "config.json").read_text())
    code, out, err = run_main_in_process(
        "--mode=compile",
        f"--set=HF_MODEL={only}",
        "--set=TEXT_DATA_PATH=/nonexistent.txt",
        "--set=MAX_SEQ_LEN=32",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=PERCORE_BATCH_SIZE=1",
        exp="tasks.lm.hf.HfCausalLm",
    )
    assert code == 0, err[-2000:]
    assert "Compiled tasks.lm.hf.HfCausalLm for 8 fake CPU devices" in out
