"""The T5 1.1 and Flan-T5 catalogue under T5X's sizes and setup; a T5X user's SeqIO task
module trains unchanged; a module importing T5's own ``t5.data`` is a one-line error."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import jax
import numpy as np
import pytest

from paxlite.experiments import base_experiment, registry
from praxis_lite import config as config_lib
from praxis_lite.optim import optimizers, schedules
from praxis_lite.py_utils import NestedMap
from tasks.t5 import flan_t5, t5_1_1
from tests.paxlite.test_main import run_main_in_process

#: T5X's t5_1_1/{size}.gin: emb_dim, num_heads, mlp_dim, layers on each side (head_dim 64).
T5X_SIZES = {
    "Small": (512, 6, 1024, 8),
    "Base": (768, 12, 2048, 12),
    "Large": (1024, 16, 2816, 24),
    "Xl": (2048, 32, 5120, 24),
    "Xxl": (4096, 64, 10240, 24),
}


def t5x_parameters(emb: int, heads: int, mlp: int, layers: int, vocab: int = 32128) -> int:
    """T5 1.1's parameters counted by hand from T5X's network: the token embedding and
    the separate logits kernel [V, E]; per encoder layer q, k, v, o [E, H*64], a gated MLP
    (wi_0, wi_1 [E, F], wo [F, E]) and 2 norms [E]; per decoder layer one more attention
    and norm; 2 final norms; one relative-bias table [H, 32] per stack."""
    attention, ffn = 4 * emb * heads * 64, 3 * emb * mlp
    encoder = layers * (attention + ffn + 2 * emb)
    decoder = layers * (2 * attention + ffn + 3 * emb)
    return 2 * vocab * emb + encoder + decoder + 2 * emb + 2 * heads * 32


def _parameters(experiment) -> int:
    model = config_lib.instantiate(experiment.task()).model
    batch = NestedMap(
        {
            key: jax.ShapeDtypeStruct((1, 8), np.int32)
            for key in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens")
        }
    )
    shapes = jax.eval_shape(lambda b: model.init(jax.random.key(0), b), batch)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["params"]))


@pytest.mark.parametrize("size", list(T5X_SIZES))
def test_sizes_are_t5xs_and_have_t5xs_parameters(size):
    """Each size under both names; its parameters are a hand count of T5X's model."""
    for family in ("T5v11", "FlanT5"):
        module = t5_1_1 if family == "T5v11" else flan_t5
        exp = getattr(module, family + size)()
        emb, heads, mlp, layers = T5X_SIZES[size]
        got = (exp.MODEL_DIMS, exp.NUM_HEADS, exp.HIDDEN_DIMS, exp.NUM_ENCODER_LAYERS)
        assert got == (emb, heads, mlp, layers) and exp.NUM_DECODER_LAYERS == layers
        assert (exp.head_dims(), exp.VOCAB_SIZE, exp.MLP_ACTIVATIONS) == (
            64,
            32128,
            ("gelu", "linear"),
        )
        devices = int(np.prod(exp.ICI_MESH_SHAPE))
        assert exp.global_batch_size(devices) == 128  # T5X's BATCH_SIZE.
    if size in ("Small", "Base"):  # The larger ones: the same count, more seconds.
        assert _parameters(getattr(t5_1_1, "T5v11" + size)()) == t5x_parameters(*T5X_SIZES[size])


def test_the_pretraining_and_fine_tuning_setups_are_t5xs():
    task_cfg = t5_1_1.T5v11Base().task()
    pretrain = config_lib.instantiate(task_cfg)
    opt = pretrain.learner.optimizer
    assert isinstance(opt, optimizers.Adafactor) and opt.factor_rules == optimizers.T5X_FACTOR_RULES
    assert (opt.decay_rate, opt.clipping_threshold, opt.momentum) == (0.8, 1.0, None)
    assert opt.multiply_by_parameter_scale and opt.learning_rate == 1.0
    assert opt.lr_schedule == schedules.RsqrtDecay(warmup_steps=10_000)
    assert pretrain.learner.loss_normalizing_factor == 1.0  # T5X's None: the summed loss.
    network = task_cfg.model.encoder_decoder_tpl
    assert network.softmax_tpl.z_loss_weight == 1e-4
    assert network.softmax_tpl.fprop_dtype == np.float32  # T5X's float32 logits.
    assert network.encoder_stack_tpl.block_tpl.fprop_dtype == jax.numpy.bfloat16

    task_cfg = flan_t5.FlanT5Xxl().task()
    opt = config_lib.instantiate(task_cfg).learner.optimizer
    assert opt.learning_rate == 1e-3 and opt.lr_schedule == schedules.Constant()
    assert task_cfg.model.encoder_decoder_tpl.dropout_prob == 0.1
    exp = base_experiment.with_overrides(flan_t5.FlanT5Base, {"LOSS_NORMALIZING_FACTOR": 233472})
    assert config_lib.instantiate(exp().task()).learner.loss_normalizing_factor == 233472.0
    exp = base_experiment.with_overrides(
        flan_t5.FlanT5Base, {"LOSS_NORMALIZING_FACTOR": "NUM_REAL_TARGET_TOKENS"}
    )
    assert config_lib.instantiate(exp().task()).learner.loss_normalizing_factor is None


