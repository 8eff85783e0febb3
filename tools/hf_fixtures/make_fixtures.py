"""Builds tiny randomly initialised Hugging Face causal LMs (Llama 2, Llama 3, Mistral, Qwen2,
Qwen3, Gemma, Gemma 2, GPT-2, and the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE) with the
real ``transformers`` (PyTorch) and stores each, with its tokenizer and its outputs, as a test
fixture that paxlite's JAX loaders read without torch.

Runs in the venv of make_venv.sh, by hand (never by CI), from the repository root:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_fixtures.py tests/fixtures/hf
    /tmp/hf-venv/bin/python tools/hf_fixtures/make_fixtures.py tests/fixtures/hf --only gemma,gpt2

Writes, per family (``FAMILIES``), ``<out>/<name>/``: what ``save_pretrained`` writes for the
model (config.json, generation_config.json, model.safetensors or shards + index) and for its
tokenizer (tokenizer.json, tokenizer_config.json; Llama 2, Mixtral, Gemma and Gemma 2 also
tokenizer.model and special_tokens_map.json), plus

- ``outputs.npz``: ``ids [2, T]`` int32 (two texts, no padding), ``logits [2, T, V]`` float32
  (``model(ids).logits``, eval, no grad), ``prompt_0``/``prompt_1`` [P_i] int32 and
  ``greedy_0``/``greedy_1`` [<= 8] int32, the new tokens of ``generate(prompt[None],
  do_sample=False, max_new_tokens=8)`` (shorter when it stopped at an EOS);
- ``tokenizer_cases.json``: ``{"cases": [{"text", "ids", "ids_no_special", "decoded"}...],
  "special": {"bos_token_id", "eos_token_id", "pad_token_id"}}``;
- families with a chat template (Qwen2 and Qwen2-MoE: ChatML; Llama 3: its headers; written
  here): the template in ``chat_template.jinja`` (where transformers 5's save_pretrained puts it;
  not in tokenizer_config.json), and ``chat_cases.json``: ``{"cases": [{"messages", "rendered",
  "rendered_with_prompt", "ids"}...]}``, apply_chat_template's text (without and with
  add_generation_prompt) and ids for CHAT_CONVERSATIONS. No assistant mask: transformers gives
  one only for templates with ``{% generation %}`` markers, which these lack.

Asserts, per family: generate equals greedy decoding by full forward passes, no greedy step is a
near tie (MIN_GREEDY_GAP), each must_matter ablation moves the logits (MUST_MATTER), a float64
copy gives the same logits (FLOAT64_TOLERANCE); for a mixture of experts (computed with eager
experts), no token of those forwards is near a routing tie (MIN_ROUTER_MARGIN).

Checks a directory that something else saved (e.g. paxlite's HF export) against a fixture:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_fixtures.py --check DIR NAME

loads DIR with ``AutoModelForCausalLM``/``AutoTokenizer`` and compares its logits (within 1e-4 of
the fixture's logit scale), greedy tokens, tokenizer cases and chat cases (where it has them)
with fixture NAME; exits 1 on a mismatch. What ``paxlite-tiny-model`` wrote (a causal LM):

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_fixtures.py --check-tiny DIR

loads DIR as transformers does and checks it (``check_tiny``; README.md, "Tiny models").
"""

import argparse
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
from collections.abc import Callable, Iterator

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import sentencepiece as spm  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import decoders, normalizers, pre_tokenizers, processors  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hf"
SEQ_LEN = 16  # T of outputs.npz's ids and logits.
NEW_TOKENS = 8  # max_new_tokens of the greedy decodes.
TOLERANCE = 1e-4  # --check: max |logits - fixture| / max |fixture logits|.
MUST_MATTER = 1e-2  # an ablation (Family.must_matter) must move the logits by this, relatively.
MIN_GREEDY_GAP = 0.02  # top-1 minus top-2 logit at every greedy step (Family.seed is chosen so).
# MoE: the k-th minus the (k+1)-th router probability, at every MoE layer and token of every
# recorded forward (Family.seed is chosen so): a float32 implementation elsewhere routes alike.
MIN_ROUTER_MARGIN = 1e-3
FLOAT64_TOLERANCE = 1e-5  # max |float64 logits - float32 logits| / max |logit|.

# The training text of every tokenizer (about 4 KB), written for this script.
CORPUS = """\
The river runs past the old mill, and the mill has not turned its wheel for forty years.
Children still come down to the water in the summer. They throw stones, they shout, and they
count the rings that spread across the surface: one, two, three, four! Their parents sit on the
bank and talk about the weather, the price of bread, and the train that is always late.

The train leaves the station at 7:15 every morning. It stops at Ashford, at Millbrook and at
the small halt by the forest, where nobody ever gets on. The driver waves to the farmer, and
the farmer waves back. On Sundays the train does not run at all, and the line is quiet.

Baking bread is simple if you are patient. Mix 500 grams of flour with 10 grams of salt, 7 grams
of yeast and 350 grams of warm water. Knead the dough for ten minutes, then let it rest for an
hour. Shape it, let it rise again, and bake it in a hot oven for thirty-five minutes. The crust
should be dark and the loaf should sound hollow when you tap it underneath.

What makes a good story? Some say it is the characters; others say it is the plot. A good story
has a beginning, a middle and an end, but not always in that order. The best stories leave
something for the reader to imagine. They ask questions and do not answer all of them!

The weather changed quickly that afternoon. The sky was blue at noon, grey at two, and black by
four. The wind came first, then the rain, then the thunder. People ran for the doorways and the
shops. The cat on the wall did not move: it watched the storm with calm yellow eyes.

In the library there are books about the sea, about the stars and about the history of the
town. The librarian knows every shelf. Ask her for a book on ships, and she will find three.
Ask her for a book on the moon, and she will find five, and a map of the night sky as well.

Numbers are everywhere: 12 eggs in a box, 24 hours in a day, 365 days in a year, and 1000 metres
in a kilometre. The clock on the tower says 3:45, but it has said 3:45 since the winter of 1987.
Hello, world! Hello again, world! Goodbye, world!

The market opens early on Saturday. There are apples and pears, cheese and honey, fresh fish
and warm bread. The man who sells honey talks about his bees as if they were his children. The
woman who sells cheese gives everyone a small piece to taste, and nobody leaves with nothing.

At night the town is quiet. The lights go out one by one, and the river keeps running past the
mill. Tomorrow the train will be late again, the children will throw their stones, and the
clock on the tower will still say a quarter to four.
"""

