"""LmPromptCompletionTiny: JSONL prompt/completion rows with the loss on the completions only,
checked against references built here from the JSONL text (bytes: id = byte + 3, EOS 1)."""

from __future__ import annotations

import collections
import json
import re

import jax
import numpy as np
import pytest

from paxlite.evaluation import decode_run
from paxlite.evaluation.eval_lib import run_eval_pass
from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.experiments.tasks_lib import Learner, SingleTask
from paxlite.runtime import partitioning
from paxlite.runtime.job import Job, build_job
from paxlite.train import pure_steps, train_loop
from praxis_lite import config as config_lib
from praxis_lite.inputs.base_input import InputDataError
from praxis_lite.optim import optimizers
from tasks.lm.prompt_completion import LmPromptCompletionTiny, write_example_task
from tasks.lm.text import LmTextTiny, TextFormat, continuation_metrics
from tests.praxis_lite.inputs.test_seqio_input import decode_rows, read_all

P, T = 12, 32  # MAX_PROMPT_LEN, MAX_SEQ_LEN: completions get 20 tokens with their EOS.
RECORDS = [
    {"prompt": "too long a prompt: cut at 12", "completion": "ok"},
    {"prompt": "q=", "completion": "a completion longer than twenty bytes"},
    *({"prompt": f"k{i}=", "completion": "zyx"[i % 3] * (1 + i % 4) + "é" * (i % 5 == 0)}
      for i in range(40)),
]  # fmt: skip
FAST = {
    "ICI_MESH_SHAPE": (1, 8, 1),  # The 8 fake CPU devices of the test process.
    "PERCORE_BATCH_SIZE": 1,
    "MAX_SEQ_LEN": T,
    "MAX_PROMPT_LEN": P,
    "NUM_TRAIN_STEPS": 8,
    "SUMMARY_INTERVAL_STEPS": 1,
    "CHECKPOINT_EVERY_N_STEPS": 1000,
    "LR_COS_WARMUP": 0,
    "LEARNING_RATE": 1e-2,
}
SMALL = {"NUM_LAYERS": 1, "USE_REPEATED_LAYER": False}  # Compiles faster; any model will do.


def write(tmp_path, records=RECORDS, name="train") -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def experiment(**knobs) -> LmPromptCompletionTiny:
    return base_experiment.with_overrides(LmPromptCompletionTiny, {**FAST, **knobs})()


def byte_ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8")]


def reference(record: dict[str, str]) -> tuple[list[int], list[int]]:
    """The prompt (cut to P tokens) and completion (cut to T - P - 1, then EOS) ids."""
    return byte_ids(record["prompt"])[:P], byte_ids(record["completion"])[: T - P - 1] + [1]


def reference_segment(record: dict[str, str]) -> tuple[tuple[int, ...], ...]:
    """(ids, labels, weights) of one example: BOS + prompt + completion, the loss on the
    completion and its EOS only."""
    prompt, completion = reference(record)
    labels = prompt + completion
    return tuple([0] + labels[:-1]), tuple(labels), (0,) * len(prompt) + (1,) * len(completion)


@pytest.mark.slow
def test_training_rows_are_packed_prompts_and_weighted_completions(tmp_path):
    train_cfg = experiment(TEXT_DATA_PATH=write(tmp_path)).datasets()[0]
    train_cfg.shuffle = False  # File order: the two cut records are in the first batch.
    batch = partitioning.instantiate_input(train_cfg).get_next()
    assert batch.ids.shape == batch.segment_ids.shape == (8, T)  # MAX_SEQ_LEN = P + 20.
    want = {reference_segment(r) for r in RECORDS}
    seen = []
    for ids, labels, weights, seg, pos in zip(
        batch.ids, batch.labels, batch.weights, batch.segment_ids, batch.segment_pos, strict=True
    ):
        for s in range(1, seg.max() + 1):
            (where,) = np.nonzero(seg == s)
            np.testing.assert_array_equal(where, np.arange(where[0], where[0] + len(where)))
            np.testing.assert_array_equal(pos[where], np.arange(len(where)))
            seen.append((tuple(ids[where]), tuple(labels[where]), tuple(weights[where])))
        pad = seg == 0
        assert not (ids[pad].any() or labels[pad].any() or weights[pad].any())
    assert set(seen) <= want and len(seen) == len(set(seen)) > 2 * len(batch.ids)
    assert {reference_segment(RECORDS[0]), reference_segment(RECORDS[1])} <= set(seen)