def test_the_catalogue_is_registered_under_t5xs_names():
    names = registry.get_all()
    for size in T5X_SIZES:
        assert f"tasks.t5.t5_1_1.T5v11{size}" in names
        assert f"tasks.t5.flan_t5.FlanT5{size}" in names


def _write_user_module(tmp_path, name: str) -> str:
    """A T5X user's task module, as T5X's docs write one: TSV files, bytes, seqio's own
    preprocessors and metrics; registers ``name``."""
    rows = [(w + "!", w.upper()) for w in ("cat", "dog", "emu", "fox", "gnu", "hen", "owl")]
    for split, n in (("train", 7), ("validation", 3)):
        text = "".join(f"{a}\t{b}\n" for a, b in rows[:n])
        (tmp_path / f"{split}.tsv").write_text(text)
    source = f'''
        import functools

        import seqio
        import tensorflow as tf

        def _parse(dataset):
            def split(line):
                inputs, targets = tf.io.decode_csv(line, ["", ""], field_delim="\\t")
                return {{"inputs": inputs, "targets": targets}}
            return dataset.map(split)

        def exact(targets, predictions):
            return {{"exact": float(sum(t == p for t, p in zip(targets, predictions)))}}

        VOCAB = seqio.ByteVocabulary()
        seqio.TaskRegistry.add(
            "{name}",
            source=seqio.TextLineDataSource(
                split_to_filepattern={{
                    "train": "{tmp_path}/train.tsv", "validation": "{tmp_path}/validation.tsv"
                }}
            ),
            preprocessors=[
                _parse,
                seqio.preprocessors.tokenize,
                seqio.preprocessors.append_eos_after_trim,
            ],
            output_features={{
                "inputs": seqio.Feature(VOCAB, add_eos=True),
                "targets": seqio.Feature(VOCAB, add_eos=True),
            }},
            metric_fns=[exact],
        )
    '''
    module = f"user_tasks_{name}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    return module


TINY = [
    "--set=NUM_ENCODER_LAYERS=1",
    "--set=NUM_DECODER_LAYERS=1",
    "--set=MODEL_DIMS=32",
    "--set=NUM_HEADS=2",
    "--set=DIMS_PER_HEAD=16",
    "--set=HIDDEN_DIMS=64",
    "--set=VOCAB_SIZE=384",
    "--set=ICI_MESH_SHAPE=(1,8,1)",  # This process's 8 fake CPU devices.
    "--set=PERCORE_BATCH_SIZE=1",
    "--set=TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
]


@pytest.mark.slow
def test_a_t5x_users_task_module_trains_and_decodes_unchanged(tmp_path, monkeypatch):
    """FlanT5Small (shrunk by knobs) on a task registered by the user's own module, named by
    T5X's macros: 4 steps, an eval of EVAL_STEPS batches, the validation inputs decoded and
    scored by the task's own metric."""
    module = _write_user_module(tmp_path, "t5x_user_task")
    monkeypatch.syspath_prepend(str(tmp_path))
    job = tmp_path / "job"
    code, out, err = run_main_in_process(
        f"--job_log_dir={job}",
        "--mode=train_and_eval",
        *TINY,
        "--set=MIXTURE_OR_TASK_NAME=t5x_user_task",
        f"--set=MIXTURE_OR_TASK_MODULE={module}",
        "--set=NUM_TRAIN_STEPS=4",
        "--set=EVAL_INTERVAL_STEPS=4",
        "--set=EVAL_STEPS=2",
        "--set=SUMMARY_INTERVAL_STEPS=1",
        "--peak_tflops=1.0",
        exp="tasks.t5.flan_t5.FlanT5Small",
    )
    assert code == 0, err
    assert "step       4/4" in out and "eval 'validation' at step 4" in out, out
    rows = [json.loads(r) for r in (job / "decoder_out/validation_decode_step4.jsonl").open()]
    assert sorted(r["prompt"] for r in rows) == ["cat!", "dog!", "emu!"]
    assert sorted(r["target"] for r in rows) == ["CAT", "DOG", "EMU"]
    assert "exact" in out


