"""``python -m paxlite.t5x.eval`` and ``paxlite.t5x.infer`` in this process, against T5X's own.

Oracle: tests/fixtures/t5x/t5x_eval_infer (tools/t5x_fixtures/make_t5x_eval_infer.py): T5X
at commit cc342d4 ran its ``t5x.eval`` and ``t5x.infer`` with that directory's gin files
(T5X's tiny.gin with eval.gin / infer.gin; the validation split of the t5x_run user
directory's task, float32, batch 8) on T5X's fine-tuned checkpoint_7, and kept what they
wrote: beam search (T5X's default, one decode) in every mode, and greedy decoding
(``temperature_sample``, topk 1) with its scores. paxlite runs the same commands on the same
checkpoint: texts must be T5X's exactly, scores within 1e-4 relative.
"""

import json
import pathlib
import sys

import numpy as np
import pytest

from paxlite.t5x import eval as t5x_eval
from paxlite.t5x import infer as t5x_infer
from tests import FIXTURES
from tests.paxlite.t5x.commands import refusal, run_in_process
from tests.paxlite.t5x.user_dirs import fresh_user_directory, registered_task_without_data

ORACLE = FIXTURES / "t5x" / "t5x_eval_infer"
USER_DIR = FIXTURES / "t5x" / "t5x_run" / "user_dir"
CHECKPOINT = FIXTURES / "t5x" / "t5x_run" / "final_checkpoint" / "checkpoint_7"
TASK = "t5x_run_reverse"


def run_command(command, *argv: str) -> tuple[int, str, str]:
    """``python -m paxlite.t5x.<command> ARGV`` (the fixture's user directory on the path,
    its task registered afresh): ``(exit code, stdout, stderr)``."""
    args = [
        f"--gin_search_paths={USER_DIR},{ORACLE}",
        f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file="{USER_DIR}/spm.model"',
        *argv,
    ]
    with fresh_user_directory(USER_DIR, TASK):
        return run_in_process(command.main, command.__name__, args)


def run_eval(out: pathlib.Path, checkpoint: pathlib.Path, *argv: str) -> tuple[int, str, str]:
    """T5X's eval command (eval_run.gin) of CHECKPOINT_PATH ``checkpoint`` into
    EVAL_OUTPUT_DIR ``out``, then ARGV: ``(exit code, stdout, stderr)``."""
    return run_command(
        t5x_eval,
        "--gin_file=eval_run.gin",
        f'--gin.CHECKPOINT_PATH="{checkpoint}"',
        f'--gin.EVAL_OUTPUT_DIR="{out}"',
        *argv,
    )


def run_infer(
    out: pathlib.Path, gin_file: str, checkpoint: pathlib.Path, *argv: str
) -> tuple[int, str, str]:
    """T5X's infer command (``gin_file``) of CHECKPOINT_PATH ``checkpoint`` into
    INFER_OUTPUT_DIR ``out``, then ARGV: ``(exit code, stdout, stderr)``."""
    return run_command(
        t5x_infer,
        f"--gin_file={gin_file}",
        f'--gin.CHECKPOINT_PATH="{checkpoint}"',
        f'--gin.INFER_OUTPUT_DIR="{out}"',
        *argv,
    )


def _lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _refused(code: int, err: str, output_dir: pathlib.Path) -> str:
    """The one error line of a refused command, checked: exit 2, nothing written."""
    line = refusal(code, err)
    assert not output_dir.exists() or not any(output_dir.iterdir())
    return line


def _eval(out: pathlib.Path, checkpoint: pathlib.Path, *extra: str) -> str:
    """The eval command of ``checkpoint`` into ``out``, succeeded: its stdout."""
    code, stdout, err = run_eval(out, checkpoint, *extra)
    assert code == 0, err[-3000:]
    return stdout


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> pathlib.Path:
    """paxlite's run of T5X's eval command on checkpoint_7: its EVAL_OUTPUT_DIR."""
    out = tmp_path_factory.mktemp("eval") / "out"
    _eval(out, CHECKPOINT)
    return out