@pytest.mark.slow
def test_eval_loss_and_accuracy_count_the_completions_only(tmp_path):
    """One-epoch eval (one record a row) against numpy from the model's logits, with the
    completion positions taken from the JSONL text."""
    records = RECORDS[2:12]
    path = write(tmp_path, records, "valid")
    exp = experiment(TEXT_DATA_PATH=path, TEXT_EVAL_DATA_PATH=path, **SMALL)
    eval_input = partitioning.instantiate_input(exp.datasets()[1])
    task = SingleTask(
        model=config_lib.instantiate(exp.model()),
        learner=Learner(optimizer=optimizers.Sgd(learning_rate=0.1)),
    )
    n = eval_input.batch_size
    batches = read_all(eval_input)  # 2 batches of 8 rows, the last with 6 padding rows.
    eval_input.reset()
    params = jax.jit(task.model.init)(jax.random.key(0), batches[0])["params"]
    eval_step = jax.jit(pure_steps.make_eval_step(task))
    metrics = run_eval_pass(eval_step, params, eval_input, lambda b: b)

    logits_fn = jax.jit(lambda p, b: task.model.apply({"params": p}, b, method="logits"))
    xent, hits = [], []
    for start, batch in zip(range(0, len(records), n), batches, strict=True):
        logits = np.asarray(logits_fn(params, batch), np.float64)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        for row, record in enumerate(records[start : start + n]):
            prompt, completion = reference(record)
            span = np.arange(len(prompt), len(prompt) + len(completion))
            np.testing.assert_array_equal(batch.labels[row, span], completion)
            xent += list(-log_probs[row, span, completion])
            hits += list(logits[row, span].argmax(-1) == completion)
    assert metrics["num_tokens"] == len(xent) == sum(len(reference(r)[1]) for r in records)
    np.testing.assert_allclose(metrics["loss"], np.mean(xent), rtol=1e-5)
    np.testing.assert_allclose(metrics["accuracy"], np.mean(hits), rtol=1e-5)
    assert 0 < metrics["accuracy"] < 1  # Repeated letters: a fresh tied-embedding LM echoes.


def test_decoder_input_prompts_with_the_prompt_and_targets_the_completion(tmp_path):
    path = write(tmp_path)
    exp = experiment(TEXT_DATA_PATH=path, TEXT_EVAL_DATA_PATH=path)
    (cfg,) = exp.decoder_datasets()
    prompts = partitioning.instantiate_input(cfg)
    batches = read_all(prompts)
    rows = decode_rows(batches)
    want = [((0, *reference(r)[0]), tuple(reference(r)[1])) for r in RECORDS]
    assert collections.Counter(rows) == collections.Counter(want)
    assert batches[0].prefix_ids.shape[1] == 1 + P and batches[0].target_ids.shape[1] == T - P
    texts = prompts.ids_to_strings(np.asarray([t + (0,) * (T - P - len(t)) for _, t in rows]))
    assert texts == [r["completion"][: T - P - 1] for r in RECORDS]  # Without the EOS.
    assert prompts.predict_metric_fns == [continuation_metrics]
    assert exp.task().decode_interval_steps == exp.EVAL_INTERVAL_STEPS


@pytest.mark.parametrize(
    "line, number, message",
    [
        ('{"prompt": "a=", "answer": "b"}', 1, "has no field 'completion'.*COMPLETION_FIELD"),
        ('{"completion": "b"}', 1, "has no field 'prompt'.*PROMPT_FIELD"),
        ('{"prompt": "a=", "completion": ', 30, r"is not JSON \(Expecting value: column 32\)"),
    ],
    ids=["no-completion", "no-prompt", "cut-off-line"],
)
def test_a_bad_record_is_one_error_naming_file_line_and_fix(tmp_path, line, number, message):
    lines = [json.dumps(r) for r in RECORDS]
    lines[number - 1] = line
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    exp = experiment(TEXT_DATA_PATH=str(path))
    with pytest.raises(InputDataError) as e:  # Line 1 by the file check, line 30 while read.
        partitioning.instantiate_input(exp.datasets()[0]).get_next()
    first = str(e.value).splitlines()[0]  # (Fiddle appends its context on later lines.)
    assert first.startswith(f"SeqIOInput 'train': {path}: line {number} ")
    assert re.search(message, first)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (dict(TEXT_FORMAT=TextFormat.LINES), "TEXT_FORMAT=LINES.*--set=TEXT_FORMAT=JSONL"),
        (dict(TEXT_FIELD="body"), "TEXT_FIELD does not apply.*PROMPT_FIELD and COMPLETION"),
        (dict(COMPLETION_FIELD="prompt"), "both 'prompt'"),
        (dict(MAX_PROMPT_LEN=T), f"MAX_PROMPT_LEN={T} must be in"),
    ],
)
def test_knobs_are_checked(knobs, message):
    with pytest.raises(KnobError, match=message):
        experiment(TEXT_DATA_PATH="x", **knobs)


