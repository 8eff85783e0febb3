"""All 55 experiments paxml 1.4 registers in c4.py, c4_multislice.py and lm_cloud.py, and the
Pax knobs their classes set: each name (both of Pax's paths) builds its config here.

The list below was read from paxml 1.4.0's sources (``@experiment_registry.register`` in
``paxml/tasks/lm/params/{c4,c4_multislice,lm_cloud}.py``); it is data, not derived from
this repository.
"""

import pytest

from paxlite.experiments import registry
from paxlite.experiments.base_experiment import KnobError, with_overrides
from praxis_lite import config as config_lib

PAX_CATALOGUE = {
    "c4": (
        "LmCloudSpmdAdam LmCloudSpmdAdamLimitSteps C4SpmdAdam "
        "C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas C4SpmdPipelineAdam "
        "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas "
        "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas "
        "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas "
        "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas "
        "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas "
        "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas C4Spmd1BAdam4Replicas "
        "C4Spmd1BAdam4ReplicasLimitSteps C4Spmd2BAdam4Replicas C4Spmd16BAdam32Replicas "
        "C4Spmd32BAdam64Replicas C4SpmdGpt3L16AdamOrgHP C4SpmdPipelineGpt3SmallAdam8Replicas"
    ).split(),
    "lm_cloud": (
        "LargeMlp SmallMlp LmCloudTransformerAdam LmCloudTransformerAdamTest "
        "LmCloudTransformerAdamLimitSteps LmCloudSpmdTest LmCloudSpmd2B LmCloudSpmd2BLimitSteps "
        "LmCloudSpmd32B LmCloudSpmd64B LmCloudSpmd128B LmCloudSpmd256B LmCloudSpmd512B "
        "LmCloudSpmd1024B LmCloudSpmdPipeline9B LmCloudSpmdPipeline175B LmCloudSpmdMultislice2B "
        "LmCloudSpmdPipelineMultislice2B LmCloudSpmdPipelineMultislice2BCircular"
    ).split(),
    "c4_multislice": (
        "C4Spmd22BAdamMaxText C4Spmd22BAdam1xv4_128 C4Spmd22BAdam2xv4_128 "
        "C4Spmd22BAdam4xv4_128 C4Spmd22BAdam1xv4_128LimitSteps C4Spmd22BAdam2xv4_128LimitSteps "
        "C4Spmd22BAdam4xv4_128LimitSteps C4Spmd22BAdam1xv4_384 C4Spmd22BAdam2xv4_384 "
        "C4Spmd22BAdam1xv4_8 C4Spmd22BAdam2xv4_8 C4Spmd22BAdam4xv4_8 "
        "C4Spmd22BAdam1xv4_8LimitSteps C4Spmd22BAdam2xv4_8LimitSteps "
        "C4Spmd22BAdam4xv4_8LimitSteps C4SpmdGpt3AdamDataParallel2x16x16 "
        "C4Spmd32BAdam1xv5_256 C4Spmd32BAdam2xv5_256"
    ).split(),
}
_NAMES = [(module, name) for module, names in PAX_CATALOGUE.items() for name in names]


def test_the_catalogue_is_paxs_55():
    assert {m: len(n) for m, n in PAX_CATALOGUE.items()} == {
        "c4": 18,
        "lm_cloud": 19,
        "c4_multislice": 18,
    }


@pytest.mark.parametrize("module, name", _NAMES, ids=[n for _, n in _NAMES])
def test_each_pax_name_builds_its_config_under_both_paths(module, name):
    ours = registry.get(f"tasks.lm.{module}.{name}")
    assert registry.get(f"tasks.lm.params.{module}.{name}") is ours
    assert ours.__name__ == name and ours.__module__ == f"tasks.lm.{module}"
    experiment = ours()
    experiment.validate()
    task = config_lib.instantiate(experiment.task())
    assert task.num_train_steps > 0
    assert experiment.datasets()


def _optimizer(cls):
    return config_lib.instantiate(cls().task()).learner.optimizer


