"""LoRA fine-tuning of a Hugging Face model, and PEFT's adapter directories in and out.

Oracles: the logits PEFT itself computed with its adapters (tests/fixtures/hf/*_lora, made
by tools/hf_fixtures/make_peft_fixtures.py, which also checks our exports with peft); the
base weights' own bits before and after training; our exported adapter and merged model
read back against the job they came from.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from paxlite.checkpoints import checkpoint_sources
from paxlite.experiments import base_experiment, registry
from paxlite.experiments.base_experiment import KnobError
from paxlite.pretrained import adapters, export
from paxlite.pretrained.loading import PretrainedError, from_pretrained
from paxlite.runtime import job_config
from paxlite.runtime.job import build_job
from paxlite.train import train_loop, train_setup
from praxis_lite import config as config_lib
from praxis_lite.py_utils import NestedMap
from tasks.lm.hf import HfCausalLm
from tests import FIXTURES
from tests.paxlite.checkpoints.test_init_from import FixtureBatches
from tests.tasks.lm.test_hf_finetune import FAST

_HF = FIXTURES / "hf"
BASE = {"llama3_lora": "llama3", "gpt2_lora": "gpt2"}


class TiledFixtureBatches(FixtureBatches):
    """The fixture's 2 rows repeated to ``batch_size`` rows, every step."""

    def get_next(self):
        batch = super().get_next()
        return jax.tree_util.tree_map(lambda x: np.tile(x, (self.batch_size // len(x), 1)), batch)


@registry.register
class HfOnFixtureBatch(HfCausalLm):
    """HfCausalLm on a fixture's batch (TEXT_DATA_PATH: its outputs.npz) tiled to the
    global batch (registered: from_pretrained(job) finds it by name)."""

    def datasets(self):
        batch = round(self.PERCORE_BATCH_SIZE * np.prod(self.ICI_MESH_SHAPE))
        return [config_lib.Config(TiledFixtureBatches, batch_size=batch, path=self.TEXT_DATA_PATH)]


def _experiment(fixture: str, batch_size: int, **knobs) -> HfCausalLm:
    """HfOnFixtureBatch on a fixture's batch, ``batch_size`` rows over the mesh's devices."""
    devices = np.prod(knobs.get("ICI_MESH_SHAPE", FAST["ICI_MESH_SHAPE"]))
    path = str(_HF / fixture / "outputs.npz")
    knobs = {**FAST, "TEXT_DATA_PATH": path, "PERCORE_BATCH_SIZE": batch_size / devices, **knobs}
    return base_experiment.with_overrides(HfOnFixtureBatch, knobs)()


def _train(experiment, job_dir: pathlib.Path):
    """The run, with the job's config files written as main.py writes them."""
    job_config.write_config(job_dir, experiment, experiment.task(), experiment.datasets())
    devices = jax.devices()[: int(np.prod(experiment.ICI_MESH_SHAPE))]
    return train_loop.run(
        build_job(experiment, experiment.task(), experiment.datasets(), job_dir, devices),
        peak_tflops=1.0,  # No MFU calibration.
    )


def _loss(logits: np.ndarray, ids: np.ndarray) -> float:
    """Mean next-token cross-entropy (labels: the ids shifted left, wrapping)."""
    logits = logits.astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    labels = np.roll(ids, -1, axis=1)
    return float(-np.take_along_axis(log_probs, labels[..., None], -1).mean())


def _close(ours: np.ndarray, theirs: np.ndarray) -> None:
    np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max(), rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3_lora", "gpt2_lora"])
def test_peft_adapters_load_to_peft_logits_unmerged_and_merged(name):
    """llama3: q_proj, v_proj; gpt2: the fused c_attn (one A for q, k, v), c_proj (both
    attention's and the MLP's), c_fc, Conv1D weights, rsLoRA."""
    expected = np.load(_HF / name / "outputs.npz")
    base = _HF / BASE[name]
    model = from_pretrained(base, adapter=_HF / name)
    _close(model.logits(expected["ids"]), expected["logits"])
    merged = from_pretrained(base, adapter=_HF / name, merge=True)
    _close(merged.logits(expected["ids"]), expected["logits"])
    assert not any("_lora_" in p for p in traverse_util.flatten_dict(merged.params, sep="/"))
    with pytest.raises(adapters.AdapterError, match="hub") as e:
        from_pretrained(_HF / name)  # Its base_model_name_or_path is a hub id.
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_peft_adapter_continues_training_from_peft_logits(tmp_path):
    """--init_from of PEFT's adapter on top of HF_MODEL, LoRA knobs taken from its config, in
    a scanned stack: the first step's loss is the loss of PEFT's logits; then it falls."""
    exp = _experiment(
        "llama3_lora", 2, HF_MODEL=str(_HF / "llama3"), INIT_FROM=str(_HF / "llama3_lora")
    )
    assert (exp.LORA_RANK, exp.LORA_ALPHA, exp.LORA_TARGET_MODULES) == (4, 8.0, "q_proj,v_proj")
    result = _train(exp, tmp_path / "job")
    losses = [s["loss"] for _, s in result.history]
    expected = np.load(_HF / "llama3_lora" / "outputs.npz")
    np.testing.assert_allclose(losses[0], _loss(expected["logits"], expected["ids"]), rtol=1e-5)
    assert losses[-1] < losses[0], losses
    # Loaded back: the trained adapters (not INIT_FROM's), the base from HF_MODEL.
    loaded = traverse_util.flatten_dict(from_pretrained(tmp_path / "job").params, sep="/")
    for path, value in traverse_util.flatten_dict(result.state.params, sep="/").items():
        np.testing.assert_array_equal(np.asarray(loaded[path]), np.asarray(value), err_msg=path)
    with pytest.raises(KnobError, match="no local Hugging Face model directory") as e:
        _experiment("llama3_lora", 2, INIT_FROM=str(_HF / "llama3_lora"))  # No HF_MODEL.
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_bfloat16_jobs_float32_forward_is_pefts_when_asked_either_way(tmp_path):
    """A LoRA job trained in bfloat16 (HfCausalLm's default) holding PEFT's adapter unchanged
    (learning rate 0): ``dtype=jnp.float32`` or the override ``FPROP_DTYPE=float32`` computes
    PEFT's float32 logits of that adapter; unasked, the job computes as it trained."""
    knobs = dict(HF_MODEL=str(_HF / "llama3"), INIT_FROM=str(_HF / "llama3_lora"))
    knobs.update(FPROP_DTYPE=jnp.bfloat16, LEARNING_RATE=0.0, NUM_TRAIN_STEPS=1)
    job = tmp_path / "job"
    _train(_experiment("llama3_lora", 2, **knobs), job)
    expected = np.load(_HF / "llama3_lora" / "outputs.npz")
    ids, theirs = expected["ids"], expected["logits"]
    scale = np.abs(theirs).max()
    as_trained = from_pretrained(job).logits(ids)
    assert np.abs(as_trained - theirs).max() > 1e-3 * scale  # bfloat16's rounding shows.
    for asked in (dict(dtype=jnp.float32), dict(overrides=["FPROP_DTYPE=float32"])):
        logits = from_pretrained(job, **asked).logits(ids)
        np.testing.assert_allclose(logits, theirs, atol=1e-5 * scale, rtol=0, err_msg=str(asked))
    disagree = dict(dtype=jnp.float32, overrides=["FPROP_DTYPE=bfloat16"])
    with pytest.raises(PretrainedError, match="dtype=float32 and FPROP_DTYPE=bfloat16 disagree"):
        from_pretrained(job, **disagree)
    with pytest.raises(PretrainedError, match="overrides NUM_LAYERS cannot apply to") as e:
        from_pretrained(job, overrides=["NUM_LAYERS=3"])
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_lora_trains_only_the_adapters_and_exports_what_loads_back(tmp_path):
    """LoRA on q_proj,v_proj of llama3, 8 fake devices (FSDP over 'data'): the base stays
    bit-identical, the adapters move; the job, its PEFT export and its merged export give
    the same logits."""
    knobs = dict(
        ICI_MESH_SHAPE=(1, 8, 1),
        LORA_RANK=4,
        LORA_ALPHA=8.0,
        LORA_TARGET_MODULES="q_proj,v_proj",
        USE_REPEATED_LAYER=False,  # Leaves named as from_pretrained names them.
        NUM_TRAIN_STEPS=3,
    )
    exp = _experiment("llama3", 8, HF_MODEL=str(_HF / "llama3"), **knobs)
    job = tmp_path / "job"
    result = _train(exp, job)
    trained = traverse_util.flatten_dict(jax.device_get(result.state.params), sep="/")
    base = traverse_util.flatten_dict(
        jax.device_get(from_pretrained(_HF / "llama3").params), sep="/"
    )
    assert set(trained) - set(base) == {p for p in trained if "_lora_" in p} != set()
    for path, value in base.items():
        np.testing.assert_array_equal(trained[path], value, err_msg=path)  # Bit for bit.
    assert all(np.abs(v).max() > 0 for p, v in trained.items() if p.endswith("_lora_b"))
    assert json.loads((job / "frozen_start.json").read_text())["rules"] == {
        str(_HF / "llama3"): {"step": None, "load_rules": [["(.*)", "{}"]], "ignore_rules": None}
    }
    source = checkpoint_sources.open_source(job)  # Small: the adapters (and their moments).
    assert {n.rsplit("/", 1)[-1] for n in source.variables()} == {
        "w_q_lora_a",
        "w_q_lora_b",
        "w_v_lora_a",
        "w_v_lora_b",
    }
    source.close()
    again = _train(exp, job).state  # Resumed at its last step: the frozen base re-read.
    devices = jax.devices()[:8]
    with train_setup.restored(
        build_job(exp, exp.task(), exp.datasets(), job, devices), "eval"
    ) as run:
        evaluated = run.state.params  # What --mode=eval and --mode=decode read.
    for params in (again.params, evaluated):
        for path, value in traverse_util.flatten_dict(jax.device_get(params), sep="/").items():
            np.testing.assert_array_equal(value, trained[path], err_msg=path)

    ids = np.load(_HF / "llama3" / "outputs.npz")["ids"]
    ours = from_pretrained(job).logits(ids)  # Unmerged: the adapters in each projection.
    assert np.abs(ours - from_pretrained(_HF / "llama3").logits(ids)).max() > 1e-3
    _close(from_pretrained(job, merge=True).logits(ids), ours)
    written = export.export(job, tmp_path / "adapter", adapter=True)
    assert sorted(written) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["target_modules"] == ["q_proj", "v_proj"]
    assert config["base_model_name_or_path"] == str(_HF / "llama3")
    _close(from_pretrained(tmp_path / "adapter").logits(ids), ours)  # Its base: local.
    export.export(job, tmp_path / "merged")
    _close(from_pretrained(tmp_path / "merged").logits(ids), ours)
    # Another run starting from this one: its adapters from the job, the base from HF_MODEL.
    more = _experiment("llama3", 8, HF_MODEL=str(_HF / "llama3"), **knobs, INIT_FROM=str(job))
    first = _train(more, tmp_path / "more").history[0][1]["loss"]
    np.testing.assert_allclose(first, _loss(ours, ids), rtol=1e-5)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(LORA_RANK=4, LORA_TARGET_MODULES="q_proj,c_attn"), "llama has no module 'c_attn'"),
        (dict(LORA_RANK=-1), "LORA_RANK=-1 must be >= 0"),
        (dict(LORA_RANK=4, LORA_BASE_DTYPE="int8"), "LORA_BASE_DTYPE='int8'"),
        (
            dict(LORA_RANK=8, INIT_FROM=str(_HF / "llama3_lora")),
            "LORA_RANK=8 (adapter: 4)",
        ),
    ],
)
def test_lora_knob_errors_are_one_line(knobs, message):
    with pytest.raises(KnobError, match=re.escape(message)) as e:
        _experiment("llama3", 2, HF_MODEL=str(_HF / "llama3"), **knobs)
    assert "\n" not in str(e.value)