@pytest.mark.slow
def test_training_lowers_the_completions_loss(tmp_path):
    """8 steps on one device, from scratch, on the fine-tuning test's model, batch and
    schedule. (That test compiles optimized, `@pytest.mark.optimized`, so the two no longer
    share a compiled step: sharing it did not pay, 46.7 against 45.4 CPU-seconds.)"""
    job = _one_device_job(
        LmPromptCompletionTiny,
        tmp_path / "job",
        TEXT_DATA_PATH=write(tmp_path),
        NUM_TRAIN_STEPS=8,
        SUMMARY_INTERVAL_STEPS=1,
    )
    losses = [s["loss"] for _, s in train_loop.run(job, peak_tflops=1.0).history]
    assert len(losses) == 8 and losses[-1] < losses[0]


@pytest.mark.optimized  # Many steps: optimized steps cost less.
@pytest.mark.slow
def test_fine_tuning_an_lm_text_tiny_checkpoint_on_prompt_completion_pairs(tmp_path):
    """LmTextTiny trained briefly on the example words, then LmPromptCompletionTiny fine-tuned
    from it (INIT_FROM, the knob of --init_from) on the generated letter-substitution task, on
    one device. Oracle: the same checkpoint before fine-tuning (the loss on completions of the
    first step, and its decoded completions: --restore_checkpoint_dir's path)."""
    train_path, eval_path = write_example_task(str(tmp_path / "data"), num_eval=32)
    words = [json.loads(line)["prompt"][:-1] for line in open(train_path)]
    text = tmp_path / "words.txt"
    text.write_text("".join(" ".join(words[i : i + 8]) + "\n" for i in range(0, len(words), 8)))
    source = tmp_path / "source"
    # LmPromptCompletionTiny's schedule (its 20 steps are the warmup either way): the same
    # train step as the fine-tuning's, compiled once.
    schedule = dict(LR_COS_DECAY_END=LmPromptCompletionTiny.LR_COS_DECAY_END)
    train_loop.run(
        _one_device_job(
            LmTextTiny, source, TEXT_DATA_PATH=str(text), NUM_TRAIN_STEPS=20, **schedule
        ),
        peak_tflops=1.0,
    )

    tuned = _one_device_job(
        LmPromptCompletionTiny,
        tmp_path / "tuned",
        INIT_FROM=str(source),
        NUM_TRAIN_STEPS=150,
        EVAL_INTERVAL_STEPS=150,
        SUMMARY_INTERVAL_STEPS=1,
        TEXT_DATA_PATH=train_path,
        TEXT_EVAL_DATA_PATH=eval_path,
    )
    before = decode_run.run(tuned, checkpoint=str(source))  # Its decoder inputs, untrained.
    after = train_loop.run(tuned, evaluate=True, peak_tflops=1.0)
    (first_step, first), *_ = after.history
    matched = [r.decode["prompts"]["exact_match"] for r in (before, after)]
    assert first_step == 1 and after.eval["validation"]["loss"] < first["loss"] / 4
    assert matched[1] > matched[0] + 0.3, matched  # 0 -> 0.59 on our 2-core CPU.


def _one_device_job(experiment: type, job_dir, **knobs) -> Job:
    """The experiment's job (and its decoder inputs) on one device, 16 rows a batch (the
    batch sizes are per device of this 8-device process)."""
    one_device = {"ICI_MESH_SHAPE": (1, 1, 1), "PERCORE_BATCH_SIZE": 2}
    exp = base_experiment.with_overrides(experiment, {**one_device, **knobs})()
    decoders = exp.decoder_datasets() if knobs.get("TEXT_EVAL_DATA_PATH") else ()
    return build_job(exp, exp.task(), exp.datasets(), job_dir, jax.devices()[:1], decoders)