# outputs.npz's ids: each text gives the first SEQ_LEN tokens of one row.
LOGIT_TEXTS = (
    "Hello, world! The river runs past the old mill, and the children count the rings.",
    "Mix 500 grams of flour with salt and yeast, then bake the loaf for an hour or more!",
)
PROMPT_TEXTS = ("The train leaves the", "Ask her for a book on ships, and she will")
TOKENIZER_TEXTS = (
    "Hello world! How are you today?",
    "!",
    "naïve café — 日本語 🙂 Ωmega",
    "  two leading spaces, digits 1234567,\ttabs and\nnew lines.",
    "The quick brown fox jumps over the lazy dog.",
)
# chat_cases.json's conversations (families with a chat template): multi-turn with a system
# message, multi-turn without one (the template's default, if any), a lone user turn.
CHAT_CONVERSATIONS = (
    [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Hello! How many days are in a year?"},
        {"role": "assistant", "content": "There are 365 days in a year."},
        {"role": "user", "content": "Et « jour » en japonais ? 日本語で"},
        {"role": "assistant", "content": "日 (hi) — naïve café 🙂"},
    ],
    [
        {"role": "user", "content": "When does the train leave?"},
        {"role": "assistant", "content": "At 7:15 every morning."},
        {"role": "user", "content": "And on Sundays?"},
        {"role": "assistant", "content": "It does not run at all!"},
    ],
    [{"role": "user", "content": "Ωmega: the last letter?"}],
)

# A Llama 3 style pre-tokenizer pattern (Qwen2 splits digits one by one: DIGITS="\\p{N}").
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|DIGITS"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclasses.dataclass(frozen=True)
class ByteLevelSpec:
    """A byte-level BPE tokenizer trained on CORPUS.

    Attributes:
      vocab_size: the tokenizer's size, special tokens included (<= the model's vocab_size).
      specials_first: special tokens at ids 0.. (Mistral's <unk> <s> </s>); else appended after
        the BPE vocabulary (Llama 3, Qwen), which puts the byte "!" at id 0.
      special_tokens: all special tokens, in id order.
      bos, eos, pad, unk: the tokenizer's named special tokens (None: it has none).
      add_bos: the post-processor prepends bos.
      digits: the split pattern's digit group (None: GPT-2's ByteLevel regex, no Split).
      nfc: an NFC normalizer (Qwen).
      chat_template: the tokenizer's chat template (Jinja; None: none); save_pretrained writes it
        to chat_template.jinja, and chat_cases.json holds what transformers renders with it.
    """

    vocab_size: int
    special_tokens: tuple[str, ...]
    specials_first: bool
    bos: str | None
    eos: str
    pad: str | None
    unk: str | None = None
    add_bos: bool = True
    digits: str | None = r"\p{N}{1,3}"
    nfc: bool = False
    chat_template: str | None = None


@dataclasses.dataclass(frozen=True)
class SentencePieceSpec:
    """A SentencePiece BPE (byte_fallback, digits split) trained on CORPUS.

    Attributes:
      vocab_size: the tokenizer's size.
      specials: (role, piece) at ids 0, 1, ...; role is SentencePiece's unk, bos, eos or pad.
        Llama 2: <unk> <s> </s>; Gemma: <pad> <eos> <bos> <unk>.
      user_symbols: user-defined pieces right after the specials (Gemma: <mask>, then the turn
        markers <start_of_turn> <end_of_turn>).
      additional_special_tokens: special_tokens_map.json's additional_special_tokens.
      add_dummy_prefix: a "▁" before the text (Llama 2; not Gemma).
      tokenizer_class: the transformers class (by name) that converts tokenizer.model; it adds BOS.
    """

    vocab_size: int
    specials: tuple[tuple[str, str], ...] = (("unk", "<unk>"), ("bos", "<s>"), ("eos", "</s>"))
    user_symbols: tuple[str, ...] = ()
    additional_special_tokens: tuple[str, ...] = ()
    add_dummy_prefix: bool = True
    tokenizer_class: str = "LlamaTokenizer"


# A must_matter ablation that is no config switch: edits (in place) a copy of the model.
Ablation = Callable[[transformers.PreTrainedModel], None]


@dataclasses.dataclass(frozen=True)
class Family:
    """One fixture: a transformers config and the tokenizer that goes with it.

    Attributes:
      name: the fixture's directory name.
      seed: torch's seed for the weights; chosen so that no greedy step is a near tie.
      config_class: the transformers config class, by name (``"LlamaConfig"``).
      config: its kwargs, less the special token ids (``bos_token_id``, ``eos_token_id``,
        ``pad_token_id``), which come from the tokenizer.
      tokenizer: how to build the tokenizer.
      generation_eos: tokens whose ids become generation_config's (and config's) eos_token_id
        list; None: the tokenizer's eos id.
      must_matter: ablations (by label) that must change the logits: proves the fixture
        exercises that feature (e.g. a sliding window shorter than the sequence). Each is config
        overrides (the same weights; an MoE layer that ``mlp_only_layers`` makes dense, or the
        reverse, gets fresh weights) or an edit of a copy of the model (``Ablation``).
      max_shard_size: save_pretrained's shard size (None: one model.safetensors).
    """

    name: str
    seed: int
    config_class: str
    config: dict
    tokenizer: ByteLevelSpec | SentencePieceSpec
    generation_eos: tuple[str, ...] | None = None
    must_matter: dict[str, dict | Ablation] = dataclasses.field(default_factory=dict)
    max_shard_size: str | None = None


