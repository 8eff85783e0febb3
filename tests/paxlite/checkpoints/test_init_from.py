"""Starting a run from another checkpoint: --init_from, Pax's loading rules, sharded reads.

Oracles: the logits praxis computed from each paxml-written fixture (tests/fixtures/pax), the
arrays of a paxlite job as saved (bit-equal after rename and skip rules), a fresh run's
initialisation for what the rules leave alone, and a one-device read for the sharded one.
"""

import dataclasses
import math
import pathlib
import shutil

import jax
import numpy as np
import pytest
import tensorstore as ts
from flax import traverse_util

from paxlite.checkpoints import checkpoint_sources, init_from, train_checkpoints
from paxlite.experiments.base_experiment import with_overrides
from paxlite.experiments.tasks_lib import LOAD_ALL, CheckpointLoadingRules
from paxlite.runtime.job import build_job
from paxlite.train import train_loop, train_setup
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import BaseInput
from praxis_lite.py_utils import NestedMap
from tasks.lm.synthetic import LmSyntheticTiny
from tests import FIXTURES
from tests.paxlite.formats.pax.test_checkpoint import OURS, TINY
from tests.paxlite.test_main import main_in_process, run_main_in_process

_PAX = FIXTURES / "pax"


@dataclasses.dataclass
class FixtureBatches(BaseInput):
    """Yields one fixture's batch (its ids; labels the next token) every step."""

    path: str = ""

    def get_next(self) -> NestedMap:
        ids = np.load(self.path)["ids"]
        return NestedMap(
            ids=ids,
            labels=np.roll(ids, -1, axis=1),
            weights=np.ones(ids.shape, np.float32),
            paddings=np.zeros(ids.shape, np.float32),
        )

    def reset(self) -> None:
        pass

    def get_state(self) -> dict:
        return {}

    def set_state(self, state: dict) -> None:
        pass


def _pax_experiment(name: str, **knobs):
    base, own = OURS[name]
    fixture = str(_PAX / name / "logits.npz")
    knobs = {**TINY, **own, "PERCORE_BATCH_SIZE": 2, "SUMMARY_INTERVAL_STEPS": 1, **knobs}

    class FromPax(with_overrides(base, knobs)):
        def datasets(self):
            return [config_lib.Config(FixtureBatches, batch_size=2, path=fixture)]

    return FromPax()


def _job(experiment, job_dir):
    """The experiment's job on the first devices its mesh needs."""
    devices = jax.devices()[: math.prod(experiment.ICI_MESH_SHAPE)]
    return build_job(experiment, experiment.task(), experiment.datasets(), job_dir, devices)


def _fixture_loss(name: str) -> float:
    """Mean next-token cross-entropy of praxis's logits on the fixture batch (numpy)."""
    fixture = np.load(_PAX / name / "logits.npz")
    logits, labels = fixture["logits"].astype(np.float64), np.roll(fixture["ids"], -1, axis=1)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-np.take_along_axis(log_probs, labels[..., None], -1).mean())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OURS))
def test_fine_tuning_from_a_pax_checkpoint_starts_at_praxiss_loss(name, tmp_path):
    step_dir = _PAX / name / "checkpoints" / "checkpoint_00000003"
    experiment = _pax_experiment(name, INIT_FROM=str(step_dir), NUM_TRAIN_STEPS=2)
    result = train_loop.run(_job(experiment, tmp_path / "job"), peak_tflops=1.0)  # (No MFU.)
    losses = [scalars["loss"] for _, scalars in result.history]
    assert len(losses) == 2 and np.isfinite(losses).all()  # (the LR warms up from 0)
    np.testing.assert_allclose(losses[0], _fixture_loss(name), rtol=1e-5)


def _tiny(**knobs):
    small = dict(NUM_LAYERS=2, USE_REPEATED_LAYER=False, PERCORE_BATCH_SIZE=1, **knobs)
    return with_overrides(LmSyntheticTiny, small)


@pytest.fixture(scope="module")
def source_job(tmp_path_factory):
    """A paxlite job of 2 unscanned layers trained 3 steps (parameters and Adam state)."""
    job_dir = tmp_path_factory.mktemp("source")
    exp = _tiny(NUM_TRAIN_STEPS=3, CHECKPOINT_EVERY_N_STEPS=3, EVAL_INTERVAL_STEPS=0)()
    train_loop.run(_job(exp, job_dir), peak_tflops=1.0)  # (No MFU calibration.)
    return job_dir


@pytest.fixture(scope="module")
def saved(source_job) -> dict:
    """The source job's parameters as its checkpoint holds them (read once; tests only read)."""
    return _saved(source_job)