@pytest.mark.slow
def test_eval_writes_t5x_s_inferences_metrics_and_files(eval_dir):
    ours, theirs = eval_dir / "inference_eval", ORACLE / "eval" / "inference_eval"
    # SeqIO's evaluator with T5X's loggers: each example's input, target, output, prediction.
    jsonl = f"{TASK}-000007.jsonl"
    assert (ours / jsonl).read_text() == (theirs / jsonl).read_text()
    metrics = f"{TASK}-metrics.jsonl"
    assert _lines(ours / metrics) == _lines(theirs / metrics)
    assert (eval_dir / "model-info.txt").read_text() == (
        ORACLE / "eval" / "model-info.txt"
    ).read_text()
    assert (eval_dir / f"eval.{TASK}.ckpt").read_text() == str(CHECKPOINT)
    from tests.paxlite.test_main import scalar_series

    tag = "eval/sequence_accuracy"
    expected = json.loads((ORACLE / "eval" / "scalars.json").read_text())
    assert dict(scalar_series(ours / TASK, tag)) == {
        int(k): v for k, v in expected[f"inference_eval/{TASK}/{tag}"].items()
    }
    config = (eval_dir / "config.gin").read_text()
    assert "eval_script.evaluate.output_dir = %EVAL_OUTPUT_DIR" in config


def _same_eval_inferences(out: pathlib.Path, step: int = 7, oracle: str = "eval") -> bool:
    """Whether ``out`` holds the inferences of T5X's run ``oracle`` (at ``step``: a Hugging
    Face directory's is 0)."""
    theirs = ORACLE / oracle / "inference_eval" / f"{TASK}-000007.jsonl"
    return (out / "inference_eval" / f"{TASK}-{step:06}.jsonl").read_text() == theirs.read_text()