TINY = dict(
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.1,
)
# The header markers come first so that the other four keep ids 316-319 (appended after the
# BPE vocabulary, which is 2 merges shorter for them).
LLAMA3_TOKENS = (
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)
QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Chat templates written for this script (rendered with trim_blocks and lstrip_blocks, as
# transformers renders them). ChatML, as Qwen's: a default system message when none is given.
QWEN_CHAT_TEMPLATE = """\
{% if not messages or messages[0]['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{% for message in messages %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""
# Llama 3's headers: BOS, then per message a header, a blank line, the trimmed content and
# <|eot_id|>, with no newline between messages.
LLAMA3_CHAT_TEMPLATE = """\
{{- bos_token }}
{%- for message in messages %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{%- endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}
"""
# Gemma's SentencePiece layout: <pad> <eos> <bos> <unk> <mask> at 0-4 (as in Google's
# tokenizer.model), then the turn markers (106 and 107 there), no dummy prefix.
GEMMA_TOKENIZER = SentencePieceSpec(
    vocab_size=352,
    specials=(("pad", "<pad>"), ("eos", "<eos>"), ("bos", "<bos>"), ("unk", "<unk>")),
    user_symbols=("<mask>", "<start_of_turn>", "<end_of_turn>"),
    additional_special_tokens=("<start_of_turn>", "<end_of_turn>"),
    add_dummy_prefix=False,
    tokenizer_class="GemmaTokenizer",
)

# Qwen's byte-level BPE: fewer tokens than embedding rows, as the real Qwen checkpoints have.
QWEN2_TOKENIZER = ByteLevelSpec(
    vocab_size=312,
    special_tokens=QWEN_TOKENS,
    specials_first=False,
    bos=None,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    add_bos=False,
    digits=r"\p{N}",
    nfc=True,
    chat_template=QWEN_CHAT_TEMPLATE,
)
QWEN3_TOKENIZER = dataclasses.replace(QWEN2_TOKENIZER, eos="<|im_end|>", chat_template=None)
QWEN3_EOS = ("<|im_end|>", "<|endoftext|>")


# transformers 5's MoE routers (MixtralTopKRouter, Qwen2MoeTopKRouter, Qwen3MoeTopKRouter) map
# hidden [N, D] to (router_logits [N, E], top-k weights [N, k], top-k expert ids [N, k]).
def is_router(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an MoE router (a ``*TopKRouter``, with its k as ``top_k``)."""
    return type(module).__name__.endswith("TopKRouter")


def without_top_k_renormalisation(model: transformers.PreTrainedModel) -> None:
    """An Ablation: each router's top-k weights become the softmax probabilities themselves, not
    divided by their sum (Mixtral always divides; MixtralConfig has no switch for it)."""

    def hook(module, args, output):
        logits, _, experts = output
        return logits, torch.softmax(logits.float(), dim=-1).gather(-1, experts), experts

    routers = [module for module in model.modules() if is_router(module)]
    assert routers, "no router"
    for module in routers:
        module.register_forward_hook(hook)


def zero_shared_expert_gates(model: transformers.PreTrainedModel) -> None:
    """An Ablation: every ``shared_expert_gate`` weight to 0 (Qwen2-MoE scales its shared expert's
    output by sigmoid(x . w); with w = 0, by 1/2)."""
    gates = [p for n, p in model.named_parameters() if n.endswith("shared_expert_gate.weight")]
    assert gates, "no shared_expert_gate"
    with torch.no_grad():
        for gate in gates:
            gate.zero_()


FAMILIES = (
    Family(
        name="llama2",
        seed=5,
        config_class="LlamaConfig",
        config=dict(
            TINY,
            vocab_size=352,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=SentencePieceSpec(vocab_size=352),
    ),
    Family(
        name="llama3",
        seed=8,
        config_class="LlamaConfig",
        config=dict(
            TINY,
            vocab_size=320,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            },
            tie_word_embeddings=False,
        ),
        tokenizer=ByteLevelSpec(
            vocab_size=320,
            special_tokens=LLAMA3_TOKENS,
            specials_first=False,
            bos="<|begin_of_text|>",
            eos="<|end_of_text|>",
            pad="<|finetune_right_pad_id|>",
            chat_template=LLAMA3_CHAT_TEMPLATE,
        ),
        generation_eos=("<|eot_id|>", "<|end_of_text|>"),
        must_matter={
            "no rope scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
        },
    ),
    Family(
        name="mistral",
        seed=10,
        config_class="MistralConfig",
        config=dict(
            TINY,
            vocab_size=320,
            head_dim=24,
            sliding_window=4,
            rms_norm_eps=1e-3,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=ByteLevelSpec(
            vocab_size=320,
            special_tokens=("<unk>", "<s>", "</s>"),
            specials_first=True,
            bos="<s>",
            eos="</s>",
            pad=None,
            unk="<unk>",
            digits=None,
        ),
        must_matter={
            "no sliding window": {"sliding_window": None},
            "rms_norm_eps=1e-6": {"rms_norm_eps": 1e-6},
        },
    ),
    Family(
        name="qwen2",
        seed=3,
        config_class="Qwen2Config",
        config=dict(
            TINY,
            vocab_size=320,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
        ),
        tokenizer=QWEN2_TOKENIZER,
    ),
    Family(
        name="qwen3",
        seed=4,
        config_class="Qwen3Config",
        config=dict(
            TINY,
            vocab_size=320,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=QWEN3_TOKENIZER,
        generation_eos=QWEN3_EOS,
        max_shard_size="200KB",
    ),
    Family(
        name="gemma",
        seed=7,
        config_class="GemmaConfig",
        config=dict(
            TINY,
            # Tied embeddings scaled by sqrt(64) = 8: at 0.1 the residual stream is mostly the
            # input's embedding and every greedy decode repeats the prompt's last token.
            initializer_range=0.3,
            vocab_size=352,
            head_dim=32,
            hidden_act="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
        ),
        tokenizer=GEMMA_TOKENIZER,
    ),
    Family(
        name="gemma2",
        seed=6,
        config_class="Gemma2Config",
        config=dict(
            TINY,
            # The post-norms hold each block's output near RMS 1, so the scaled tied embedding
            # must be small (not 0.3 as Gemma's) for the layers, not the input, to decide.
            initializer_range=0.05,
            num_hidden_layers=3,  # layer_types: sliding, full, sliding.
            vocab_size=352,
            head_dim=32,
            query_pre_attn_scalar=4,  # scores * 1/2, not 1/sqrt(32).
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=4,
            # Small enough to bite on these weights (raw scores reach 1.6, raw logits 1.65).
            attn_logit_softcapping=1.0,
            final_logit_softcapping=1.5,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=True,
        ),
        tokenizer=GEMMA_TOKENIZER,
        generation_eos=("<eos>", "<end_of_turn>"),
        must_matter={
            "no sliding window": {"layer_types": ["full_attention"] * 3},
            "no attn_logit_softcapping": {"attn_logit_softcapping": None},
            "no final_logit_softcapping": {"final_logit_softcapping": None},
            "query_pre_attn_scalar=head_dim": {"query_pre_attn_scalar": 32},
        },
    ),
    Family(
        name="gpt2",
        seed=3,
        config_class="GPT2Config",
        config=dict(
            vocab_size=320,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_inner=None,
            n_positions=32,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            initializer_range=0.1,
            tie_word_embeddings=True,
        ),
        tokenizer=ByteLevelSpec(
            vocab_size=320,
            special_tokens=("<|endoftext|>",),
            specials_first=False,
            bos="<|endoftext|>",
            eos="<|endoftext|>",
            pad=None,
            unk="<|endoftext|>",
            add_bos=False,
            digits=None,
        ),
    ),
    Family(
        name="mixtral",
        seed=84,
        config_class="MixtralConfig",
        config=dict(
            TINY,
            intermediate_size=32,  # each expert's
            vocab_size=352,
            num_local_experts=4,
            num_experts_per_tok=2,
            router_jitter_noise=0.0,
            sliding_window=None,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=SentencePieceSpec(vocab_size=352),
        must_matter={
            "top-1 routing": {"num_experts_per_tok": 1},
            "no top-k renormalisation": without_top_k_renormalisation,
        },
    ),
    Family(
        name="qwen2_moe",
        seed=33,
        config_class="Qwen2MoeConfig",
        config=dict(
            TINY,
            vocab_size=320,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=False,  # Qwen1.5-MoE's
            qkv_bias=True,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=QWEN2_TOKENIZER,
        must_matter={
            "top-1 routing": {"num_experts_per_tok": 1},
            "norm_topk_prob=True": {"norm_topk_prob": True},
            "shared_expert_gate zeroed": zero_shared_expert_gates,
        },
    ),
    Family(
        name="qwen3_moe",
        seed=67,
        config_class="Qwen3MoeConfig",
        config=dict(
            TINY,
            num_hidden_layers=3,
            vocab_size=320,
            head_dim=32,  # not a Qwen3MoeConfig field: kept as an extra attribute, as the hub's.
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_only_layers=[1],  # layer 1 dense (intermediate_size 80), layers 0 and 2 MoE
            decoder_sparse_step=1,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False,
        ),
        tokenizer=QWEN3_TOKENIZER,
        generation_eos=QWEN3_EOS,
        must_matter={
            "top-1 routing": {"num_experts_per_tok": 1},
            "norm_topk_prob=False": {"norm_topk_prob": False},
            "mlp_only_layers=[]": {"mlp_only_layers": []},
        },
        max_shard_size="300KB",
    ),
)


# --- tokenizers -----------------------------------------------------------------------------


def sentencepiece_specials(spec: SentencePieceSpec) -> dict:
    """The trainer's ``<role>_id`` (-1: none) and ``<role>_piece`` options of spec.specials.

    Pieces are only given where they differ from SentencePiece's defaults, so that Llama 2's
    tokenizer.model stays as it was.
    """
    defaults = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
    options = {f"{role}_id": -1 for role in defaults}
    for index, (role, piece) in enumerate(spec.specials):
        options[f"{role}_id"] = index
        if piece != defaults[role]:
            options[f"{role}_piece"] = piece
    return options


def sentencepiece_tokenizer(spec: SentencePieceSpec, work: pathlib.Path) -> PreTrainedTokenizerBase:
    """Trains a tokenizer.model in ``work`` and loads it as transformers does."""
    model = io.BytesIO()  # Not model_prefix: the proto would record paths of this run.
    extra = {"user_defined_symbols": list(spec.user_symbols)} if spec.user_symbols else {}
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()),
        model_writer=model,
        vocab_size=spec.vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=spec.add_dummy_prefix,
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        normalization_rule_name="identity",
        character_coverage=1.0,
        **sentencepiece_specials(spec),
        **extra,
        num_threads=1,
        minloglevel=2,
    )
    (work / "tokenizer.model").write_bytes(model.getvalue())
    source = work / "source"
    source.mkdir()
    shutil.copy(work / "tokenizer.model", source / "tokenizer.model")
    # transformers 5 converts tokenizer.model to a tokenizers BPE; it adds no BOS by default.
    tokenizer_class = getattr(transformers, spec.tokenizer_class)
    tokenizer = tokenizer_class.from_pretrained(
        str(source), add_bos_token=True, add_eos_token=False
    )
    # GemmaTokenizer keeps the path it read as vocab_file; tokenizer_config.json would record it.
    tokenizer.init_kwargs.pop("vocab_file", None)
    return tokenizer


def byte_level_pipeline(spec: ByteLevelSpec) -> tokenizers.Tokenizer:
    """An untrained byte-level BPE with the family's normalizer, pre-tokenizer and decoder."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    if spec.nfc:
        tokenizer.normalizer = normalizers.NFC()
    if spec.digits is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = tokenizers.Regex(SPLIT_PATTERN.replace("DIGITS", spec.digits))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(pattern, behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def post_processor(
    spec: ByteLevelSpec, tokenizer: tokenizers.Tokenizer
) -> processors.PostProcessor:
    """ByteLevel offsets, then (if spec.add_bos) ``bos $A`` as Llama 3 and Mistral do."""
    byte_level = processors.ByteLevel(trim_offsets=False)
    if not spec.add_bos:
        return byte_level
    template = processors.TemplateProcessing(
        single=f"{spec.bos} $A",
        pair=f"{spec.bos} $A {spec.bos} $B:1",
        special_tokens=[(spec.bos, tokenizer.token_to_id(spec.bos))],
    )
    return processors.Sequence([byte_level, template])


def byte_level_tokenizer(spec: ByteLevelSpec) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE of spec.vocab_size tokens on CORPUS, wrapped for transformers."""
    tokenizer = byte_level_pipeline(spec)
    first = list(spec.special_tokens) if spec.specials_first else []
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=spec.vocab_size - (0 if spec.specials_first else len(spec.special_tokens)),
        special_tokens=first,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    if not spec.specials_first:
        tokenizer.add_special_tokens(list(spec.special_tokens))
    assert tokenizer.get_vocab_size() == spec.vocab_size, tokenizer.get_vocab_size()
    tokenizer.post_processor = post_processor(spec, tokenizer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=spec.unk,
        # Only where there is one: chat_template=None would be written to tokenizer_config.json.
        **({"chat_template": spec.chat_template} if spec.chat_template else {}),
    )


def make_tokenizer(family: Family, work: pathlib.Path) -> PreTrainedTokenizerBase:
    """The family's tokenizer, trained here (work: a scratch directory)."""
    if isinstance(family.tokenizer, SentencePieceSpec):
        return sentencepiece_tokenizer(family.tokenizer, work)
    return byte_level_tokenizer(family.tokenizer)


def token_ids(
    tokenizer: PreTrainedTokenizerBase, texts: tuple[str, ...], length: int
) -> np.ndarray:
    """The first ``length`` ids (special tokens included) of each text: [len(texts), length]."""
    rows = [tokenizer(text).input_ids for text in texts]
    for text, row in zip(texts, rows, strict=True):
        assert len(row) >= length, f"{text!r} has {len(row)} < {length} tokens"
    return np.array([row[:length] for row in rows], np.int32)


def tokenizer_cases(
    tokenizer: PreTrainedTokenizerBase, texts: tuple[str, ...] = TOKENIZER_TEXTS
) -> dict:
    """tokenizer_cases.json's content: a case for each of ``texts``, and the special token ids."""
    cases = []
    for text in texts:
        ids_no_special = tokenizer(text, add_special_tokens=False).input_ids
        cases.append(
            {
                "text": text,
                "ids": tokenizer(text).input_ids,
                "ids_no_special": ids_no_special,
                "decoded": tokenizer.decode(ids_no_special),
            }
        )
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return {"cases": cases, "special": special}


def chat_cases(
    tokenizer: PreTrainedTokenizerBase, conversations: tuple[list, ...] = CHAT_CONVERSATIONS
) -> dict:
    """chat_cases.json's content: ``{"cases": [{"messages", "rendered", "rendered_with_prompt",
    "ids"}...]}``, what apply_chat_template gives for each conversation (rendered_with_prompt:
    add_generation_prompt=True; ids: tokenize=True).

    ``assistant_masks`` (return_assistant_tokens_mask=True) only where the template marks the
    assistant's text with ``{% generation %}``: transformers has no mask without them (neither
    fixture's template has them). Asserts that each ``<|...|>`` of the template is one special
    token of the tokenizer.
    """
    template = tokenizer.chat_template
    for token in sorted(set(re.findall(r"<\|[a-z_]+\|>", template))):
        ids = tokenizer(token, add_special_tokens=False).input_ids
        added = tokenizer.added_tokens_decoder.get(ids[0]) if len(ids) == 1 else None
        assert added is not None and added.special, f"{token} is not a special token: {ids}"
    marked = re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None
    cases = []
    for messages in conversations:
        encoded = tokenizer.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=marked
        )
        case = {
            "messages": messages,
            "rendered": tokenizer.apply_chat_template(messages, tokenize=False),
            "rendered_with_prompt": tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            ),
            "ids": list(encoded["input_ids"]),
        }
        if marked:
            case["assistant_masks"] = list(encoded["assistant_masks"])
        cases.append(case)
    return {"cases": cases}


# --- models ---------------------------------------------------------------------------------


def special_ids(family: Family, tokenizer: PreTrainedTokenizerBase) -> dict:
    """config/generation_config ids: bos, eos (a list with generation_eos), pad."""
    eos = tokenizer.eos_token_id
    if family.generation_eos is not None:
        eos = tokenizer.convert_tokens_to_ids(list(family.generation_eos))
    return {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": tokenizer.pad_token_id,
    }


def make_config(family: Family, ids: dict, **overrides) -> transformers.PretrainedConfig:
    """The family's config with the tokenizer's special ``ids`` and ``overrides``."""
    config_class = getattr(transformers, family.config_class)
    return config_class(**{**family.config, **ids, **overrides})


def new_model(config: transformers.PretrainedConfig) -> transformers.PreTrainedModel:
    """An eager-attention float32 model of ``config``, in eval mode, from torch's RNG.

    MoE experts eager too: a loop over the experts hit (transformers' default on CPU,
    ``grouped_mm``, has no float64 kernel). Dense models ignore the setting.
    """
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    return model.eval()


def perturb_norms_and_biases(model: torch.nn.Module, seed: int) -> None:
    """Moves every norm weight (RMSNorm, LayerNorm) to 1 + 0.1 N(0, 1) and every bias (LayerNorm's
    too) to 0.1 N(0, 1).

    transformers initialises them to 1 and 0: a loader that skips one would go unnoticed. Gemma's
    RMSNorm stores w and scales by 1 + w; its w starts at 0 and becomes 0.1 N(0, 1) (the same
    scale). Asserts that no other 1-D parameter exists (it would keep its default).
    """
    generator = torch.Generator().manual_seed(seed)
    touched = set()
    with torch.no_grad():
        for module_name, module in model.named_modules():
            is_norm = type(module).__name__.endswith("RMSNorm") or isinstance(
                module, torch.nn.LayerNorm
            )
            for name, param in module.named_parameters(recurse=False):
                if name != "bias" and not is_norm:
                    continue
                noise = 0.1 * torch.randn(param.shape, generator=generator)
                base = 0.0
                if name != "bias":  # A norm's scale: 1, or 0 where the norm adds the 1 (Gemma).
                    base = 0.0 if not param.any() else 1.0
                    assert bool((param == base).all()), f"{module_name}.{name}: not all {base}"
                param.copy_(base + noise)
                touched.add(f"{module_name}.{name}")
    untouched = [n for n, p in model.named_parameters() if p.ndim == 1 and n not in touched]
    assert not untouched, f"1-D parameters left at their default: {untouched}"


def build_model(family: Family, ids: dict, seed: int) -> transformers.PreTrainedModel:
    """The family's model: random weights from ``seed``, norms and biases perturbed."""
    torch.manual_seed(seed)
    model = new_model(make_config(family, ids))
    perturb_norms_and_biases(model, seed + 1)
    model.generation_config.bos_token_id = ids["bos_token_id"]
    model.generation_config.eos_token_id = ids["eos_token_id"]
    model.generation_config.pad_token_id = ids["pad_token_id"]
    return model


@torch.no_grad()
def logits_of(model: transformers.PreTrainedModel, ids: np.ndarray) -> np.ndarray:
    """``ids [B, T]`` -> logits [B, T, V] float32."""
    return model(torch.from_numpy(ids).long()).logits.float().numpy()


@torch.no_grad()
def greedy(model: transformers.PreTrainedModel, prompt: np.ndarray) -> np.ndarray:
    """The new tokens [<= NEW_TOKENS] of greedy ``generate`` from ``prompt [P]`` alone."""
    inputs = torch.from_numpy(prompt).long()[None]
    out = model.generate(
        inputs,
        attention_mask=torch.ones_like(inputs),
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
    )
    return out[0, len(prompt) :].numpy().astype(np.int32)


@torch.no_grad()
def greedy_without_cache(
    model: transformers.PreTrainedModel, prompt: np.ndarray, eos: list[int]
) -> tuple[np.ndarray, float]:
    """Greedy decoding by full forward passes: (new tokens [<= NEW_TOKENS], min top-2 gap)."""
    tokens, gaps = list(prompt), []
    for _ in range(NEW_TOKENS):
        last = logits_of(model, np.array([tokens], np.int32))[0, -1]
        top2 = np.sort(last)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        tokens.append(int(last.argmax()))
        if tokens[-1] in eos:
            break
    return np.array(tokens[len(prompt) :], np.int32), min(gaps)


@contextlib.contextmanager
def router_margins(model: transformers.PreTrainedModel) -> Iterator[list[float]]:
    """While active, appends to the yielded list each router call's smallest margin over its
    tokens: the k-th minus the (k+1)-th largest of softmax(router_logits) (k: the router's
    top_k). Empty for a dense model."""
    margins = []

    def hook(module, args, output):
        probs = torch.softmax(output[0].double(), dim=-1)
        top = torch.topk(probs, module.top_k + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if is_router(m)]
    try:
        yield margins
    finally:
        for handle in handles:
            handle.remove()


def float64_gap(
    model: transformers.PreTrainedModel, batch: np.ndarray, logits: np.ndarray
) -> float:
    """max |logits of a float64 copy - logits| / max |logits| on ``batch``.

    transformers keeps some steps in float32 whatever the model's dtype (RMSNorm, the attention
    softmax, the routers' softmax); the rest (matmuls, the experts' weighted sum) is float64.
    """
    other = copy.deepcopy(model).to(torch.float64)
    with torch.no_grad():
        wide = other(torch.from_numpy(batch).long()).logits.numpy()
    return float(np.abs(wide - logits).max() / np.abs(logits).max())


def changed_mlp_layers(family: Family, overrides: dict) -> set[int]:
    """Layers whose MLP kind (dense or MoE) ``overrides`` of ``mlp_only_layers`` change."""
    before = set(family.config.get("mlp_only_layers", []))
    return before ^ set(overrides.get("mlp_only_layers", before))


def ablated(
    family: Family, ids: dict, model: transformers.PreTrainedModel, ablation: dict | Ablation
) -> transformers.PreTrainedModel:
    """``model`` with one must_matter ablation: config overrides, the same weights (a layer whose
    MLP kind they change keeps its fresh ones), or an Ablation applied to a copy."""
    if callable(ablation):
        other = copy.deepcopy(model)
        ablation(other)
        return other
    other = new_model(make_config(family, ids, **ablation))
    missing, unexpected = other.load_state_dict(model.state_dict(), strict=False)
    changed = changed_mlp_layers(family, ablation)
    for key in missing + unexpected:
        layer = re.match(r"model\.layers\.(\d+)\.mlp\.", key)
        assert layer and int(layer.group(1)) in changed, f"{family.name}: {key} not loaded"
    return other


def ablation_gaps(
    family: Family,
    ids: dict,
    model: transformers.PreTrainedModel,
    batch: np.ndarray,
    logits: np.ndarray,
) -> dict[str, float]:
    """Each must_matter ablation's max |logits change| / max |logits|.

    ``batch [B, T]`` int32 and its ``logits [B, T, V]`` from ``model``.
    """
    gaps = {}
    scale = float(np.abs(logits).max())
    for label, ablation in family.must_matter.items():
        other = ablated(family, ids, model, ablation)
        gaps[label] = float(np.abs(logits_of(other, batch) - logits).max()) / scale
        assert gaps[label] > MUST_MATTER, f"{family.name}: {label} changes logits by {gaps[label]}"
    return gaps


# --- writing --------------------------------------------------------------------------------


def save_tokenizer(
    family: Family, tokenizer: PreTrainedTokenizerBase, out: pathlib.Path, work: pathlib.Path
) -> None:
    """save_pretrained; a SentencePiece family (Llama 2, Gemma) also gets tokenizer.model and
    special_tokens_map.json, as its repo has.

    transformers 5 writes neither of those two files: they are added here.
    """
    tokenizer.save_pretrained(str(out))
    spec = family.tokenizer
    if isinstance(spec, SentencePieceSpec):
        shutil.copy(work / "tokenizer.model", out / "tokenizer.model")
        special = {f"{role}_token": piece for role, piece in spec.specials}
        if spec.additional_special_tokens:
            special["additional_special_tokens"] = list(spec.additional_special_tokens)
        text = json.dumps(special, indent=2, sort_keys=True)
        (out / "special_tokens_map.json").write_text(text + "\n")


def eos_list(ids: dict) -> list[int]:
    """The eos id(s) of ``special_ids`` as a list."""
    eos = ids["eos_token_id"]
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def greedy_outputs(
    model: transformers.PreTrainedModel, tokenizer: PreTrainedTokenizerBase, ids: dict, name: str
) -> tuple[dict, float]:
    """outputs.npz's prompt_i [P_i] and greedy_i [<= NEW_TOKENS], and the smallest top-2 gap.

    Asserts that generate (with its KV cache) equals greedy decoding by full forward passes.
    """
    arrays, gaps = {}, []
    for i, text in enumerate(PROMPT_TEXTS):
        prompt = np.array(tokenizer(text).input_ids, np.int32)
        positions = model.config.max_position_embeddings  # GPT-2: n_positions.
        assert len(prompt) + NEW_TOKENS <= positions, f"{name}: prompt {len(prompt)} too long"
        new = greedy(model, prompt)
        reference, gap = greedy_without_cache(model, prompt, eos_list(ids))
        assert np.array_equal(new, reference), (name, new, reference)
        assert gap >= MIN_GREEDY_GAP, f"{name}: greedy top-2 gap {gap}: change its seed"
        # Tied embeddings can make a random model echo its input; the layers would not matter.
        assert not (new == prompt[-1]).all(), f"{name}: greedy repeats the prompt's last token"
        arrays[f"prompt_{i}"], arrays[f"greedy_{i}"] = prompt, new
        gaps.append(gap)
    assert len(arrays["prompt_0"]) != len(arrays["prompt_1"])
    return arrays, min(gaps)


def add_sentencepiece_ids(cases: dict, model_file: pathlib.Path) -> None:
    """Adds ``sentencepiece_ids_no_special`` (the sentencepiece library's ids) to each case.

    transformers 5 encodes with a tokenizers BPE converted from tokenizer.model; where the two
    differ (leading spaces) the fixture shows it.
    """
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    for case in cases["cases"]:
        case["sentencepiece_ids_no_special"] = processor.encode(case["text"])


def write_outputs(
    family: Family,
    model: transformers.PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    ids: dict,
    out: pathlib.Path,
) -> dict:
    """Writes outputs.npz and tokenizer_cases.json; returns the numbers of the summary."""
    batch = token_ids(tokenizer, LOGIT_TEXTS, SEQ_LEN)
    if tokenizer.convert_ids_to_tokens(0) == "!":
        assert (batch == 0).any(), f"{family.name}: id 0 ('!') not in the logit texts"
    with router_margins(model) as margins:
        logits = logits_of(model, batch)
        greedy_arrays, gap = greedy_outputs(model, tokenizer, ids, family.name)
    margin = min(margins, default=None)
    assert margin is None or margin >= MIN_ROUTER_MARGIN, f"{family.name}: router margin {margin}"
    wide = float64_gap(model, batch, logits)
    assert wide <= FLOAT64_TOLERANCE, f"{family.name}: float64 logits differ by {wide}"
    np.savez(out / "outputs.npz", ids=batch, logits=logits, **greedy_arrays)
    cases = tokenizer_cases(tokenizer)
    if isinstance(family.tokenizer, SentencePieceSpec):
        add_sentencepiece_ids(cases, out / "tokenizer.model")
    (out / "tokenizer_cases.json").write_text(
        json.dumps(cases, indent=1, ensure_ascii=False) + "\n"
    )
    if tokenizer.chat_template is not None:
        (out / "chat_cases.json").write_text(
            json.dumps(chat_cases(tokenizer), indent=1, ensure_ascii=False) + "\n"
        )
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "KB": round(sum(f.stat().st_size for f in out.iterdir()) / 1024),
        "max |logit|": round(float(np.abs(logits).max()), 3),
        "min greedy top-2 gap": round(gap, 3),
        **({"min router margin": round(margin, 4)} if margin is not None else {}),
        "float64 gap": float(f"{wide:.1e}"),
        "relative change": ablation_gaps(family, ids, model, batch, logits),
    }


def write_family(family: Family, out_root: pathlib.Path) -> None:
    """Builds, checks and writes fixture ``out_root / family.name``; prints its summary."""
    out = out_root / family.name
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as scratch:
        work = pathlib.Path(scratch)
        tokenizer = make_tokenizer(family, work)
        ids = special_ids(family, tokenizer)
        model = build_model(family, ids, family.seed)
        shard = {"max_shard_size": family.max_shard_size} if family.max_shard_size else {}
        model.save_pretrained(str(out), safe_serialization=True, **shard)
        save_tokenizer(family, tokenizer, out, work)
    for path in out.iterdir():  # transformers 5 writes its safetensors files 0600.
        path.chmod(0o644)
    summary = write_outputs(family, model, tokenizer, ids, out)
    print(family.name, ", ".join(f"{key}: {value}" for key, value in summary.items()), flush=True)


def make_all(out_dir: str, only: str | None = None) -> None:
    """Writes every family of FAMILIES (only: those of a comma-separated list) under out_dir."""
    names = [family.name for family in FAMILIES]
    wanted = names if only is None else [name.strip() for name in only.split(",")]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"--only: unknown families {unknown}; known: {names}")
    out_root = pathlib.Path(out_dir)
    out_root.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        if family.name in wanted:
            write_family(family, out_root)


