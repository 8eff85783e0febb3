"""Builds two tiny randomly initialised Hugging Face ``T5ForConditionalGeneration`` models (a
Flan-T5 / T5 1.1 style one and a T5 1.0 style one) with the real ``transformers`` (PyTorch) and
stores each, with its SentencePiece tokenizer and its outputs, as a test fixture that paxlite's
JAX loaders read without torch.

Runs in the venv of make_venv.sh, by hand (never by CI), from the repository root:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_t5_fixtures.py tests/fixtures/hf
    /tmp/hf-venv/bin/python tools/hf_fixtures/make_t5_fixtures.py tests/fixtures/hf --only t5_flan

Writes, per fixture (``T5_FIXTURES``), ``<out>/<name>/``: what ``save_pretrained`` writes for the
model (config.json, generation_config.json, model.safetensors) and for its tokenizer
(tokenizer.json, tokenizer_config.json), plus ``spiece.model`` (the SentencePiece model trained
here) and ``special_tokens_map.json``, which transformers 5 does not write but T5's hub repos
hold, and

- ``outputs.npz``: ``input_ids [2, S]`` int32 (two texts with their EOS, the shorter padded with
  0) and ``attention_mask [2, S]`` int32; ``labels [2, T]`` int32 (two targets with EOS, padded
  with 0), ``decoder_input_ids [2, T]`` int32 (labels shifted right behind the decoder start
  token 0) and ``decoder_mask [2, T]`` int32 (1 where labels is not padding); ``logits [2, T, V]``
  float32 (``model(input_ids, attention_mask, decoder_input_ids).logits``, eval, no grad; no
  decoder mask is passed: only causal) and ``encoder_out [2, S, D]`` float32 (the encoder's last
  hidden state); ``greedy_0``/``greedy_1`` [<= 8] int32, the new tokens of
  ``generate(input_ids[i:i+1], attention_mask[i:i+1], do_sample=False, num_beams=1,
  max_new_tokens=8)`` without the decoder start token that generate puts first (shorter when it
  stopped at EOS);
- ``tokenizer_cases.json``: as make_fixtures.py's (``{"cases": [{"text", "ids",
  "ids_no_special", "decoded", "sentencepiece_ids_no_special"}...], "special": {...}}``).

Checks a directory that something else saved (e.g. paxlite's HF export) against a fixture:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_t5_fixtures.py --check DIR NAME

loads DIR with ``AutoModelForSeq2SeqLM``/``AutoTokenizer`` and compares its logits and encoder
output (each within 1e-4 of the fixture's scale), greedy tokens and tokenizer cases with fixture
NAME; exits 1 on a mismatch. What ``paxlite-tiny-model --family=t5`` (or flan-t5) wrote:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_t5_fixtures.py --check-tiny DIR

loads DIR as transformers does and checks it (``check_tiny``; README.md, "Tiny models").
"""

import contextlib
import copy
import dataclasses
import io
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
from collections.abc import Callable

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from make_fixtures import (  # noqa: E402
    CORPUS,
    MIN_GREEDY_GAP,
    MUST_MATTER,
    NEW_TOKENS,
    TINY_NEW_TOKENS,
    TOKENIZER_TEXTS,
    TOLERANCE,
    check_tiny_loading,
    check_tiny_tokenizer,
    check_tokenizer,
    run_cli,
    tokenizer_cases,
    verdict,
)
from sentencepiece import sentencepiece_model_pb2  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, T5Config  # noqa: E402

PIECES = 150  # SentencePiece pieces (pad, eos, unk included); T5's spiece.model has 32000.
EXTRA_IDS = 100  # <extra_id_99> .. <extra_id_0> at ids PIECES .. PIECES + 99, as T5's.
# config.json's vocab_size: the tokenizer's 250 rounded up to a multiple of 128, as T5 rounds
# 32100 up to 32128; the last 6 embedding rows have no token.
VOCAB_SIZE = 256
PAD, EOS, UNK = 0, 1, 2  # T5's; the decoder start token is PAD; there is no BOS.
NORM_STD = 0.1  # every T5LayerNorm weight: 1 + NORM_STD * N(0, 1).
REL_BIAS_SCALE = 5.0  # relative_attention_bias: transformers' N(0, 1/d_model) times this.
PADDED_ROW_TOLERANCE = 1e-5  # the padded row's outputs vs. the same row alone, unpadded.
MIN_DISTINCT = 4  # distinct tokens in each greedy decode (a random T5 easily repeats one).

