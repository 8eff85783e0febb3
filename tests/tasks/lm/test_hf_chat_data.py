"""HfCausalLm with RECORDS=CHAT (tasks.lm.chat): JSONL conversations rendered with qwen2's chat
template, one prefix-LM example per assistant turn, the loss on the assistant turns only.

Oracle: ``hf_chat.encode_chat`` (checked against transformers in its own tests):
its ids are the context, its weighted runs the assistant turns.
"""

from __future__ import annotations

import json

import pytest

from paxlite.experiments import base_experiment
from paxlite.experiments.base_experiment import KnobError
from paxlite.runtime import partitioning
from praxis_lite.inputs.base_input import InputDataError
from praxis_lite.tokenizers.hf_chat import ChatTemplate, encode_chat
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tasks.lm.chat import register_chat_task
from tasks.lm.hf import HfCausalLm, Records
from tasks.lm.text import TextFormat
from tests.praxis_lite.inputs.test_seqio_input import decode_rows, read_all
from tests.tasks.lm.test_hf_finetune import _HF, FAST, _run

QWEN2 = _HF / "qwen2"
T, P = 64, 40  # MAX_SEQ_LEN, MAX_PROMPT_LEN: a turn gets 24 tokens.
CONVERSATIONS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    [  # No system message: the template writes its default one.
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue"},
    ],
    [
        {"role": "user", "content": "Say yes."},
        {"role": "assistant", "content": "Yes! " * 8},  # Longer than the 24 tokens: cut.
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Yes."},
    ],
]
CHAT = {
    **FAST,
    "RECORDS": Records.CHAT,
    "TEXT_FORMAT": TextFormat.JSONL,
    "MAX_SEQ_LEN": T,
    "MAX_PROMPT_LEN": P,
}


def write(tmp_path, records, name="chat") -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def experiment(model="qwen2", **knobs) -> HfCausalLm:
    return base_experiment.with_overrides(
        HfCausalLm, {"HF_MODEL": str(_HF / model), **CHAT, **knobs}
    )()


def expected_turns(tokenizer: HfTokenizer) -> list[tuple[list[int], list[int], str]]:
    """(context, turn, content) of each assistant turn in file order: encode_chat's ids
    before the turn (the last P) and its weighted run (cut to T - P)."""
    template = ChatTemplate.from_dir(QWEN2)
    turns = []
    for messages in CONVERSATIONS:
        ids, weights = encode_chat(tokenizer, template, messages)
        starts = [t for t in range(len(ids)) if weights[t] and (t == 0 or not weights[t - 1])]
        contents = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(starts) == len(contents)
        for t, content in zip(starts, contents, strict=True):
            end = next((e for e in range(t, len(ids)) if not weights[e]), len(ids))
            turns.append((ids[:t][-P:], ids[t:end][: T - P], content))
    return turns


@pytest.mark.slow
def test_rows_are_context_then_weighted_assistant_turn(tmp_path):
    """One-epoch eval rows (one example a row, file order): labels are encode_chat's context
    then the turn; exactly the turn is weighted, and it decodes to the content + <|im_end|>.
    The decoder's prompts are the same contexts (after the start id), its targets the turns."""
    path = write(tmp_path, [{"messages": m} for m in CONVERSATIONS])
    exp = experiment(TEXT_DATA_PATH=path, TEXT_EVAL_DATA_PATH=path)
    tokenizer = HfTokenizer.from_dir(QWEN2)
    want = expected_turns(tokenizer)
    assert len(want) == 5 and any(len(c) == P for c, _, _ in want)  # A context was cut.
    assert any(len(t) == T - P for _, t, _ in want)  # A turn was cut.

    rows = []
    for batch in read_all(partitioning.instantiate_input(exp.datasets()[1])):
        for labels, weights in zip(batch.labels, batch.weights, strict=True):
            if weights.any():
                rows.append((labels.tolist(), weights.tolist()))
    assert len(rows) == len(want)
    for (labels, weights), (context, turn, content) in zip(rows, want, strict=True):
        n, m = len(context), len(turn)
        assert labels[: n + m] == context + turn
        assert weights == [0] * n + [1] * m + [0] * (T - n - m)
        weighted = tokenizer.decode([x for x, w in zip(labels, weights, strict=True) if w], False)
        if m < T - P:  # (The cut turn loses its end.)
            assert weighted == content + "<|im_end|>"

    start = tokenizer.eos_token_id  # qwen2 has no BOS: the start id is its EOS.
    prompts = decode_rows(read_all(partitioning.instantiate_input(exp.decoder_datasets()[0])))
    assert prompts == [((start, *context), tuple(turn)) for context, turn, _ in want]