def test_a_module_importing_t5_data_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "uses_t5.py").write_text("import t5.data\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_main_in_process(
        "--job_log_dir=" + str(tmp_path / "job"),
        *TINY,
        "--set=MIXTURE_OR_TASK_NAME=glue_cola_v002",
        "--set=MIXTURE_OR_TASK_MODULE=uses_t5",
        exp="tasks.t5.flan_t5.FlanT5Small",
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("paxlite: error: MIXTURE_OR_TASK_MODULE 'uses_t5' imports 't5'")
    assert "seqio.TaskRegistry.add" in lines[0]
    assert "uses_t5" not in sys.modules


@pytest.mark.parametrize(
    "source, message",
    [
        (None, "'{m}' is not importable"),
        ("import no_such_package_xyz\n", "'{m}' imports 'no_such_package_xyz', not installed"),
        ("raise ValueError('bad\\nrest')\n", "'{m}' failed while importing: ValueError: bad;"),
    ],
    ids=["missing", "missing_import", "raises"],
)
def test_task_module_errors_are_one_line(tmp_path, monkeypatch, source, message):
    module = f"user_module_{len(message)}"
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
    exp = base_experiment.with_overrides(flan_t5.FlanT5Small, {"MIXTURE_OR_TASK_MODULE": module})
    with pytest.raises(base_experiment.KnobError, match=re.escape(message.format(m=module))) as e:
        exp().datasets()
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_no_task_is_one_line_when_the_inputs_are_built_and_compiles_without(tmp_path):
    """Flan-T5 has no task of its own: training names the knob; a compile needs none."""
    code, _, err = run_main_in_process(
        f"--job_log_dir={tmp_path / 'job'}", *TINY, exp="tasks.t5.flan_t5.FlanT5Small"
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "names no SeqIO task or mixture; set --set=MIXTURE_OR_TASK_NAME=NAME" in lines[0]
    code, out, err = run_main_in_process(
        "--mode=compile", *TINY, "--peak_tflops=1.0", exp="tasks.t5.flan_t5.FlanT5Small"
    )
    assert code == 0 and "Compiled tasks.t5.flan_t5.FlanT5Small" in out, err


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"LOSS_NORMALIZING_FACTOR": "NUM_TOTAL"}, "LOSS_NORMALIZING_FACTOR = 'NUM_TOTAL'"),
        ({"LOSS_NORMALIZING_FACTOR": -1.0}, "give a number > 0"),
        ({"TASK_FEATURE_LENGTHS": {"targets": 8}}, "TASK_FEATURE_LENGTHS"),
    ],
)
def test_t5x_knobs_are_checked(knobs, message):
    with pytest.raises(base_experiment.KnobError, match=message):
        base_experiment.with_overrides(t5_1_1.T5v11Small, knobs)()


def test_t5v11_registers_c4_span_corruption_without_reading_files():
    """T5v11's default data: the span-corruption task over prepared C4, registered with
    VOCAB_PATH (read only when the inputs are built), T5X's pretraining rows."""
    import seqio

    exp = base_experiment.with_overrides(t5_1_1.T5v11Small, {"VOCAB_PATH": "/nowhere/spm.model"})
    train, evaluation = exp().datasets()
    task = seqio.get_mixture_or_task("c4_v220_span_corruption")
    assert sorted(task.output_features) == ["inputs", "targets"]
    assert (train.mixture_name, train.split_name, train.encoder_decoder) == (
        "c4_v220_span_corruption",
        "train",
        True,
    )
    assert train.task_feature_lengths == {"inputs": 512, "targets": 114}
    assert train.feature_converter_pack and train.shuffle
    assert (evaluation.split_name, evaluation.eval_loop_num_batches) == ("validation", 20)