# SentencePiece normalization rules, a few of those of T5's nmt_nfkc (NFKC, and whitespace and
# controls to a space): enough for a Precompiled normalizer in tokenizer.json as T5's has, without
# nmt_nfkc's 240 KB charsmap. "source code points <TAB> target code points", in hex.
NORMALIZATION_RULES = (
    [("9", "20"), ("A", "20"), ("D", "20"), ("A0", "20"), ("3000", "20"), ("FB01", "66 69")]
    # Fullwidth ASCII (FF01-FF5E) to ASCII.
    + [(f"{0xFF01 + i:X}", f"{0x21 + i:X}") for i in range(0x5E)]
)

# outputs.npz's rows: encoder inputs (32 and 22 tokens: row 1 is padded) and decoder targets (23
# and 6: row 0 is longer than 17 tokens, so that the decoder's relative positions reach its
# log-spaced buckets, 16 and beyond; row 1 is padded).
INPUT_TEXTS = (
    "summarize: The train leaves the station at 7:15 every morning.",
    "summarize: The river runs past the old mill.",
)
TARGET_TEXTS = (
    "The train stops at the small halt by the forest.",
    "The old mill.",
)
# tokenizer_cases.json: make_fixtures' texts and T5's own: sentinels and EOS in the text, and
# characters that the normalizer maps (fullwidth, a ligature, an ideographic space).
T5_TOKENIZER_TEXTS = TOKENIZER_TEXTS + (
    "<extra_id_0> the old mill <extra_id_1> forty years.</s>",
    "Ｈｅｌｌｏ！ the ﬁne\u3000train",
)


@dataclasses.dataclass(frozen=True)
class T5Fixture:
    """One fixture.

    Attributes:
      name: its directory name.
      seed: torch's seed for the weights; chosen so that no greedy step is a near tie (top-2 gap
        >= MIN_GREEDY_GAP), no greedy token is past the tokenizer, each decode has MIN_DISTINCT
        tokens and the two decodes differ from their first token.
      config: T5Config's kwargs.
      untied: lm_head gets its own weights (transformers 5 ties it to ``shared`` at
        construction whatever tie_word_embeddings says).
      scales: (regular expression, factor): parameters whose names match are multiplied by
        factor after transformers initialised them (the patterns do not overlap).
    """

    name: str
    seed: int
    config: dict
    untied: bool
    scales: tuple[tuple[str, float], ...] = ()


TINY_T5 = dict(
    vocab_size=VOCAB_SIZE,
    d_model=32,
    d_kv=8,
    num_heads=4,
    d_ff=48,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    dropout_rate=0.0,
    layer_norm_epsilon=1e-6,
    decoder_start_token_id=PAD,
    pad_token_id=PAD,
    eos_token_id=EOS,
)

T5_FIXTURES = (
    # T5 1.1 / Flan-T5: gated GELU (tanh approximation: transformers maps "gated-gelu" to
    # gelu_new), untied lm_head, no d_model**-0.5 before it, more encoder than decoder layers.
    T5Fixture(
        name="t5_flan",
        seed=6,
        config=dict(
            TINY_T5,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            num_layers=3,
            num_decoder_layers=2,
        ),
        untied=True,
        # A sharper cross-attention: the decodes of the two rows differ from the first token.
        scales=((r"decoder\.block\.\d+\.layer\.1\.EncDecAttention\.q\.weight", 3.0),),
    ),
    # T5 1.0: ReLU, lm_head = shared, decoder output times d_model**-0.5 before it. With tied
    # embeddings (N(0, 1)) the residual stream is mostly the decoder's input token and every
    # greedy decode repeats one token; the decoder's layers write more to it here (and its
    # cross-attention is sharper), so that the decodes follow the input and vary.
    T5Fixture(
        name="t5_v1_0",
        seed=12,
        config=dict(
            TINY_T5,
            feed_forward_proj="relu",
            tie_word_embeddings=True,
            num_layers=2,
            num_decoder_layers=2,
        ),
        untied=False,
        scales=(
            (r"decoder\.block\.\d+\.layer\.0\.SelfAttention\.o\.weight", 3.0),
            (r"decoder\.block\.\d+\.layer\.1\.EncDecAttention\.q\.weight", 3.0),
            (r"decoder\.block\.\d+\.layer\.1\.EncDecAttention\.o\.weight", 2.0),
            (r"decoder\.block\.\d+\.layer\.2\.DenseReluDense\.wo\.weight", 20.0),
        ),
    ),
)


