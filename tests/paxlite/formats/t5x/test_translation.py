"""A T5X train call -> T5xGin's knobs: T5X's meanings, and refusals that name their line."""

import jax.numpy as jnp
import pytest

from paxlite.formats.t5x import gin_files, gin_run, translation
from paxlite.formats.t5x.api import partitioning

_RUN = """
from __gin__ import dynamic_registration
import __main__ as train_script
from t5x import adafactor
from t5x import partitioning
from t5x import trainer
from t5x import utils
include 't5x/examples/t5/t5_1_1/small.gin'
include 't5x/configs/runs/pretrain.gin'
MIXTURE_OR_TASK_NAME = 'some_task'
TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}
TRAIN_STEPS = 100
DROPOUT_RATE = 0.05
train_script.train.relative_steps = 30
"""


def _knobs(tmp_path, text, *bindings, latest_step=None):
    (tmp_path / "run.gin").write_text(text)
    run = gin_run.read_call(
        gin_run.TRAIN,
        ["run.gin"],
        [f'MODEL_DIR = "{tmp_path}/m"', *bindings],
        [str(tmp_path), str(gin_files.GIN_ROOT)],
    )
    return translation.knobs(run.call, run.sources, run.config_text, latest_step)


def test_a_pretraining_run_s_knobs(tmp_path):
    knobs = _knobs(tmp_path, _RUN, latest_step=40)
    assert knobs["NUM_TRAIN_STEPS"] == 70  # relative_steps: 30 past the latest checkpoint.
    assert (knobs["MODEL_DIMS"], knobs["NUM_HEADS"], knobs["HIDDEN_DIMS"]) == (512, 6, 1024)
    assert knobs["NUM_ENCODER_LAYERS"] == knobs["NUM_DECODER_LAYERS"] == 8
    assert knobs["MLP_ACTIVATIONS"] == ("gelu", "linear")
    assert knobs["FPROP_DTYPE"] is jnp.bfloat16 and knobs["DROPOUT_PROB"] == 0.05
    assert knobs["Z_LOSS_WEIGHT"] == 1e-4 and knobs["LOSS_NORMALIZING_FACTOR"] is None
    assert knobs["LR_FACTORS"] == "constant * rsqrt_decay" and knobs["LEARNING_RATE"] == 1.0
    assert knobs["LR_WARMUP_STEPS"] == 10000
    assert knobs["BATCH_SIZE"] == 128 and knobs["PACKED_INPUT"] is True
    assert knobs["USE_CACHED_TASKS"] is True  # pretrain.gin's USE_CACHED_TASKS.
    assert knobs["EVAL_SPLIT"] == "validation" and knobs["EVAL_DATA_SEED"] == 42
    assert knobs["CHECKPOINT_EVERY_N_STEPS"] == 1000
    assert knobs["CHECKPOINT_MAX_TO_KEEP"] is None  # keep = None: all.
    assert knobs["DECODE_VALIDATION"] is False
    assert "SEED" not in knobs  # random_seed None: the experiment's seed.
    assert "network.T5Config.emb_dim = 512" in knobs["T5X_CONFIG_GIN"]


def test_flags_override_the_files_and_microbatches_become_accumulation(tmp_path):
    knobs = _knobs(
        tmp_path,
        _RUN,
        "partitioning.PjitPartitioner.num_partitions = 4",
        "trainer.Trainer.num_microbatches = 2",
        "utils.create_learning_rate_scheduler.factors = 'constant * linear_warmup * cosine_decay'",
    )
    assert knobs["ICI_MESH_SHAPE"] == (1, -1, 4)
    assert knobs["GRAD_ACCUM_STEPS"] == 2
    assert knobs["LR_FACTORS"] == "constant * linear_warmup * cosine_decay"


def test_model_parallel_submesh_counts_its_devices_and_wins_as_in_t5x(tmp_path):
    submesh = "partitioning.PjitPartitioner.model_parallel_submesh = (1, 2, 1, 2)"
    knobs = _knobs(tmp_path, _RUN, "partitioning.PjitPartitioner.num_partitions = None", submesh)
    assert knobs["ICI_MESH_SHAPE"] == (1, -1, 4)
    knobs = _knobs(tmp_path, _RUN, "partitioning.PjitPartitioner.num_partitions = 2", submesh)
    assert knobs["ICI_MESH_SHAPE"] == (1, -1, 4)