@pytest.mark.parametrize(
    "name, global_batch, peak, warmup, decay_end",
    [  # Pax's set_adam_and_learning_rate_schedule, computed by hand for each batch.
        ("C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas", 1536, 2e-5, 265, 108_600),
        ("C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas", 2048, 2e-5, 199, 81_450),
        ("C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas", 3072, 2e-5, 133, 54_300),
        ("C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas", 4096, 3e-5, 100, 40_725),
        ("C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas", 8192, 3e-5, 50, 20_363),
    ],
)
def test_mlperf_runs_derive_lr_and_schedule_from_the_global_batch(
    name, global_batch, peak, warmup, decay_end
):
    """LEARNING_RATE and LR_COS_* None mean Pax's GPT-3 rule scaled to the global batch."""
    cls = registry.get(f"tasks.lm.c4.{name}")
    opt = _optimizer(cls)
    schedule = opt.lr_schedule
    assert opt.learning_rate == peak
    assert (schedule.warmup_steps, schedule.decay_start, schedule.decay_end) == (
        warmup,
        warmup + 1,
        decay_end,
    )
    assert opt.clip_threshold < 0 and opt.clip_gradient_norm_to_value == 1.0  # GPT-3: no capping
    assert opt.weight_decay == 0.1 and opt.beta2 == 0.95 and opt.epsilon == 1e-8
    # The batch the rule saw: PERCORE_BATCH_SIZE x the mesh's devices.
    import math

    exp = cls()
    devices = math.prod(exp.ICI_MESH_SHAPE) * math.prod(exp.DCN_MESH_SHAPE or (1,))
    assert exp.global_batch_size(devices) == global_batch


def test_paxs_adam_knobs_reach_the_optimizer():
    from tasks.lm import c4

    cls = with_overrides(
        c4.C4Spmd1BAdam4Replicas, {"ADAM_EPSILON_ROOT": 1e-9, "ADAM_CLIP_THRESHOLD": 2.0}
    )
    opt = _optimizer(cls)
    assert (opt.epsilon_root, opt.clip_threshold) == (1e-9, 2.0)
    assert _optimizer(c4.C4Spmd1BAdam4Replicas).clip_threshold == 1.0  # Pax's default capping


def test_model_knobs_change_the_parameter_tree():
    """SEPARATE_EMBEDDING adds an input table and an output projection; TRAINABLE_POSITION_EMB
    adds a table of TRAINABLE_PE_MAX_SEQ_LEN rows; EMBEDDING_LOOKUP_STYLE reaches the table."""
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    from tasks.lm import lm_cloud

    def params_of(overrides):
        cls = with_overrides(lm_cloud.LmCloudSpmdTest, overrides)
        model = config_lib.instantiate(cls().task().model)
        ids = jnp.zeros((1, 8), jnp.int32)
        batch = dict(ids=ids, labels=ids, weights=jnp.ones((1, 8)), paddings=jnp.zeros((1, 8)))
        shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
        return nn.unbox(shapes["params"])

    plain = params_of({})
    separate = params_of(
        {"SEPARATE_EMBEDDING": True, "TRAINABLE_POSITION_EMB": True, "TRAINABLE_PE_MAX_SEQ_LEN": 40}
    )
    flat = lambda tree: {  # noqa: E731
        "/".join(str(getattr(k, "key", k)) for k in path): leaf.shape
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    plain_names, separate_names = set(flat(plain)), set(flat(separate))
    added = separate_names - plain_names
    assert any("embedding" in n for n in added), added
    assert (40, 64) in [flat(separate)[n] for n in added], {n: flat(separate)[n] for n in added}
    cfg = with_overrides(lm_cloud.LmCloudSpmdTest, {"EMBEDDING_LOOKUP_STYLE": "index"})().model()
    assert cfg.lm_tpl.softmax_tpl.lookup_style == "index"
    # Pax's sharding annotations (set_sharding_params_v1) make every meshed LM's shared-softmax
    # lookup 'matmul'; its pmap LM keeps praxis's 'index'.
    assert lm_cloud.LmCloudSpmd32B().model().lm_tpl.softmax_tpl.lookup_style == "matmul"
    assert lm_cloud.LmCloudTransformerAdam().model().lm_tpl.softmax_tpl.lookup_style == "index"


@pytest.mark.parametrize(
    "knob, value, message",
    [
        ("USE_FP8", True, "fp8 matmuls are not supported"),
        ("RELATIVE_BIAS", True, "encoder-decoder models"),
        ("NORM_POLICY", "post", "only 'pre'"),
    ],
)
def test_unsupported_pax_knobs_are_refused_with_the_reason(knob, value, message):
    from tasks.lm import lm_cloud

    with pytest.raises(KnobError, match=message) as e:
        with_overrides(lm_cloud.LmCloudSpmd2B, {knob: value})().validate()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "knob, value, message",
    [
        ("MLP_WEIGHT_SHARDING", ("data", -1), "per-weight mesh mappings"),
        ("TRAINING_OPTIMIZED_SHARDING", False, "for training only"),
    ],
)
def test_mlp_sharding_knobs_other_than_paxs_are_refused(knob, value, message):
    from tasks.lm import lm_cloud

    with pytest.raises(KnobError, match=message):
        with_overrides(lm_cloud.SmallMlp, {knob: value})().validate()