@pytest.mark.slow
def test_training_weights_only_assistant_turns_and_loss_falls(tmp_path):
    """Packed training rows weight only assistant-turn tokens; a few steps lower the loss."""
    path = write(tmp_path, [{"messages": m} for m in CONVERSATIONS] * 10)
    exp = experiment(TEXT_DATA_PATH=path)
    train_cfg = exp.datasets()[0]
    train_cfg.shuffle = False
    batch = partitioning.instantiate_input(train_cfg).get_next()
    turns = {tuple(t) for _, t, _ in expected_turns(HfTokenizer.from_dir(QWEN2))}
    for labels, weights, seg in zip(batch.labels, batch.weights, batch.segment_ids, strict=True):
        for s in range(1, seg.max() + 1):
            weighted = labels[(seg == s) & (weights > 0)]
            assert tuple(weighted.tolist()) in turns
        assert not weights[seg == 0].any()

    losses = [s["loss"] for _, s in _run(exp, tmp_path / "job").history]
    assert len(losses) == 4 and losses[-1] < losses[0], losses


def test_a_record_without_the_field_is_one_error_naming_line_and_knob(tmp_path):
    good = {"messages": CONVERSATIONS[1]}
    path = write(tmp_path, [good, {"conversation": CONVERSATIONS[1]}, good])
    exp = experiment(TEXT_DATA_PATH=path)
    with pytest.raises(InputDataError) as e:  # The first example's read reaches line 2.
        partitioning.instantiate_input(exp.datasets()[0]).get_next()
    first = str(e.value).splitlines()[0]  # (Fiddle appends its context on later lines.)
    assert first.startswith(f"SeqIOInput 'train': {path}: line 2 has no field 'messages'")
    assert "--set=MESSAGES_FIELD=" in first


def test_a_model_without_a_chat_template_is_one_knob_error(tmp_path):
    path = write(tmp_path, [{"messages": CONVERSATIONS[1]}])
    with pytest.raises(KnobError) as e:
        experiment("mistral", TEXT_DATA_PATH=path)
    message = str(e.value)
    assert "\n" not in message and "no chat template" in message and "RECORDS=CHAT" in message
    with pytest.raises(KnobError, match="TEXT_FORMAT=LINES, but chat records are JSONL"):
        experiment(TEXT_DATA_PATH=path, TEXT_FORMAT=TextFormat.LINES)


def test_a_template_that_writes_bos_keeps_one(tmp_path):
    """llama3's template writes <|begin_of_text|>, its start id: the task drops it from the
    context (the converter puts the start id back), so a row holds it once."""
    llama3 = str(_HF / "llama3")
    path = write(tmp_path, [{"messages": CONVERSATIONS[0]}])
    task = register_chat_task("chat_llama3_test", train_path=path, vocab_path=llama3)
    tokenizer = HfTokenizer.from_dir(llama3)
    ids, weights = encode_chat(tokenizer, ChatTemplate.from_dir(llama3), CONVERSATIONS[0])
    assert ids[0] == tokenizer.bos_token_id
    examples = list(task.get_dataset(None, split="train", shuffle=False).as_numpy_iterator())
    assert len(examples) == 2
    for ex in examples:
        inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
        n = len(inputs) + 1
        assert ids[1:n] == inputs and ids[n : n + len(targets)] == targets
        assert set(weights[n : n + len(targets)]) == {1} and weights[n - 1] == 0
    assert tokenizer.decode(examples[1]["targets"].tolist(), False) == "4<|eot_id|>"