def test_label_smoothing_is_kept(tmp_path):
    assert _knobs(tmp_path, _RUN, "LABEL_SMOOTHING = 0.1")["LABEL_SMOOTHING"] == 0.1


_FINETUNE = _RUN.replace("pretrain.gin", "finetune.gin").replace(
    "TRAIN_STEPS = 100", "TRAIN_STEPS = 100\nINITIAL_CHECKPOINT_PATH = '/c/checkpoint_0'"
)


def test_label_smoothing_with_an_inference_eval_that_scores_is_refused(tmp_path):
    """T5X's inference eval scores unsmoothed targets; paxlite's model scores what it trains,
    so smoothing is refused where the infer_eval task has score metrics, and only there."""
    from tests.paxlite.t5x.user_dirs import registered_task_without_data

    def mean_score(targets, scores):
        return {"mean_score": sum(scores) / len(scores)}

    with registered_task_without_data("some_scored_task", [mean_score]) as name:
        scored = (_FINETUNE.replace("some_task", name),)
        assert _knobs(tmp_path, *scored)["DECODE_FEATURE_LENGTHS"] is None  # The longest.
        with pytest.raises(translation.UnsupportedBinding, match="label_smoothing.*some_scored"):
            _knobs(tmp_path, *scored, "LABEL_SMOOTHING = 0.1")
        knobs = _knobs(tmp_path, _FINETUNE, "LABEL_SMOOTHING = 0.1")  # Unregistered: unchecked.
        assert knobs["LABEL_SMOOTHING"] == 0.1 and knobs["DECODE_VALIDATION"]


def test_standard_rules_in_paxlite_s_axis_names():
    rules = translation.paxlite_rules(partitioning.standard_logical_axis_rules())
    assert ("batch", ("replica", "data")) in rules
    assert ("vocab", "mdl") in rules and ("mlp", "mdl") in rules
    assert ("heads", "mdl") in rules and ("kv_heads", "mdl") in rules
    assert ("embed", None) in rules and ("activation_embed", None) in rules
    assert ("head_dim", None) in rules
    two_d = translation.paxlite_rules(partitioning.standard_logical_axis_rules(1, 2))
    assert ("embed", "data") in two_d


@pytest.mark.parametrize(
    "binding, named",
    [
        ("adafactor.Adafactor.weight_decay_rate = 0.1", "Adafactor.weight_decay_rate = 0.1"),
        ("adafactor.Adafactor.step_offset = 5", "Adafactor.step_offset = 5"),
        ("utils.SaveCheckpointConfig.dtype = 'bfloat16'", "SaveCheckpointConfig.dtype"),
        ("train/utils.DatasetConfig.use_custom_packing_ops = True", "train/DatasetConfig"),
        ("partitioning.PjitPartitioner.additional_rules = 1", "additional_rules"),
    ],
)
def test_what_paxlite_does_not_implement_is_refused_with_its_line(tmp_path, binding, named):
    with pytest.raises((translation.UnsupportedBinding, gin_run.GinRunError)) as raised:
        _knobs(tmp_path, _RUN + binding + "\n")
    assert named in str(raised.value)
    if isinstance(raised.value, translation.UnsupportedBinding):
        assert f"run.gin:{_RUN.count(chr(10)) + 1}" in str(raised.value)


def test_a_custom_logical_axis_rule_is_refused(tmp_path):
    text = (
        _RUN + "partitioning.standard_logical_axis_rules.additional_rules = [('expert', 'model')]\n"
    )
    with pytest.raises(translation.UnsupportedBinding, match="expert"):
        _knobs(tmp_path, text)


def test_knob_text_reads_back():
    assert translation.knob_text(jnp.bfloat16) == "bfloat16"
    assert translation.knob_text((1, -1, 2)) == "(1, -1, 2)"


