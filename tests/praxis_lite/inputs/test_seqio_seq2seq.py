"""SeqIOInput(encoder_decoder=True) on real SeqIO pipelines: seqio's EncDecFeatureConverter
batches (unpacked, packed, one-epoch eval on two hosts), decode batches prompted by 'inputs',
the settings it refuses, and a prompt/completion JSONL task registered with inputs_eos."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import seqio
import tensorflow as tf

from praxis_lite.inputs import seqio_tasks
from praxis_lite.inputs.base_input import InputConfigError
from praxis_lite.inputs.seqio_input import DecodeForm, SeqIOInput
from tasks.lm.prompt_completion import register_prompt_completion_task
from tests.praxis_lite.inputs.test_seqio_input import read_all

BYTES = seqio.ByteVocabulary()
EOS = BYTES.eos_id
PAIRS = [(f"what is {i} plus {i}?", f"it is {2 * i}." + "!" * (i % 3)) for i in range(11)]
LENGTHS = {"inputs": 16, "targets": 8}  # Trims the longer questions and answers.
ENC_DEC_KEYS = [
    "decoder_input_tokens",
    "decoder_loss_weights",
    "decoder_target_tokens",
    "encoder_input_tokens",
]
PACKED_KEYS = sorted(
    ENC_DEC_KEYS
    + ["decoder_positions", "decoder_segment_ids", "encoder_positions", "encoder_segment_ids"]
)


def _register(name: str, pattern: str, features: dict[str, seqio.Feature]) -> str:
    """A task of tab-separated lines: 'inputs' TAB 'targets' (only the features given)."""

    def to_features(ds):
        def split(line):
            parts = tf.strings.split(line, "\t")
            return {k: parts[i] for i, k in enumerate(("inputs", "targets")) if k in features}

        return ds.map(split)

    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource({"validation": pattern}),
        preprocessors=[
            to_features,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features,
    )
    return name


@pytest.fixture(scope="module")
def pattern(tmp_path_factory) -> str:
    """The pairs in 2 files of 6 and 5 lines (two hosts shard them by file)."""
    root = tmp_path_factory.mktemp("seq2seq")
    for f, pairs in enumerate((PAIRS[:6], PAIRS[6:])):
        (root / f"pairs-{f}.tsv").write_text("".join(f"{q}\t{a}\n" for q, a in pairs))
    return str(root / "pairs-*.tsv")


@pytest.fixture(scope="module")
def t5_task(pattern) -> str:
    """'inputs' + EOS and 'targets' + EOS, bytes: T5's convention."""
    feature = seqio.Feature(BYTES, add_eos=True)
    return _register("seq2seq_pairs", pattern, {"inputs": feature, "targets": feature})


def make(task: str, **kwargs) -> SeqIOInput:
    """A one-epoch, unshuffled eval input of 4 examples a batch."""
    kwargs.setdefault("task_feature_lengths", LENGTHS)
    kwargs.setdefault("split_name", "validation")
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("encoder_decoder", True)
    return SeqIOInput(
        mixture_name=task,
        name="eval",
        is_training=False,
        reset_for_eval=True,
        shuffle=False,
        **kwargs,
    )


def tokens(text: str, width: int) -> list[int]:
    """``text``'s bytes with EOS, trimmed to ``width`` as append_eos_after_trim does."""
    return BYTES.encode(text)[: width - 1] + [EOS]