def _saved(job_dir: pathlib.Path) -> dict:
    source = checkpoint_sources.open_source(job_dir)
    flat = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in source.variables().items()}
    read = source._restore(
        {
            "params": traverse_util.unflatten_dict(
                {k[len("params/") :]: v for k, v in flat.items()}, sep="/"
            )
        }
    )
    source.close()
    return {
        f"params/{k}": np.asarray(v)
        for k, v in traverse_util.flatten_dict(read["params"], sep="/").items()
    }


@pytest.fixture(scope="module")
def source_resumed(source_job) -> train_setup.RunState:
    """The starting state of the source job resuming itself (its step-3 checkpoint)."""
    return _start(_tiny(), source_job)


def _start(experiment_cls, job_dir) -> train_setup.RunState:
    """The run's starting state (its own newest checkpoint, else fresh plus the rules)."""
    job = _job(experiment_cls(), job_dir)
    checkpointer = train_checkpoints.Checkpointer(job_dir, max_to_keep=3)
    try:
        with job.scope():
            source = train_setup.StateSource.LATEST_OR_FRESH
            return train_setup.init_or_restore(job, source, checkpointer)
    finally:
        checkpointer.close()


def _slots(state) -> dict:
    """The optimizer state's leaves by path (``.../mu/lm/transformer/x_layers_0/...``)."""
    leaves = jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
    return {train_checkpoints.path_name(path): np.asarray(leaf) for path, leaf in leaves}


def _flat(state) -> dict:
    return {
        f"params/{k}": np.asarray(v)
        for k, v in traverse_util.flatten_dict(state.params, sep="/").items()
    }


class _Renamed(_tiny()):
    """Layer 1 starts as the source's layer 0; the softmax is left fresh."""

    SOURCE: str = ""

    def task(self):
        task = super().task()
        task.train.init_from_checkpoint_rules = {
            self.SOURCE: CheckpointLoadingRules(
                task_p=None,
                load_rules=[
                    (
                        r"params/lm/transformer/x_layers_1/(.*)",
                        "params/lm/transformer/x_layers_0/{}",
                    ),
                    LOAD_ALL,
                ],
                ignore_rules=[r"params/lm/softmax/.*"],
                partial_load_opt_states=True,
            )
        }
        return task


@pytest.mark.slow
def test_rules_rename_and_skip_exactly_what_they_say(
    source_job, saved, source_resumed, tmp_path, capsys
):
    got = _start(with_overrides(_Renamed, {"SOURCE": str(source_job)}), tmp_path / "run")
    fresh = _start(_tiny(), tmp_path / "fresh")
    params, fresh_params = _flat(got.state), _flat(fresh.state)
    layer0, layer1 = "params/lm/transformer/x_layers_0/", "params/lm/transformer/x_layers_1/"
    checked = 0
    for name, value in params.items():
        if name.startswith("params/lm/softmax/"):
            np.testing.assert_array_equal(value, fresh_params[name])
            assert not np.array_equal(value, saved[name])
        elif name.startswith(layer1):
            np.testing.assert_array_equal(value, saved[layer0 + name[len(layer1) :]])
        else:
            np.testing.assert_array_equal(value, saved[name])
        checked += 1
    assert checked == len(saved) and int(got.state.step) == 0
    out = capsys.readouterr().out
    assert "Freshly initialised (no rule loads them): params/lm/softmax/" in out
    # partial_load_opt_states: each loaded variable's slots came with it (renamed too).
    slots, fresh_slots = _slots(got.state), _slots(fresh.state)
    source_slots = _slots(source_resumed.state)  # The source job resuming itself.
    moved = 0
    for path, value in slots.items():
        if "/lm/softmax/" in path or not path.count("/lm/"):
            np.testing.assert_array_equal(value, fresh_slots[path])
        else:
            was = path.replace("x_layers_1/", "x_layers_0/")
            np.testing.assert_array_equal(value, source_slots[was])
            moved += bool(np.abs(source_slots[was]).max() > 0)
    assert moved > len(slots) // 3