# --- tokenizer ------------------------------------------------------------------------------


def train_spiece(work: pathlib.Path) -> bytes:
    """A T5-style SentencePiece unigram model of PIECES pieces trained on CORPUS: <pad> </s>
    <unk> at 0 1 2, no BOS, a dummy "▁" prefix, extra whitespace removed, NORMALIZATION_RULES."""
    rules = work / "rules.tsv"
    rules.write_text("".join(f"{src}\t{dst}\n" for src, dst in NORMALIZATION_RULES))
    model = io.BytesIO()  # Not model_prefix: the proto would record paths of this run.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=model,
        vocab_size=PIECES,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=PAD,
        eos_id=EOS,
        unk_id=UNK,
        bos_id=-1,
        normalization_rule_tsv=str(rules),
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    # The proto records the rules file's path (normalizer_spec.normalization_rule_tsv, only
    # informative): cleared, so that the output does not depend on where this ran.
    spec = sentencepiece_model_pb2.ModelProto()
    spec.ParseFromString(model.getvalue())
    assert spec.normalizer_spec.name == "user_defined", spec.normalizer_spec.name
    spec.normalizer_spec.ClearField("normalization_rule_tsv")
    proto = spec.SerializeToString()
    assert str(work).encode() not in proto
    processor = spm.SentencePieceProcessor(model_proto=proto)
    assert processor.get_piece_size() == PIECES, processor.get_piece_size()
    return proto


def make_tokenizer(work: pathlib.Path) -> transformers.PreTrainedTokenizerBase:
    """Trains spiece.model into ``work`` and loads it as transformers does (T5Tokenizer, built on
    tokenizers: a Unigram model, the charsmap as a Precompiled normalizer, WhitespaceSplit and
    Metaspace, ``$A </s>``), with EXTRA_IDS sentinels."""
    source = work / "source"
    source.mkdir()
    (source / "spiece.model").write_bytes(train_spiece(work))
    tokenizer = transformers.T5Tokenizer.from_pretrained(str(source), extra_ids=EXTRA_IDS)
    # The path it read would be recorded in tokenizer_config.json.
    tokenizer.init_kwargs.pop("vocab_file", None)
    assert len(tokenizer) == PIECES + EXTRA_IDS <= VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == PIECES + EXTRA_IDS - 1
    assert tokenizer.convert_tokens_to_ids(f"<extra_id_{EXTRA_IDS - 1}>") == PIECES
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        PAD,
        EOS,
        UNK,
    )
    assert tokenizer.bos_token_id is None
    return tokenizer