def test_mesh_shape_is_the_mlp_familys_mesh_and_an_override_wins():
    from tasks.lm import lm_cloud

    assert lm_cloud.SmallMlp.ICI_MESH_SHAPE == (8, 1, 1)
    moved = with_overrides(lm_cloud.SmallMlp, {"ICI_MESH_SHAPE": (1, 8, 1)})
    assert moved.ICI_MESH_SHAPE == (1, 8, 1)
    assert with_overrides(lm_cloud.SmallMlp, {"MESH_SHAPE": (2, 4, 1)}).ICI_MESH_SHAPE == (2, 4, 1)


def test_pmap_experiments_are_data_parallel_over_every_device():
    """ICI_MESH_SHAPE (1, -1, 1): the 'data' axis takes all 8 devices of this process."""
    from paxlite.runtime import mesh_checks
    from tasks.lm import lm_cloud

    exp = lm_cloud.LmCloudTransformerAdamTest()
    plan = mesh_checks.MeshPlan.of(exp)
    assert plan.sizes == {"replica": 1, "data": 8, "mdl": 1}
    assert exp.global_batch_size(plan.num_devices) == 128
    assert plan.ways("batch") == 8 and plan.ways("embed") == 1  # whole replicas


def test_emb_w_data_dims_splits_the_embedding_table_as_pax_does():
    """EMB_W_DATA_DIMS=('replica', 'data') puts the table's model dim on both axes; without it
    the table follows the 'embed' rule like every other weight."""
    from paxlite.runtime import mesh_checks
    from praxis_lite.sharding import TABLE_EMBED
    from tasks.lm import lm_cloud

    pax = lm_cloud.LmCloudSpmdPipelineMultislice2B
    assert pax.EMB_W_DATA_DIMS is None  # Pax sets it on its pipelined C4 base only.
    split = with_overrides(pax, {"EMB_W_DATA_DIMS": ("replica", "data")})()
    assert mesh_checks.MeshPlan.of(split).axes_of(TABLE_EMBED) == ("replica",)  # data is 1 wide
    assert mesh_checks.MeshPlan.of(pax()).axes_of(TABLE_EMBED) == ()


def test_c4_input_knobs_reach_the_inputs():
    from tasks.lm import c4

    cls = with_overrides(
        c4.C4Spmd1BAdam4Replicas,
        {
            "TRAINING_NUM_BATCHES_TO_SKIP": 7,
            "PERCORE_EVAL_BATCH_SIZE": 0.5,
            "TRAINING_SEED": 5,
            "TRAIN_MIXTURE": "c4_knobs_train",
            "EVAL_MIXTURE": "c4_knobs_train",  # Any registered task or mixture.
            "VOCAB_PATH": "/nowhere/spm.model",
        },
    )
    train, evaluation = cls().datasets()
    assert train.mixture_name == evaluation.mixture_name == "c4_knobs_train"
    assert (train.split_name, evaluation.split_name) == ("train", "validation")
    assert (train.num_batches_to_skip, train.seed) == (7, 5)
    assert evaluation.num_batches_to_skip == 0
    # This process has 8 devices: 0.5 x 8 eval examples; training keeps 32 x 8.
    assert (train.batch_size, evaluation.batch_size) == (256, 4)


def test_the_old_task_name_knob_names_paxs():
    from tasks.lm import c4

    with pytest.raises(KnobError, match="TRAIN_MIXTURE"):
        with_overrides(c4.C4Spmd1BAdam4Replicas, {"C4_TASK_NAME": "x"})