@pytest.mark.slow
def test_optimizer_state_and_step_load_whole_from_a_paxlite_job(
    source_job, source_resumed, tmp_path
):
    class Whole(_tiny(INIT_FROM=None)):
        def task(self):
            task = super().task()
            rules = CheckpointLoadingRules(load_opt_states=True, load_step=True)
            task.train.init_from_checkpoint_rules = {str(source_job): rules}
            return task

    got = _start(Whole, tmp_path / "run")
    assert int(got.state.step) == int(source_resumed.state.step) == 3
    for a, b in zip(
        jax.tree_util.tree_leaves(got.state.opt_state),
        jax.tree_util.tree_leaves(source_resumed.state.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_rules_that_do_not_fit_are_one_error_listing_each_and_nothing_is_written(
    source_job, tmp_path
):
    job = tmp_path / "job"
    code, stderr = main_in_process(
        f"--job_log_dir={job}",
        f"--init_from={source_job}",
        "--set=MODEL_DIMS=32",
        "--set=ICI_MESH_SHAPE=1,8,1",
        "--set=USE_REPEATED_LAYER=False",
        "--set=NUM_TRAIN_STEPS=2",
        "--peak_tflops=1",  # (No MFU calibration before the rules are read.)
    )
    assert code == 2, stderr[-2000:]
    first, *listed = stderr.splitlines()
    assert first.startswith("paxlite: error: the checkpoint loading rules do not fit")
    assert listed and all(line.startswith("  ") for line in listed[:-1])
    assert any("params/lm/softmax/emb_var <- params/lm/softmax/emb_var: shape" in x for x in listed)
    assert not (job / "checkpoints").exists() or not any((job / "checkpoints").iterdir())
    assert not (job / "config.txt").exists()


@pytest.mark.slow
def test_a_rule_matching_nothing_and_a_missing_name_are_listed(source_job):
    exp = _tiny()()
    job = _job(exp, source_job.parent / "unused")
    with job.scope():
        fresh = train_setup.init_or_restore(job, train_setup.StateSource.FRESH)
    rules = CheckpointLoadingRules(load_rules=[("params/decoder/(.*)", "{}"), ("(.*)", "{}_v2")])
    with pytest.raises(init_from.InitFromError) as e:
        init_from.initialise(fresh.state, {str(source_job): rules}, {str(source_job): (1, 1)})
    text = str(e.value)
    assert "load rule ('params/decoder/(.*)', '{}') of" in text and "matches no variable" in text
    assert "params/lm/final_ln/scale <- params/lm/final_ln/scale_v2: no such array" in text


@pytest.mark.slow
def test_once_a_job_has_its_own_checkpoint_init_from_is_not_read(
    source_job, saved, tmp_path, capsys
):
    job = tmp_path / "job"
    shutil.copytree(source_job / "checkpoints", job / "checkpoints")  # As if it had saved.
    elsewhere = _PAX / "TinyLmCloudSpmd" / "checkpoints" / "checkpoint_00000003"  # Not this model.
    got = _start(_tiny(INIT_FROM=str(elsewhere)), job)
    out = capsys.readouterr().out
    assert int(got.state.step) == 3 and "Restored checkpoint at step 3" in out
    assert out.count(f"Not reading {elsewhere}") == 1 and "Initialised" not in out
    for name, value in _flat(got.state).items():
        np.testing.assert_array_equal(value, saved[name])


def test_a_bfloat16_checkpoint_is_cast_to_the_runs_float32(tmp_path):
    """The LmCloudSpmd fixture rewritten as bfloat16 zarr arrays loads as their float32 values."""
    name = "TinyLmCloudSpmd"
    source = _PAX / name / "checkpoints" / "checkpoint_00000003" / "state"
    state = tmp_path / "checkpoint_00000003" / "state"
    for array_dir in source.glob("mdl_vars.params.*"):
        values = (
            ts.open({"driver": "zarr", "kvstore": f"file://{array_dir}"}).result().read().result()
        )
        out = ts.open(
            {"driver": "zarr", "kvstore": f"file://{state / array_dir.name}"},
            create=True,
            dtype=ts.bfloat16,
            shape=values.shape,
        ).result()
        out.write(values.astype(ts.bfloat16.numpy_dtype)).result()
    exp = _pax_experiment(name, NUM_TRAIN_STEPS=1)
    job = _job(exp, tmp_path / "job")
    with job.scope():
        fresh = train_setup.init_or_restore(job, train_setup.StateSource.FRESH)
        rules = {str(state.parent): CheckpointLoadingRules()}
        as_bf16 = init_from.initialise(fresh.state, rules, {str(state.parent): (1, 1)})
        rules = {str(source.parent): CheckpointLoadingRules()}
        as_f32 = init_from.initialise(fresh.state, rules, {str(source.parent): (1, 1)})
    rounded = 0
    for name, got in _flat(as_bf16).items():
        want = _flat(as_f32)[name]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-6)  # bfloat16's 8 bits
        rounded += not np.array_equal(got, want)
    assert rounded > 10


@pytest.mark.slow
def test_each_device_reads_only_its_slice_of_a_pax_checkpoint(tmp_path):
    """8 devices, FSDP ('embed' over 'data') and tensor ('mdl') rules: the bytes each read asks
    for are one device slice, together exactly each array once; values as on one device."""
    name = "TinyLmCloudSpmd"
    rules = (
        ("batch", "replica"),  # the fixture batch of 2 stays whole
        ("embed", "data"),
        ("mlp", "mdl"),
        ("heads", "mdl"),
        ("vocab", "mdl"),
    )
    from praxis_lite.sharding import DEFAULT_RULES

    rules = tuple(r for r in DEFAULT_RULES if r[0] not in dict(rules)) + rules
    exp = _pax_experiment(
        name, ICI_MESH_SHAPE=(1, 4, 2), LOGICAL_AXIS_RULES=rules, PERCORE_BATCH_SIZE=0.25
    )
    step_dir = str(_PAX / name / "checkpoints" / "checkpoint_00000003")
    reads: list[tuple[str, int]] = []
    job = _job(exp, tmp_path / "job")
    with job.scope():
        fresh = train_setup.init_or_restore(job, train_setup.StateSource.FRESH)
        state = init_from.initialise(
            fresh.state,
            {step_dir: CheckpointLoadingRules()},
            {step_dir: (1, 1)},
            observer=lambda leaf, nbytes: reads.append((leaf, nbytes)),
        )
    leaves = traverse_util.flatten_dict(state.params, sep="/")
    sharded = 0
    for leaf, array in leaves.items():
        asked = [n for name, n in reads if name == leaf]
        shards = {
            tuple((s.start, s.stop) for s in idx)
            for idx in array.sharding.devices_indices_map(array.shape).values()
        }
        assert sum(asked) == array.nbytes, leaf
        assert len(asked) == len(shards) and max(asked) == array.nbytes // len(shards), leaf
        sharded += len(shards) > 1
    assert sharded >= 8  # embeddings, attention and feed-forward weights are split
    one_device = _pax_experiment(name)
    job = _job(one_device, tmp_path / "one")
    with job.scope():
        fresh = train_setup.init_or_restore(job, train_setup.StateSource.FRESH)
        whole = init_from.initialise(
            fresh.state, {step_dir: CheckpointLoadingRules()}, {step_dir: (1, 1)}
        )
    for name_, value in _flat(whole).items():
        np.testing.assert_array_equal(_flat(state)[name_], value)


@pytest.mark.slow
def test_eval_and_decode_read_a_chosen_checkpoint_and_write_into_their_own_job(
    source_job, tmp_path
):
    """--restore_checkpoint_dir/--restore_checkpoint_step (Pax's flags): the parameters of
    that step, resharded onto 8 devices; outputs in --job_log_dir; same eval as the source's own."""
    knobs = (
        "--set=USE_REPEATED_LAYER=False",
        "--set=PERCORE_BATCH_SIZE=1",
        "--set=ICI_MESH_SHAPE=1,8,1",
    )
    job = tmp_path / "job"
    chosen = (f"--restore_checkpoint_dir={source_job}", "--restore_checkpoint_step=3")
    code, out, err = run_main_in_process(f"--job_log_dir={job}", "--mode=eval", *chosen, *knobs)
    assert code == 0, err[-2000:]
    assert f"Restored the parameters of step 3 from {source_job}/checkpoints/3" in out
    code, own, err = run_main_in_process(f"--job_log_dir={source_job}", "--mode=eval", *knobs)
    assert code == 0, err[-2000:]
    eval_line = [line for line in out.splitlines() if line.startswith("eval 'test' at step 3")]
    assert eval_line and eval_line == [x for x in own.splitlines() if x.startswith("eval 'test'")]
    assert (job / "summaries" / "eval_test").is_dir() and not (job / "checkpoints").exists()
    code, out, err = run_main_in_process(f"--job_log_dir={job}", "--mode=decode", *chosen, *knobs)
    assert code == 0, err[-2000:]
    assert (job / "decoder_out" / "progressions_step3.jsonl").is_file()
    code, err = main_in_process(
        f"--job_log_dir={job}", "--mode=eval", f"--restore_checkpoint_dir={tmp_path}", *knobs
    )
    assert code == 2 and "holds no checkpoint paxlite can read" in err and err.count("\n") == 1


def test_an_init_from_that_does_not_exist_says_so_first_and_leaves_no_job_dir(tmp_path):
    job = tmp_path / "job"
    code, err = main_in_process(
        f"--job_log_dir={job}",
        f"--init_from={tmp_path / 'no_such_dir'}",
        "--set=NUM_TRAIN_STEPS=2",
        "--set=ICI_MESH_SHAPE=1,8,1",  # This process has 8 devices.
    )
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"paxlite: error: {tmp_path / 'no_such_dir'} does not exist")
    assert not job.exists()  # No config files, no checkpoints/.