def test_unpacked_batches_are_the_examples(t5_task):
    batches = read_all(make(t5_task))
    assert len(batches) == 3  # ceil(11 / 4): the last batch has one padding example.
    for b in batches:
        assert sorted(b) == ENC_DEC_KEYS
        assert b.encoder_input_tokens.shape == (4, 16) and b.decoder_target_tokens.shape == (4, 8)
        assert all(v.dtype == np.int32 for k, v in b.items() if k != "decoder_loss_weights")
        assert b.decoder_loss_weights.dtype == np.float32
    for i, (question, answer) in enumerate(PAIRS):  # One host, unshuffled: file order.
        b, r = batches[i // 4], i % 4
        inputs, targets = tokens(question, 16), tokens(answer, 8)
        np.testing.assert_array_equal(
            b.encoder_input_tokens[r], np.pad(inputs, (0, 16 - len(inputs)))
        )
        target_row = np.pad(targets, (0, 8 - len(targets)))
        np.testing.assert_array_equal(b.decoder_target_tokens[r], target_row)
        np.testing.assert_array_equal(b.decoder_input_tokens[r], [0, *target_row[:-1]])
        np.testing.assert_array_equal(b.decoder_loss_weights[r], target_row != 0)
    last = batches[-1]
    assert not any(v[len(PAIRS) % 4 :].any() for v in last.values())  # Padding: all zero.


def segments(b, row: int) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Segment id -> (its encoder tokens, its decoder targets) in packed row ``row``,
    checking its positions, decoder inputs and weights on the way."""
    out = {}
    for s in sorted((set(b.encoder_segment_ids[row]) | set(b.decoder_segment_ids[row])) - {0}):
        enc, dec = b.encoder_segment_ids[row] == s, b.decoder_segment_ids[row] == s
        assert enc.any() and dec.any(), f"segment {s} is on one side only"
        np.testing.assert_array_equal(b.encoder_positions[row][enc], np.arange(enc.sum()))
        np.testing.assert_array_equal(b.decoder_positions[row][dec], np.arange(dec.sum()))
        targets = b.decoder_target_tokens[row][dec]
        np.testing.assert_array_equal(b.decoder_input_tokens[row][dec], [0, *targets[:-1]])
        np.testing.assert_array_equal(b.decoder_loss_weights[row][dec], 1)
        out[s] = (tuple(b.encoder_input_tokens[row][enc]), tuple(targets))
    pad = b.decoder_segment_ids[row] == 0
    assert (
        not b.decoder_loss_weights[row][pad].any() and not b.decoder_target_tokens[row][pad].any()
    )
    assert not b.encoder_input_tokens[row][b.encoder_segment_ids[row] == 0].any()
    return out


@pytest.mark.slow
def test_packed_one_epoch_eval_on_two_hosts_pairs_every_example_once(t5_task):
    """Rows of 48 + 24 tokens hold 2 pairs (18-20 + 9-12 tokens each): 3 rows a host."""
    lengths = {"inputs": 48, "targets": 24}
    inputs = [
        make(
            t5_task,
            feature_converter_pack=True,
            task_feature_lengths=lengths,
            num_infeed_hosts=2,
            infeed_host_index=h,
        )
        for h in (0, 1)
    ]
    assert inputs[0].shard_example_counts() == (3, 3)  # 6 and 5 pairs, two a row.
    passes = [read_all(inp) for inp in inputs]
    assert len(passes[0]) == len(passes[1]) == 1
    got = []
    for b in passes[0] + passes[1]:
        assert sorted(b) == PACKED_KEYS
        assert b.encoder_segment_ids.shape == (4, 48) and b.decoder_segment_ids.shape == (4, 24)
        assert all(v.dtype == np.int32 for k, v in b.items() if k != "decoder_loss_weights")
        for row in range(4):
            got += segments(b, row).values()
    assert [len(segments(b, 0)) for b in passes[0] + passes[1]] == [2, 2]  # Packed.
    want = [(tuple(tokens(q, 48)), tuple(tokens(a, 24))) for q, a in PAIRS]
    assert collections.Counter(got) == collections.Counter(want)


def test_decode_batches_prompt_with_the_inputs(t5_task):
    inp = make(t5_task, decode_form=DecodeForm.INPUTS_TARGETS)
    batches = read_all(inp)
    rows = []
    for b in batches:
        assert sorted(b) == ["input_ids", "input_lengths", "target_ids", "target_lengths"]
        assert b.input_ids.shape == (4, 16) and b.target_ids.shape == (4, 8)
        assert all(v.dtype == np.int32 for v in b.values())
        for ids, n, target, m in zip(*b.values(), strict=True):
            if n:
                assert not ids[n:].any() and not target[m:].any()  # Right-padded with 0.
                rows.append((ids[:n].tolist(), target[:m].tolist()))
    assert rows == [(tokens(q, 16), tokens(a, 8)) for q, a in PAIRS]  # No start token.
    assert batches[-1].input_lengths.tolist() == [len(r[0]) for r in rows[8:]] + [0]
    assert inp.ids_to_strings(batches[0].input_ids[:1]) == [PAIRS[0][0][:15]]
    assert inp.postprocess("it is 0.", example={}, is_target=True) == "it is 0."
    assert inp.shard_example_counts() == (11,)


@pytest.mark.parametrize(
    "settings, match",
    [
        (
            dict(prefix_lm=True),
            "encoder_decoder reads 'inputs' in the encoder; set prefix_lm=False",
        ),
        (
            dict(decode_form=DecodeForm.TARGETS_PREFIX, prompt_len=3),
            "set decode_form=DecodeForm.INPUTS_TARGETS",
        ),
        (dict(task_feature_lengths={"targets": 8}), "positive 'inputs'.*and 'targets'"),
        (dict(task_feature_lengths={"inputs": 0, "targets": 8}), "positive 'inputs'"),
        (dict(task_feature_lengths={**LENGTHS, "other": 4}), "'targets' \\(the decoder's\\)"),
    ],
    ids=["prefix-lm", "targets-prefix", "no-inputs-length", "zero-length", "extra-length"],
)
def test_settings_are_checked(t5_task, settings, match):
    with pytest.raises(InputConfigError, match=match):
        make(t5_task, **settings)


def test_tasks_are_checked(pattern, tmp_path):
    lm_task = _register("seq2seq_lm", pattern, {"targets": seqio.Feature(BYTES)})
    with pytest.raises(InputConfigError, match="has only \\['targets'\\]; give it both"):
        make(lm_task)
    hf = seqio.Feature(seqio_tasks.HfVocabulary(str(tmp_path)))  # Never read: refused first.
    hf_task = _register("seq2seq_hf", pattern, {"inputs": hf, "targets": hf})
    with pytest.raises(
        InputConfigError, match="need id 0 as padding; register the task with a SentencePiece"
    ):
        make(hf_task)


def test_prompt_completion_jsonl_with_inputs_eos(tmp_path):
    """register_prompt_completion_task(inputs_eos=True): packed T5 batches of the records;
    without inputs_eos, no EOS after the inputs and an empty prompt is no decode example."""
    records = [{"inputs": q, "targets": a} for q, a in PAIRS[:5]] + [{"inputs": "", "targets": "x"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    fields = dict(prompt_field="inputs", completion_field="targets", shuffle_buffer_size=8)

    def register(inputs_eos: bool) -> str:
        register_prompt_completion_task(
            "seq2seq_jsonl", train_path=str(path), inputs_eos=inputs_eos, **fields
        )
        return "seq2seq_jsonl"

    inp = make(
        register(True),
        split_name="train",
        batch_size=2,
        task_feature_lengths={"inputs": 40, "targets": 16},
        feature_converter_pack=True,
    )
    got = [pair for b in read_all(inp) for row in range(2) for pair in segments(b, row).values()]
    want = [(tuple(tokens(r["inputs"], 40)), tuple(tokens(r["targets"], 16))) for r in records]
    assert collections.Counter(got) == collections.Counter(want)
    decode = make(register(False), split_name="train", decode_form=DecodeForm.INPUTS_TARGETS)
    prompts = [
        ids[:n].tolist()
        for b in read_all(decode)
        for ids, n in zip(b.input_ids, b.input_lengths, strict=True)
        if n
    ]
    assert prompts == [BYTES.encode(q)[:16] for q, _ in PAIRS[:5]]  # No EOS; "" skipped.
    assert decode.shard_example_counts() == (5,)
    # A decoder-only LM's prompt is BOS + "": counted apart (encoder_decoder is in the key).
    lm = make(
        "seq2seq_jsonl",
        split_name="train",
        decode_form=DecodeForm.INPUTS_TARGETS,
        encoder_decoder=False,
    )
    assert lm.shard_example_counts() == (6,)