def test_every_adafactor_field_t5x_runs_set_becomes_a_knob(tmp_path):
    knobs = _knobs(
        tmp_path,
        _RUN,
        "adafactor.Adafactor.beta1 = 0.9",
        "adafactor.Adafactor.factored = False",
        "adafactor.Adafactor.multiply_by_parameter_scale = False",
        "adafactor.Adafactor.min_dim_size_to_factor = 32",
        "adafactor.Adafactor.epsilon1 = 1e-20",
        "adafactor.Adafactor.epsilon2 = 1e-4",
        "adafactor.Adafactor.global_norm_clip_threshold = 2.0",
    )
    assert knobs["ADAFACTOR_BETA1"] == 0.9 and knobs["ADAFACTOR_FACTORED"] is False
    assert knobs["ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE"] is False
    assert knobs["ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR"] == 32
    assert (knobs["ADAFACTOR_EPSILON1"], knobs["ADAFACTOR_EPSILON2"]) == (1e-20, 1e-4)
    assert knobs["ADAFACTOR_GLOBAL_NORM_CLIP"] == 2.0
    assert "OPTAX_CHAIN" not in knobs
    assert knobs["T5X_CHECKPOINTS"] is False  # T5X's format has no slot for momentum's state.


def test_t5x_s_adamw_example_becomes_an_optax_chain(tmp_path):
    knobs = _knobs(
        tmp_path, "include 't5x/examples/t5/t5_1_1/examples/base_wmt_from_scratch_adamw.gin'\n"
    )
    clip, adamw = knobs["OPTAX_CHAIN"]
    assert clip == {"name": "clip", "max_delta": 1.0}
    assert adamw == {
        "name": "adamw",
        "learning_rate": {
            "name": "warmup_cosine_decay_schedule",
            "init_value": 0.0,
            "peak_value": 1e-4,
            "warmup_steps": 1000,
            "decay_steps": 50000,
            "end_value": 0.0,
        },
    }
    assert translation.knob_text(knobs["OPTAX_CHAIN"]).startswith("({'name': 'clip'")


def test_an_optax_argument_that_does_not_exist_is_refused(tmp_path):
    text = (
        "include 't5x/examples/t5/t5_1_1/examples/base_wmt_from_scratch_adamw.gin'\n"
        "optax.adamw.weight_dacay = 0.1\n"
    )
    with pytest.raises(gin_run.GinRunError, match="weight_dacay"):
        _knobs(tmp_path, text)


def test_the_eval_datasets_keep_their_packing_and_refuse_another_order(tmp_path):
    knobs = _knobs(tmp_path, _RUN, "train_eval/utils.DatasetConfig.pack = False")
    assert (knobs["PACKED_INPUT"], knobs["EVAL_PACKED"]) == (True, False)
    with pytest.raises(translation.UnsupportedBinding, match="train_eval/DatasetConfig.shuffle"):
        _knobs(tmp_path, _RUN, "train_eval/utils.DatasetConfig.shuffle = True")
    with pytest.raises(translation.UnsupportedBinding, match="task_feature_lengths"):
        _knobs(
            tmp_path, _RUN, "train_eval/utils.DatasetConfig.task_feature_lengths = {'inputs': 4}"
        )


_DECODING = "from t5x import decoding\nfrom t5x import models\n"


def test_decoding_settings(tmp_path):
    sampled = _knobs(
        tmp_path,
        _RUN + _DECODING + "models.EncoderDecoderModel.decode_fn = @decoding.temperature_sample\n",
        "decoding.temperature_sample.temperature = 0.7",
        "decoding.temperature_sample.topk = 0",
        "decoding.temperature_sample.topp = 0.9",
    )
    assert sampled["SAMPLED_DECODING"] is True
    assert (sampled["SAMPLE_TEMPERATURE"], sampled["SAMPLE_TOP_K"], sampled["SAMPLE_TOP_P"]) == (
        0.7,
        0,
        0.9,
    )
    beams = _knobs(
        tmp_path,
        _RUN + _DECODING + "models.EncoderDecoderModel.decode_fn = @decoding.beam_search\n",
        "decoding.beam_search.alpha = 0.8",
        "models.EncoderDecoderModel.predict_batch_with_aux.num_decodes = 3",
    )
    assert (beams["SAMPLED_DECODING"], beams["BEAM_ALPHA"], beams["NUM_DECODES"]) == (False, 0.8, 3)
    bound = _RUN + _DECODING + "models.EncoderDecoderModel.decode_fn = @decoding.beam_search\n"
    with pytest.raises(translation.UnsupportedBinding, match="beam_search.max_decode_len = 5"):
        _knobs(tmp_path, bound, "decoding.beam_search.max_decode_len = 5")
    with pytest.raises(translation.UnsupportedBinding, match="T5X would not use it either"):
        _knobs(tmp_path, _RUN + _DECODING, "decoding.beam_search.alpha = 0.9")
    with pytest.raises(gin_run.GinRunError, match="alphaa"):
        _knobs(tmp_path, _RUN + _DECODING, "decoding.beam_search.alphaa = 0.9")