# --- --check --------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    """What --check prints after each comparison."""
    return "ok" if ok else "MISMATCH"


def check_logits(model: transformers.PreTrainedModel, fixture: dict) -> bool:
    """Compares model's logits on fixture ids with the fixture's; prints the relative error."""
    logits = logits_of(model, fixture["ids"])
    if logits.shape != fixture["logits"].shape:
        print(f"logits: shape {logits.shape} vs {fixture['logits'].shape}: MISMATCH")
        return False
    scale = float(np.abs(fixture["logits"]).max())
    error = float(np.abs(logits - fixture["logits"]).max()) / scale
    ok = error <= TOLERANCE
    print(f"logits: max |diff| / max |logit| = {error:.2e} (scale {scale:.3f}): {verdict(ok)}")
    return ok


def check_greedy(model: transformers.PreTrainedModel, fixture: dict) -> bool:
    """Compares greedy decodes from the fixture's prompts."""
    ok = True
    for i in range(2):
        new = greedy(model, fixture[f"prompt_{i}"])
        same = np.array_equal(new, fixture[f"greedy_{i}"])
        want = fixture[f"greedy_{i}"].tolist()
        print(f"greedy_{i}: {new.tolist()} vs {want}: {verdict(same)}")
        ok &= same
    return ok


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, expected: dict) -> bool:
    """Compares tokenizer_cases (ids, ids_no_special, decoded, special ids) with ``expected``."""
    actual = tokenizer_cases(tokenizer, tuple(case["text"] for case in expected["cases"]))
    ok = actual["special"] == expected["special"]
    if not ok:
        print(f"special ids: {actual['special']} vs {expected['special']}: MISMATCH")
    for got, want in zip(actual["cases"], expected["cases"], strict=True):
        for key in [key for key in got if got[key] != want[key]]:
            print(f"tokenizer case {want['text']!r}: {key} {got[key]!r} vs {want[key]!r}: MISMATCH")
            ok = False
    print(f"tokenizer: {len(expected['cases'])} cases: {verdict(ok)}")
    return ok