def save_tokenizer(
    tokenizer: transformers.PreTrainedTokenizerBase, out: pathlib.Path, work: pathlib.Path
) -> None:
    """save_pretrained (tokenizer.json, tokenizer_config.json), and spiece.model and
    special_tokens_map.json as T5's hub repos have them (transformers 5 writes neither)."""
    tokenizer.save_pretrained(str(out))
    shutil.copy(work / "source" / "spiece.model", out / "spiece.model")
    special = {
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "additional_special_tokens": [f"<extra_id_{i}>" for i in range(EXTRA_IDS)],
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def t5_tokenizer_cases(
    tokenizer: transformers.PreTrainedTokenizerBase, spiece: pathlib.Path
) -> dict:
    """make_fixtures' tokenizer cases for T5_TOKENIZER_TEXTS, each with the sentencepiece
    library's ids (``sentencepiece_ids_no_special``); asserts they equal transformers' on every
    text without special tokens in it (sentencepiece knows no <extra_id_N> and no </s> in text)."""
    cases = tokenizer_cases(tokenizer, T5_TOKENIZER_TEXTS)
    processor = spm.SentencePieceProcessor(model_file=str(spiece))
    for case in cases["cases"]:
        case["sentencepiece_ids_no_special"] = processor.encode(case["text"])
        if "<" not in case["text"]:
            assert case["sentencepiece_ids_no_special"] == case["ids_no_special"], case
    return cases


# --- model ----------------------------------------------------------------------------------


def new_model(config: T5Config) -> transformers.PreTrainedModel:
    """An eager-attention float32 T5ForConditionalGeneration of ``config`` (torch's RNG), eval."""
    model = transformers.T5ForConditionalGeneration._from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


def perturb(model: transformers.PreTrainedModel, fixture: T5Fixture) -> None:
    """Every T5LayerNorm weight (initialised to 1) to 1 + NORM_STD N(0, 1); relative_attention_bias
    times REL_BIAS_SCALE (transformers' std 1/sqrt(d_model) barely moves the scores); if
    fixture.untied, a new lm_head, N(0, 1/d_model) (logits of about the tied variant's scale);
    then fixture.scales.

    Asserts that every 1-D parameter is a norm's weight (none keeps its default).
    """
    generator = torch.Generator().manual_seed(fixture.seed + 1)
    touched = set()
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if type(module).__name__ == "T5LayerNorm":
                assert bool((module.weight == 1).all()), module_name
                noise = torch.randn(module.weight.shape, generator=generator)
                module.weight.copy_(1.0 + NORM_STD * noise)
                touched.add(f"{module_name}.weight")
            elif hasattr(module, "relative_attention_bias"):
                module.relative_attention_bias.weight.mul_(REL_BIAS_SCALE)
        if fixture.untied:
            assert model.lm_head.weight is model.shared.weight
            d_model = model.config.d_model
            weight = torch.randn(model.lm_head.weight.shape, generator=generator) * d_model**-0.5
            model.lm_head.weight = torch.nn.Parameter(weight)
        for pattern, factor in fixture.scales:
            matched = [p for n, p in model.named_parameters() if re.fullmatch(pattern, n)]
            assert matched, f"{fixture.name}: no parameter matches {pattern}"
            for param in matched:
                param.mul_(factor)
    assert (model.lm_head.weight is model.shared.weight) != fixture.untied
    untouched = [n for n, p in model.named_parameters() if p.ndim == 1 and n not in touched]
    assert not untouched, f"1-D parameters left at their default: {untouched}"


def build_model(fixture: T5Fixture) -> transformers.PreTrainedModel:
    """The fixture's model: random weights from its seed, then ``perturb``."""
    torch.manual_seed(fixture.seed)
    model = new_model(T5Config(**fixture.config))
    perturb(model, fixture)
    return model


@torch.no_grad()
def forward(model: transformers.PreTrainedModel, arrays: dict) -> tuple[np.ndarray, np.ndarray]:
    """(logits [B, T, V], encoder_out [B, S, D]) float32 of outputs.npz's inputs."""
    out = model(
        input_ids=torch.from_numpy(arrays["input_ids"]).long(),
        attention_mask=torch.from_numpy(arrays["attention_mask"]).long(),
        decoder_input_ids=torch.from_numpy(arrays["decoder_input_ids"]).long(),
    )
    return out.logits.float().numpy(), out.encoder_last_hidden_state.float().numpy()


def row(arrays: dict, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [1, S] of row i."""
    ids = torch.from_numpy(arrays["input_ids"][i : i + 1]).long()
    return ids, torch.from_numpy(arrays["attention_mask"][i : i + 1]).long()


@torch.no_grad()
def greedy(model: transformers.PreTrainedModel, arrays: dict, i: int) -> np.ndarray:
    """The new tokens [<= NEW_TOKENS] of greedy ``generate`` from row i, without the decoder
    start token that generate puts first."""
    ids, mask = row(arrays, i)
    out = model.generate(
        ids, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS
    )
    assert int(out[0, 0]) == model.config.decoder_start_token_id, out
    return out[0, 1:].numpy().astype(np.int32)


@torch.no_grad()
def greedy_without_cache(
    model: transformers.PreTrainedModel, arrays: dict, i: int
) -> tuple[np.ndarray, float]:
    """Greedy decoding of row i by full forward passes: (new tokens, min top-2 logit gap)."""
    ids, mask = row(arrays, i)
    tokens, gaps = [model.config.decoder_start_token_id], []
    for _ in range(NEW_TOKENS):
        decoder = torch.tensor([tokens])
        last = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder).logits[0, -1]
        top2 = np.sort(last.numpy())[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tokens.append(int(last.argmax()))
        if tokens[-1] == EOS:
            break
    return np.array(tokens[1:], np.int32), min(gaps)


def model_inputs(tokenizer: transformers.PreTrainedTokenizerBase) -> dict:
    """outputs.npz's input_ids, attention_mask, labels, decoder_input_ids, decoder_mask."""
    source = tokenizer(list(INPUT_TEXTS), padding=True, return_tensors="np")
    target = tokenizer(list(TARGET_TEXTS), padding=True, return_tensors="np")
    labels = target.input_ids.astype(np.int32)
    decoder_input_ids = np.full_like(labels, PAD)  # T5's _shift_right, start token PAD.
    decoder_input_ids[:, 1:] = labels[:, :-1]
    arrays = {
        "input_ids": source.input_ids.astype(np.int32),
        "attention_mask": source.attention_mask.astype(np.int32),
        "labels": labels,
        "decoder_input_ids": decoder_input_ids,
        "decoder_mask": target.attention_mask.astype(np.int32),
    }
    # Row 1 is padded on both sides, row 0 on neither; every row ends with EOS.
    assert arrays["attention_mask"][0].all() and not arrays["attention_mask"][1].all()
    assert arrays["decoder_mask"][0].all() and not arrays["decoder_mask"][1].all()
    # Relative positions reach the log-spaced buckets: 8 and beyond in the (bidirectional)
    # encoder, 16 and beyond in the (causal) decoder.
    assert arrays["input_ids"].shape[1] > 9 and labels.shape[1] > 17, (source, labels.shape)
    return arrays


def zero_far_buckets(stack: str, far: list[int]) -> Callable[[dict], None]:
    """A state-dict edit: ``stack``'s relative_attention_bias rows ``far`` (its log-spaced
    buckets) to 0."""

    def edit(state: dict) -> None:
        state[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"][far] = 0

    return edit


def ablations(fixture: T5Fixture) -> dict[str, tuple[dict, Callable[[dict], None] | None]]:
    """label -> (config overrides, state-dict edit): each must change the logits by more than
    MUST_MATTER of their scale (proves the fixture exercises it)."""
    found = {
        # Bidirectional: buckets 8-15 (keys 8+ before) and 24-31 (8+ after) are log-spaced.
        "encoder log-spaced buckets": (
            {},
            zero_far_buckets("encoder", [*range(8, 16), *range(24, 32)]),
        ),
        # Causal: buckets 16-31 (keys 16+ before).
        "decoder log-spaced buckets": ({}, zero_far_buckets("decoder", list(range(16, 32)))),
        "relative_attention_max_distance 64": ({"relative_attention_max_distance": 64}, None),
    }
    if fixture.untied:
        found["lm_head = shared"] = (
            {},
            lambda state: state["lm_head.weight"].copy_(state["shared.weight"]),
        )
    else:
        found["no d_model**-0.5 before lm_head"] = ({"tie_word_embeddings": False}, None)
    return found


def ablation_gaps(
    fixture: T5Fixture, model: transformers.PreTrainedModel, arrays: dict, logits: np.ndarray
) -> dict[str, float]:
    """Each ablation's max |logits change| / max |logits|, same weights otherwise."""
    gaps = {}
    scale = float(np.abs(logits).max())
    for label, (overrides, edit) in ablations(fixture).items():
        other = new_model(T5Config(**{**fixture.config, **overrides}))
        if fixture.untied:
            other.lm_head.weight = torch.nn.Parameter(torch.empty_like(other.lm_head.weight))
        state = {key: value.clone() for key, value in model.state_dict().items()}
        if edit is not None:
            edit(state)
        other.load_state_dict(state, strict=True)
        gaps[label] = float(np.abs(forward(other, arrays)[0] - logits).max()) / scale
        assert gaps[label] > MUST_MATTER, f"{fixture.name}: {label} changes logits by {gaps[label]}"
    return gaps


def exact_gelu_gap(model: transformers.PreTrainedModel, arrays: dict, logits: np.ndarray) -> float:
    """max |logits change| / max |logits| with exact GELU in place of gelu_new (gated only)."""
    other = copy.deepcopy(model)
    for module in other.modules():
        if type(module).__name__ == "T5DenseGatedActDense":
            module.act = torch.nn.GELU()
    return float(np.abs(forward(other, arrays)[0] - logits).max() / np.abs(logits).max())


def padded_row_gap(model: transformers.PreTrainedModel, arrays: dict, logits: np.ndarray) -> float:
    """Row 1 alone, unpadded (encoder and decoder), vs. its padded outputs at its real
    positions: max |diff| / max |logits|."""
    s, t = int(arrays["attention_mask"][1].sum()), int(arrays["decoder_mask"][1].sum())
    alone = {
        "input_ids": arrays["input_ids"][1:, :s],
        "attention_mask": arrays["attention_mask"][1:, :s],
        "decoder_input_ids": arrays["decoder_input_ids"][1:, :t],
    }
    return float(np.abs(forward(model, alone)[0][0] - logits[1, :t]).max() / np.abs(logits).max())


def greedy_outputs(
    model: transformers.PreTrainedModel, tokenizer, arrays: dict, name: str
) -> tuple[dict, float]:
    """outputs.npz's greedy_i, and the smallest top-2 gap; asserts that generate (with its
    cache) equals greedy decoding by full forward passes, that each decode is tokens of the
    tokenizer, at least MIN_DISTINCT of them, and that the two decodes differ from their first
    token (they follow the input)."""
    found, gaps = {}, []
    for i in range(2):
        new = greedy(model, arrays, i)
        reference, gap = greedy_without_cache(model, arrays, i)
        assert np.array_equal(new, reference), (name, new, reference)
        assert gap >= MIN_GREEDY_GAP, f"{name}: greedy top-2 gap {gap}: change its seed"
        assert new.max() < len(tokenizer), f"{name}: greedy {new} past the tokenizer"
        assert len(set(new.tolist())) >= MIN_DISTINCT, f"{name}: greedy {new} repeats itself"
        found[f"greedy_{i}"] = new
        gaps.append(gap)
    assert found["greedy_0"][0] != found["greedy_1"][0], (name, found)
    return found, min(gaps)


def write_fixture(fixture: T5Fixture, out_root: pathlib.Path) -> None:
    """Builds, checks and writes fixture ``out_root / fixture.name``; prints its summary."""
    out = out_root / fixture.name
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        work = pathlib.Path(scratch)
        tokenizer = make_tokenizer(work)
        model = build_model(fixture)
        model.save_pretrained(str(out), safe_serialization=True)
        save_tokenizer(tokenizer, out, work)
    for path in out.iterdir():  # transformers 5 writes its safetensors files 0600.
        path.chmod(0o644)
    arrays = model_inputs(tokenizer)
    logits, encoder_out = forward(model, arrays)
    greedy_arrays, gap = greedy_outputs(model, tokenizer, arrays, fixture.name)
    padded = padded_row_gap(model, arrays, logits)
    assert padded <= PADDED_ROW_TOLERANCE, f"{fixture.name}: padded row differs by {padded}"
    np.savez(out / "outputs.npz", logits=logits, encoder_out=encoder_out, **arrays, **greedy_arrays)
    cases = t5_tokenizer_cases(tokenizer, out / "spiece.model")
    (out / "tokenizer_cases.json").write_text(
        json.dumps(cases, indent=1, ensure_ascii=False) + "\n"
    )
    summary = {
        "params": sum(p.numel() for p in model.parameters()),
        "KB": round(sum(f.stat().st_size for f in out.iterdir()) / 1024),
        "S, T": (arrays["input_ids"].shape[1], arrays["labels"].shape[1]),
        "max |logit|": round(float(np.abs(logits).max()), 3),
        "min greedy top-2 gap": round(gap, 3),
        "greedy": [g.tolist() for g in greedy_arrays.values()],
        "padded row": f"{padded:.1e}",
        "relative change": {
            k: round(v, 4) for k, v in ablation_gaps(fixture, model, arrays, logits).items()
        },
    }
    if fixture.config["feed_forward_proj"].startswith("gated-gelu"):
        summary["exact GELU"] = f"{exact_gelu_gap(model, arrays, logits):.1e}"
    # What was written is what transformers reads back: the same logits and tokenizer cases.
    assert check(str(out), fixture.name, out_root, quiet=True), fixture.name
    print(fixture.name, ", ".join(f"{key}: {value}" for key, value in summary.items()), flush=True)


def make_all(out_dir: str, only: str | None = None) -> None:
    """Writes every fixture of T5_FIXTURES (only: those of a comma-separated list) under out_dir."""
    names = [fixture.name for fixture in T5_FIXTURES]
    wanted = names if only is None else [name.strip() for name in only.split(",")]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"--only: unknown fixtures {unknown}; known: {names}")
    out_root = pathlib.Path(out_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    for fixture in T5_FIXTURES:
        if fixture.name in wanted:
            write_fixture(fixture, out_root)


# --- --check --------------------------------------------------------------------------------


def compare(label: str, got: np.ndarray, want: np.ndarray, quiet: bool) -> bool:
    """max |got - want| / max |want| within TOLERANCE (and the same shape)."""
    if got.shape != want.shape:
        print(f"{label}: shape {got.shape} vs {want.shape}: MISMATCH")
        return False
    scale = float(np.abs(want).max())
    error = float(np.abs(got - want).max()) / scale
    ok = error <= TOLERANCE
    if not quiet or not ok:
        print(f"{label}: max |diff| / max |want| = {error:.2e} (scale {scale:.3f}): {verdict(ok)}")
    return ok


def check(model_dir: str, name: str, fixtures: pathlib.Path, quiet: bool = False) -> bool:
    """Loads model_dir as transformers does and compares it with fixture ``fixtures / name``."""
    fixture_dir = fixtures / name
    fixture = dict(np.load(fixture_dir / "outputs.npz"))
    expected = json.loads((fixture_dir / "tokenizer_cases.json").read_text())
    model = AutoModelForSeq2SeqLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    logits, encoder_out = forward(model, fixture)
    results = [
        compare("logits", logits, fixture["logits"], quiet),
        compare("encoder_out", encoder_out, fixture["encoder_out"], quiet),
    ]
    for i in range(2):
        new, want = greedy(model, fixture, i), fixture[f"greedy_{i}"]
        same = np.array_equal(new, want)
        if not quiet or not same:
            print(f"greedy_{i}: {new.tolist()} vs {want.tolist()}: {verdict(same)}")
        results.append(same)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed if quiet else sys.stdout):
        tokenizer_ok = check_tokenizer(tokenizer, expected)
    if not tokenizer_ok:
        print(printed.getvalue(), end="")
    results.append(tokenizer_ok)
    return all(results)


@torch.no_grad()
def check_tiny(model_dir: str) -> bool:
    """``--check-tiny DIR``: a T5 that paxlite-tiny-model wrote, as transformers loads it
    (make_fixtures' check_tiny_loading; its check_tiny_tokenizer against spiece.model read by
    the sentencepiece library, with T5's EOS after the text), and a greedy generate of
    TINY_NEW_TOKENS tokens runs."""
    model, ok = check_tiny_loading(AutoModelForSeq2SeqLM, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    processor = spm.SentencePieceProcessor(model_file=str(pathlib.Path(model_dir) / "spiece.model"))

    def reference(text: str) -> list[int]:
        return [*processor.encode(text), processor.eos_id()]

    ok &= check_tiny_tokenizer(tokenizer, reference, model_dir)
    inputs = tokenizer(TOKENIZER_TEXTS[0], return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=TINY_NEW_TOKENS)
    print(f"generate: {out[0].tolist()}")
    return ok


def main() -> None:
    run_cli(__doc__, check, make_all, check_tiny)


if __name__ == "__main__":
    main()