def test_a_binding_nothing_reads_is_refused_with_its_line(tmp_path):
    with pytest.raises(translation.UnsupportedBinding, match="Trainer.summary_dir") as raised:
        _knobs(tmp_path, _RUN + "trainer.Trainer.summary_dir = '/x'\n")
    assert f"run.gin:{_RUN.count(chr(10)) + 1}" in str(raised.value)


def test_relative_steps_count_from_the_restored_checkpoint(tmp_path):
    text = _RUN + "utils.RestoreCheckpointConfig.path = '/ckpts/checkpoint_1000'\n"
    assert _knobs(tmp_path, text)["NUM_TRAIN_STEPS"] == 1030
    assert _knobs(tmp_path, text, latest_step=1010)["NUM_TRAIN_STEPS"] == 1040
    no_relative = _knobs(tmp_path, text, "train_script.train.relative_steps = 0")
    assert no_relative["NUM_TRAIN_STEPS"] == 100  # T5X: 0 is no relative count.


@pytest.mark.parametrize(
    "binding, named",
    [
        ("LOSS_NORMALIZING_FACTOR = 'AVERAGE_PER_SEQUENCE'", "loss_normalizing_factor"),
        ("utils.create_learning_rate_scheduler.factors = 'constant * warmup'", "unknown factor"),
        ("utils.create_learning_rate_scheduler.warmup_steps = 0", "warmup_steps must be >= 1"),
        ("TASK_FEATURE_LENGTHS = 512", "not of the type T5X takes"),
    ],
)
def test_values_t5x_would_refuse_are_refused_here(tmp_path, binding, named):
    with pytest.raises(translation.UnsupportedBinding, match=named):
        _knobs(tmp_path, _RUN + binding + "\n")


def test_a_warmup_no_factor_uses_and_no_checkpoint_period(tmp_path):
    knobs = _knobs(
        tmp_path,
        _RUN,
        "utils.create_learning_rate_scheduler.factors = 'constant'",
        "utils.create_learning_rate_scheduler.warmup_steps = 0",
        "utils.SaveCheckpointConfig.period = None",
    )
    assert knobs["LR_WARMUP_STEPS"] == 1
    assert knobs["CHECKPOINT_EVERY_N_STEPS"] == knobs["NUM_TRAIN_STEPS"] == 30


def test_t5x_s_model_dir_loop_and_periods(tmp_path):
    """pretrain.gin: eval every 1000, checkpoints every 1000, stats_period unset (T5X: its
    "epoch", the shortest period); periods from the start step; T5X's checkpoints, its
    rules for model-info; save_dataset False: the data restarts; its start saved first."""
    knobs = _knobs(tmp_path, _RUN, latest_step=40)
    assert knobs["SUMMARY_INTERVAL_STEPS"] == 1000 and knobs["PERIODS_FROM_STEP"] == 40
    assert knobs["T5X_CHECKPOINTS"] is True and knobs["USE_REPEATED_LAYER"] is False
    assert knobs["T5X_AXIS_RULES"] == tuple(partitioning.standard_logical_axis_rules())
    assert knobs["RESUME_INPUT"] is False and knobs["SAVE_AT_START"] is True
    knobs = _knobs(
        tmp_path,
        _RUN,
        "train_script.train.stats_period = 10",
        "utils.SaveCheckpointConfig.save_dataset = True",
        "utils.SaveCheckpointConfig.period = None",
    )
    assert knobs["SUMMARY_INTERVAL_STEPS"] == 10 and knobs["PERIODS_FROM_STEP"] == 0
    assert knobs["RESUME_INPUT"] is True and knobs["SAVE_AT_START"] is False