def check_chat(tokenizer: PreTrainedTokenizerBase, expected: dict) -> bool:
    """Compares chat_cases (rendered, rendered_with_prompt, ids) with ``expected``."""
    if tokenizer.chat_template is None:
        print("chat: no chat template: MISMATCH")
        return False
    actual = chat_cases(tokenizer, tuple(case["messages"] for case in expected["cases"]))
    ok = True
    for i, (got, want) in enumerate(zip(actual["cases"], expected["cases"], strict=True)):
        for key in [key for key in want if got.get(key) != want[key]]:
            print(f"chat case {i}: {key} {got.get(key)!r} vs {want[key]!r}: MISMATCH")
            ok = False
    print(f"chat: {len(expected['cases'])} conversations: {verdict(ok)}")
    return ok


def check(model_dir: str, name: str, fixtures: pathlib.Path) -> bool:
    """Loads model_dir as transformers does and compares it with fixture ``fixtures / name``."""
    fixture_dir = fixtures / name
    fixture = dict(np.load(fixture_dir / "outputs.npz"))
    expected = json.loads((fixture_dir / "tokenizer_cases.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model.eval()
    results = [check_logits(model, fixture), check_greedy(model, fixture)]
    results.append(check_tokenizer(tokenizer, expected))
    if (fixture_dir / "chat_cases.json").exists():
        chat = json.loads((fixture_dir / "chat_cases.json").read_text())
        results.append(check_chat(tokenizer, chat))
    return all(results)


# --- --check-tiny ---------------------------------------------------------------------------

#: --check-tiny's generate: new tokens from TOKENIZER_TEXTS[0].
TINY_NEW_TOKENS = 4


def safetensors_of(directory: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of the directory's safetensors files (one, or shards), by name."""
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safetensors.safe_open(str(file), framework="np") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})  # noqa: SIM118
    return tensors


def check_tiny_loading(
    model_class: type, model_dir: str
) -> tuple[transformers.PreTrainedModel, bool]:
    """Loads ``model_dir`` (what paxlite-tiny-model wrote) with ``model_class`` and checks that
    transformers found every tensor it wants and none it does not (no missing, unexpected or
    mismatched keys), and that its ``save_pretrained`` writes back the same tensors (names,
    shapes, values: the mixtures of experts' fused experts are written per expert again)."""
    model, info = model_class.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    model.eval()
    ok = True
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        found = sorted(map(str, info.get(key) or []))
        print(f"{key}: {found[:4]}{' ...' if len(found) > 4 else ''}: {verdict(not found)}")
        ok &= not found
    ours = safetensors_of(pathlib.Path(model_dir))
    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch)
        theirs = safetensors_of(pathlib.Path(scratch))
    differ = sorted(set(ours) ^ set(theirs)) + sorted(
        name
        for name in set(ours) & set(theirs)
        if ours[name].shape != theirs[name].shape or not np.array_equal(ours[name], theirs[name])
    )
    print(
        f"{len(ours)} tensors, as save_pretrained writes them: {differ[:4]}: {verdict(not differ)}"
    )
    return model, ok and not differ