@pytest.mark.slow
def test_eval_of_each_step_of_a_model_dir_at_the_longest_lengths(tmp_path):
    """``RestoreCheckpointConfig.mode = 'all'`` over T5X's model directory, with eval.gin's
    ``TASK_FEATURE_LENGTHS = None`` (seqio measures the longest example; decoding runs to
    that target length): T5X's inferences of the same; a second run finds every step
    evaluated (``eval.<task>.ckpt``)."""
    out = tmp_path / "eval"
    extra = ("--gin.utils.RestoreCheckpointConfig.mode='all'", "--gin.TASK_FEATURE_LENGTHS=None")
    _eval(out, CHECKPOINT.parent, *extra)
    assert _same_eval_inferences(out, oracle="eval_longest")
    assert not _same_eval_inferences(out)  # Longer decodes than with the lengths 32/16.
    assert (out / f"eval.{TASK}.ckpt").read_text() == str(CHECKPOINT)
    again = _eval(out, CHECKPOINT.parent, *extra)
    assert "evaluated already" in again
    assert len((out / "inference_eval" / f"{TASK}-metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow
def test_eval_of_a_hugging_face_directory_of_the_same_model(tmp_path):
    """CHECKPOINT_PATH a Hugging Face directory (T5X's checkpoint written in Hugging Face's
    T5 names and config): the same inferences as T5X's from its own checkpoint."""
    import shutil

    import jax
    from flax import traverse_util

    from paxlite.formats.hf import checkpoint as hf_checkpoint
    from paxlite.formats.hf import models as hf_models
    from paxlite.pretrained.loading import from_pretrained

    t5x_dir = tmp_path / "t5x_model_dir"
    t5x_dir.mkdir()
    shutil.copy(FIXTURES / "t5x" / "t5x_run" / "config.gin", t5x_dir / "config.gin")
    (t5x_dir / "checkpoint_7").symlink_to(CHECKPOINT)
    params = traverse_util.flatten_dict(from_pretrained(t5x_dir).params, sep="/")
    config = json.loads((FIXTURES / "hf" / "t5_flan" / "config.json").read_text())
    config |= {  # T5X's tiny.gin in Hugging Face's T5 fields.
        "d_model": 8,
        "d_ff": 16,
        "d_kv": 3,
        "num_heads": 4,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "vocab_size": 384,
        "tie_word_embeddings": False,
    }
    host = {path: np.asarray(jax.device_get(value)) for path, value in params.items()}
    hf_checkpoint.save(tmp_path / "hf", host, hf_models.FAMILIES["t5"], config)
    out = tmp_path / "eval"
    _eval(out, tmp_path / "hf")
    assert _same_eval_inferences(out, step=0)  # One set of weights: no step.
    assert (out / f"eval.{TASK}.ckpt").read_text() == str(tmp_path / "hf")


def _infer(tmp_path: pathlib.Path, gin_file: str, *extra: str) -> tuple[pathlib.Path, str]:
    """The infer command (``gin_file``) of checkpoint_7 into ``tmp_path``/infer, succeeded:
    that directory and the command's stdout."""
    out = tmp_path / "infer"
    code, stdout, err = run_infer(out, gin_file, CHECKPOINT, *extra)
    assert code == 0, err[-3000:]
    return out, stdout


def _same_inferences(ours: list[dict], theirs: list[dict], score_key: str | None) -> None:
    """Texts exactly T5X's, in its order; scores within 1e-4 relative."""
    assert len(ours) == len(theirs) == 40
    for mine, t5x in zip(ours, theirs, strict=True):
        assert mine["inputs"] == t5x["inputs"]
        assert mine.get("prediction") == t5x.get("prediction")
    if score_key is not None:
        got = np.array([_score(line, score_key) for line in ours])
        want = np.array([_score(line, score_key) for line in theirs])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _score(line: dict, key: str) -> float:
    return line["aux"]["scores"] if key == "aux" else line[key]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, mode, score_key",
    [
        ("score", "score", "score"),
        ("predict_with_aux", "predict_with_aux", "aux"),
        ("greedy", "predict_with_aux", "aux"),
        ("bf16", "predict_with_aux", "aux"),  # infer.gin's dtype: 2 of 40 decodes differ.
    ],
)
def test_infer_writes_t5x_s_file_in_each_mode(tmp_path, name, mode, score_key):
    out, _ = _infer(tmp_path, f"infer_{name}.gin")
    file_name = f"{TASK}-{mode}.jsonl-00000-of-00001"
    theirs = _lines(ORACLE / f"infer_{name}" / file_name)
    _same_inferences(_lines(out / file_name), theirs, score_key)
    assert (out / f"{file_name}.COMPLETED").exists()
    assert not list(out.glob("tmp-*"))  # The chunks merged, the temporary folder gone.
    assert (out / "model-info.txt").read_text() == (
        ORACLE / f"infer_{name}" / "model-info.txt"
    ).read_text()


@pytest.mark.slow
def test_infer_of_a_shard_goes_on_from_an_interrupted_run_s_chunks(tmp_path):
    """``--shard_id=1`` of ``infer.num_shards=2``: SeqIO's second shard of the split, in
    T5X's file. With ``infer.checkpoint_period=1`` (a chunk per batch in T5X's temporary
    folder), the first chunk as an interrupted run left it (with its ``.COMPLETED``) is
    kept, not recomputed. Run again, the completed task is skipped."""
    name = f"{TASK}-score.jsonl-00001-of-00002"
    theirs = _lines(ORACLE / "infer_score" / f"{TASK}-score.jsonl-00000-of-00001")[1::2]
    tmp = tmp_path / "infer" / f"tmp-{TASK}-00001-of-00002"
    tmp.mkdir(parents=True)
    kept = [dict(line, score=-1.0) for line in theirs[:8]]  # Marked: not recomputed.
    (tmp / f"{name}-chunk00000").write_text("".join(json.dumps(k) + "\n" for k in kept))
    (tmp / f"{name}-chunk00000.COMPLETED").write_text("")
    extra = (
        "--gin.infer_script.infer.num_shards=2",
        "--shard_id=1",
        "--gin.infer_script.infer.checkpoint_period=1",
    )
    out, _ = _infer(tmp_path, "infer_score.gin", *extra)
    ours = _lines(out / name)
    assert ours[:8] == kept
    assert [line["inputs"] for line in ours] == [line["inputs"] for line in theirs]
    np.testing.assert_allclose(
        [line["score"] for line in ours[8:]], [line["score"] for line in theirs[8:]], rtol=1e-4
    )
    assert not tmp.exists()
    assert not (out / "config.gin").exists()  # Shard 0 writes the config, as in T5X.
    _, again = _infer(tmp_path, "infer_score.gin", *extra)
    assert "completed already" in again


@pytest.mark.slow
def test_infer_in_two_processes_is_t5x_s(tmp_path):
    """T5X's multi-host flags: 2 processes (one CPU device each) joined by JAX, each
    passing its rows of every batch; process 0 writes T5X's file (mode predict: the
    decoded texts only)."""
    from tests.paxlite.test_main import assert_ended_cleanly
    from tests.processes import cpu_env, free_port, run_together

    out, port = tmp_path / "infer", free_port()
    env = cpu_env(1, PYTHONPATH=str(USER_DIR), JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    commands = [
        [sys.executable, "-m", "paxlite.t5x.infer", f"--gin_search_paths={USER_DIR},{ORACLE}"]
        + ["--gin_file=infer_predict.gin", f'--gin.CHECKPOINT_PATH="{CHECKPOINT}"']
        + [f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file="{USER_DIR}/spm.model"']
        + [f'--gin.INFER_OUTPUT_DIR="{out}"', f"--coordinator_address=127.0.0.1:{port}"]
        + ["--process_count=2", f"--process_index={i}", "--initialization_timeout=120"]
        for i in range(2)
    ]
    # Not from the repository root: its own `tasks` package is not the user's.
    for result in run_together(commands, tmp_path, env, timeout=300):
        assert_ended_cleanly(result)
    name = f"{TASK}-predict.jsonl-00000-of-00001"
    ours, theirs = _lines(out / name), _lines(ORACLE / "infer_predict" / name)
    assert set(ours[0]) == {"inputs", "prediction"}
    _same_inferences(ours, theirs, None)


def test_a_checkpoint_path_with_nothing_restorable(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    code, _, err = run_eval(out, empty)
    line = _refused(code, err, out)
    assert "CHECKPOINT_PATH" in line and "holds no checkpoint paxlite can read" in line


def test_an_output_dir_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    out = blocker / "infer"
    code, _, err = run_infer(out, "infer_predict.gin", CHECKPOINT)
    line = _refused(code, err, out)
    assert f"INFER_OUTPUT_DIR {out} cannot be used: {blocker} is a file" in line


def test_a_mode_t5x_lacks_is_named_with_t5x_s_modes(tmp_path):
    mode_gin = tmp_path / "infer_bad.gin"
    mode_gin.write_text(
        "from __gin__ import dynamic_registration\nimport __main__ as infer_script\n"
        "include 'infer_run.gin'\ninfer_script.infer.mode = 'predict_batch'\n"
    )
    out = tmp_path / "out"
    search = f"--gin_search_paths={USER_DIR},{ORACLE},{tmp_path}"
    code, _, err = run_infer(out, "infer_bad.gin", CHECKPOINT, search)
    line = _refused(code, err, out)
    assert "infer.mode = 'predict_batch'" in line
    assert "'predict', 'score', 'predict_with_aux'" in line


def test_paxlite_s_checkpoint_flags_are_refused_naming_checkpoint_path(tmp_path):
    out = tmp_path / "out"
    code, _, err = run_eval(out, CHECKPOINT, f"--init_from={CHECKPOINT}")
    line = _refused(code, err, out)
    assert "--init_from is not a flag of T5X's eval command" in line
    assert "CHECKPOINT_PATH" in line


def test_infer_reads_one_checkpoint(tmp_path):
    out = tmp_path / "out"
    code, _, err = run_command(
        t5x_infer,
        "--gin_file=infer_predict.gin",
        f"--gin.CHECKPOINT_PATH=['{CHECKPOINT}', '{CHECKPOINT}']",
        f'--gin.INFER_OUTPUT_DIR="{out}"',
    )
    assert "names 2 checkpoints; infer reads one" in _refused(code, err, out)


def test_a_task_without_metrics_is_skipped_during_training(tmp_path, capsys):
    """T5X's training skips an inference eval it cannot run; eval refuses it (test above)."""
    import types

    from paxlite.formats.t5x import inference_eval

    with registered_task_without_data("task_without_metrics") as name:
        config = inference_eval.T5xInferenceEval(name, "validation", batch_size=8)
        program = config.for_job(types.SimpleNamespace(job_log_dir=tmp_path), None)
        assert program.run(None, 5) == {}
        assert "no inference eval during training" in capsys.readouterr().out
        with pytest.raises(inference_eval.InferenceEvalError, match="has no metrics"):
            config.evaluator(tmp_path)


def test_infer_refuses_restore_mode_all(tmp_path):
    out = tmp_path / "out"
    restore_all = "--gin.utils.RestoreCheckpointConfig.mode='all'"
    code, _, err = run_infer(out, "infer_predict.gin", CHECKPOINT.parent, restore_all)
    line = _refused(code, err, out)
    assert "RestoreCheckpointConfig.mode = 'all'" in line