def test_an_adapter_put_on_another_base_is_refused_naming_both(tmp_path):
    """llama3_lora's config naming the llama3 fixture as its base; qwen2 has the same sizes
    and modules (the adapter's tensors fit it): only the bases' configs tell them apart."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (adapter / name).write_bytes((_HF / "llama3_lora" / name).read_bytes())
    fields = json.loads((adapter / "adapter_config.json").read_text())
    fields["base_model_name_or_path"] = str(_HF / "llama3")
    (adapter / "adapter_config.json").write_text(json.dumps(fields))
    expected = f"{adapter} adapts {_HF / 'llama3'}, but the base model given, {_HF / 'qwen2'}"
    with pytest.raises(KnobError, match=re.escape(f"HF_MODEL: {expected}")):
        _experiment("llama3", 2, HF_MODEL=str(_HF / "qwen2"), INIT_FROM=str(adapter))
    with pytest.raises(adapters.AdapterError, match=re.escape(expected)):
        from_pretrained(_HF / "qwen2", adapter=adapter)


def test_our_own_lms_take_praxis_target_names():
    from tasks.lm.synthetic import LmSyntheticTiny

    exp = base_experiment.with_overrides(
        LmSyntheticTiny, {"LORA_RANK": 2, "LORA_TARGET_MODULES": "all-linear"}
    )()
    task = config_lib.instantiate(exp.task())
    assert task.learner.bprop_variable_inclusion == ("params/.*_lora_[ab]$",)
    with pytest.raises(KnobError, match="does not have; choose from query, key"):
        base_experiment.with_overrides(
            LmSyntheticTiny, {"LORA_RANK": 2, "LORA_TARGET_MODULES": "q_proj"}
        )()
    with pytest.raises(KnobError, match="set COMBINE_QKV=false"):
        base_experiment.with_overrides(LmSyntheticTiny, {"LORA_RANK": 2, "COMBINE_QKV": True})()


def test_a_bfloat16_base_with_float32_adapters_and_their_optimizer_state_only():
    """LORA_BASE_DTYPE=bfloat16 on LmSyntheticTiny, abstract state (nothing allocated)."""
    from paxlite.train import pure_steps
    from tasks.lm.synthetic import LmSyntheticTiny

    knobs = {"LORA_RANK": 2, "LORA_TARGET_MODULES": "query,value,ffn_layer2"}
    exp = base_experiment.with_overrides(
        LmSyntheticTiny, {**knobs, "LORA_BASE_DTYPE": "bfloat16"}
    )()
    task = config_lib.instantiate(exp.task())
    dtypes = dict(ids=np.int32, labels=np.int32, weights=np.float32, paddings=np.float32)
    batch = NestedMap({k: jax.ShapeDtypeStruct((2, 8), v) for k, v in dtypes.items()})
    init = pure_steps.make_init_fn(task)
    state = jax.eval_shape(lambda b: init(jax.random.key(0), b), batch)
    params = traverse_util.flatten_dict(state.params, sep="/")
    adapters_ = {p: v.value.dtype for p, v in params.items() if "_lora_" in p}
    assert {p.rsplit("/", 1)[-1] for p in adapters_} == {
        "w_q_lora_a",
        "w_q_lora_b",
        "w_v_lora_a",
        "w_v_lora_b",
        "w_lora_a",
        "w_lora_b",
    }
    assert set(adapters_.values()) == {np.dtype(np.float32)}
    assert {v.value.dtype for p, v in params.items() if p not in adapters_} == {
        np.dtype(jnp.bfloat16)
    }
    moments = jax.tree_util.tree_leaves(state.opt_state)
    adapter_size = sum(v.value.size for p, v in params.items() if p in adapters_)
    assert sum(x.size for x in moments if x.ndim) == 2 * adapter_size  # Adam's mu and nu.


def test_export_command_line_flags_live_beside_the_trainers():
    """paxlite-export reads frozen weights through paxlite.pretrained.loading, which brings the
    trainer's absl flags (--job_log_dir too): the two sets must not collide."""
    code = (
        "from paxlite.pretrained import export; export.define_flags(export._FLAGS); "
        "import paxlite.pretrained.loading; "
        "print(export._parse(['paxlite-export', '--job_log_dir=a', '--out=b', '--adapter']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['paxlite-export']"