def check_tiny_tokenizer(
    tokenizer: PreTrainedTokenizerBase, reference: Callable[[str], list[int]], model_dir: str
) -> bool:
    """AutoTokenizer's ids on TOKENIZER_TEXTS equal ``reference``'s (the tokenizers or
    SentencePiece library reading the files: paxlite's HfTokenizer is tested against those);
    its bos, eos and pad are generation_config.json's (the eos one of its list)."""
    ok = True
    for text in TOKENIZER_TEXTS:
        ours, theirs = reference(text), tokenizer(text).input_ids
        if ours != theirs:
            print(f"tokenizer {text!r}: {theirs} vs {ours}: MISMATCH")
            ok = False
    print(f"tokenizer: {len(TOKENIZER_TEXTS)} texts: {verdict(ok)}")
    generation = json.loads((pathlib.Path(model_dir) / "generation_config.json").read_text())
    eos = generation.get("eos_token_id")
    special = (
        tokenizer.bos_token_id == generation.get("bos_token_id")
        and tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])
        and tokenizer.pad_token_id == generation.get("pad_token_id")
    )
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    print(f"bos, eos, pad {ids} vs generation_config {generation}: {verdict(special)}")
    return ok and special


@torch.no_grad()
def check_tiny(model_dir: str) -> bool:
    """``--check-tiny DIR``: a causal LM that paxlite-tiny-model wrote, as transformers loads
    it (check_tiny_loading, check_tiny_tokenizer against tokenizer.json read by the tokenizers
    library), and a greedy generate of TINY_NEW_TOKENS tokens runs."""
    model, ok = check_tiny_loading(AutoModelForCausalLM, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = tokenizers.Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    ok &= check_tiny_tokenizer(tokenizer, lambda text: reference.encode(text).ids, model_dir)
    inputs = tokenizer(TOKENIZER_TEXTS[0], return_tensors="pt")
    out = model.generate(**inputs, do_sample=False, max_new_tokens=TINY_NEW_TOKENS)
    print(f"generate: {out[0, inputs.input_ids.shape[1] :].tolist()}")
    return ok


def run_cli(doc: str, check_fn, make_all_fn, check_tiny_fn=check_tiny) -> None:
    """A fixture maker's command line: ``OUT_DIR [--only NAME,...]`` writes the fixtures
    (``make_all_fn(out_dir, only)``), ``--check DIR NAME`` checks a directory against one
    (``check_fn(dir, name, fixtures_root)``, exit 1 on a mismatch), ``--check-tiny DIR``
    checks what paxlite-tiny-model wrote (``check_tiny_fn(dir)``, exit 1 on a mismatch)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", help="where to write (tests/fixtures/hf)")
    parser.add_argument("--check", nargs=2, metavar=("DIR", "NAME"), help="DIR vs fixture NAME")
    parser.add_argument("--check-tiny", metavar="DIR", help="DIR from paxlite-tiny-model")
    parser.add_argument("--fixtures", default=str(FIXTURES), help="--check's fixture root")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="write only these fixtures")
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    if args.check:
        sys.exit(0 if check_fn(args.check[0], args.check[1], pathlib.Path(args.fixtures)) else 1)
    if args.check_tiny:
        sys.exit(0 if check_tiny_fn(args.check_tiny) else 1)
    if not args.out_dir:
        parser.error("give OUT_DIR, --check DIR NAME or --check-tiny DIR")
    make_all_fn(args.out_dir, args.only)


def main() -> None:
    run_cli(__doc__, check, make_all)


if __name__ == "__main__":
    main()
