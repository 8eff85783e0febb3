"""``paxlite-tiny-model``: a small Hugging Face model directory of a family paxlite reads,
random weights and a tokenizer trained on generated text, for trying the Hugging Face,
LoRA and T5 journeys on a CPU with nothing downloaded::

    paxlite-tiny-model --family=llama3 --out=/tmp/tiny_llama3 --write_text=/tmp/tiny.txt
    paxlite --exp=tasks.lm.hf.HfCausalLm --job_log_dir=/tmp/ft --set HF_MODEL=/tmp/tiny_llama3 \\
        --set TEXT_DATA_PATH=/tmp/tiny.txt --set MAX_SEQ_LEN=64 --set LEARNING_RATE=3e-3

Each family's :class:`Recipe` is the model fields of the transformers-made test fixture it
follows (``tests/fixtures/hf/<fixture>``: hidden 64, 2 layers, 4 heads, ...), but where it
says otherwise (``unlike_fixture``: GPT-2's 128 positions, T5's sizes, which are
``tasks.t5.text.T5TextTiny``'s so that ``--set INIT_FROM=DIR --set VOCAB_PATH=DIR/spiece.model``
is all that experiment needs). The directory is written with paxlite's own writer
(``hf_checkpoint.save``, as ``paxlite-export`` writes): config.json, model.safetensors,
generation_config.json and the tokenizer's files (``tiny_tokenizers``). The weights are as
transformers initialises a new model: norms 1 (0 where the family scales by ``1 + w``),
biases 0, the rest N(0, initializer_range) (T5: N(0, 0.05), T5 1.0's embedding N(0, 1)).
Everything follows from ``--seed``: the same seed writes the same bytes. ``--write_text``
writes the generated text the tokenizer learned, one document a line: a training file whose
loss falls within tens of steps (Llama 3's, 40 steps of 64 tokens at LEARNING_RATE=3e-3:
6.1 to 2.6).
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import fiddle as fdl
import jax
import numpy as np
from absl import app, flags, logging
from etils import epath
from fiddle import daglish
from flax import linen as nn
from flax import traverse_util

from paxlite.cli import exits, own_flags
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.hf import tiny_tokenizers as tt
from praxis_lite import config as config_lib
from praxis_lite.layers.normalizations import RmsNorm
from praxis_lite.models.t5 import T5Shape

#: Documents of the generated text (about 60 KB).
TEXT_LINES = 1000

# --- the generated text ----------------------------------------------------------------------
# A small vocabulary and a few templates: text whose loss a tiny random model brings down
# within tens of steps (a larger grammar is learnt too slowly to show it).

_NAMES = ("Ada", "Ben", "Eve", "Jack", "Zoe")
_NOUNS = ("apple", "book", "cake", "dog", "fox", "map")
_ADJECTIVES = ("big", "small", "red", "blue")
_VERBS = ("found", "painted", "carried", "sold")
_PLACES = ("kitchen", "market", "garden")
#: Every lowercase letter, once in a while (T5's SentencePiece knows only the letters it saw).
_PANGRAM = "The quick brown fox jumps over the lazy dog."


def _sentence(rng: random.Random) -> str:
    """One sentence of the template grammar (words, digits, punctuation)."""
    name, noun, adjective = rng.choice(_NAMES), rng.choice(_NOUNS), rng.choice(_ADJECTIVES)
    place, verb = rng.choice(_PLACES), rng.choice(_VERBS)
    n, m = rng.randint(1, 9), rng.randint(1, 9)
    templates = (
        f"{name} {verb} the {adjective} {noun}.",
        f"The {adjective} {noun} is in the {place}.",
        f"{name} has {n} {noun}s.",
        f"{n} plus {m} makes {n + m}.",
        f"Where is the {noun}? In the {place}, I think!",
        _PANGRAM,
    )
    return templates[rng.randrange(len(templates))]


def generated_text(seed: int, lines: int = TEXT_LINES) -> list[str]:
    """``lines`` documents of one to three sentences (:func:`_sentence`), from ``seed``."""
    rng = random.Random(seed)
    return [" ".join(_sentence(rng) for _ in range(rng.randint(1, 3))) for _ in range(lines)]


# --- the recipes -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one ``--family`` is written.

    Attributes:
      summary: its line in ``--help``.
      model_type: config.json's (the family of ``paxlite.formats.hf.models``).
      fields: config.json's model fields (the special token ids come from the tokenizer).
      tokenizer: its tokenizer.
      eos_tokens: config's and generation_config's ``eos_token_id`` list (Llama 3's
        ``<|eot_id|>``, ``<|end_of_text|>``); empty: the tokenizer's EOS alone.
      fixture: the transformers-made fixture (``tests/fixtures/hf/<fixture>``) whose model
        fields these are; unlike_fixture: the fields set otherwise here, and why.
      std: the random weights' standard deviation (None: ``initializer_range``).
      embedding_std: the embedding tables' (None: ``std``). T5 1.0's is 1, as transformers
        initialises it: its tied logits scale the table by ``d_model**-0.5``, and a small
        one leaves them flat, slow to learn.
    """

    summary: str
    model_type: str
    fields: Mapping[str, Any]
    tokenizer: tt.TokenizerSpec
    fixture: str
    eos_tokens: tuple[str, ...] = ()
    unlike_fixture: Mapping[str, str] = dataclasses.field(default_factory=dict)
    std: float | None = None
    embedding_std: float | None = None


_TINY = dict(
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.1,
    hidden_act="silu",
)


def _rope(theta: float) -> dict[str, Any]:
    return {"rope_parameters": {"rope_theta": theta, "rope_type": "default"}}


_LLAMA = dict(_TINY, attention_bias=False, mlp_bias=False, pretraining_tp=1, head_dim=16)
_QWEN = dict(_TINY, **_rope(1e6), rms_norm_eps=1e-6, use_sliding_window=False)
_LLAMA_TOKENIZER = tt.TokenizerSpec(
    tt.Pieces.BYTE_FALLBACK,
    size=352,
    leading=("<unk>", "<s>", "</s>"),
    bos="<s>",
    eos="</s>",
    unk="<unk>",
    add_bos=True,
)
_QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN2_TOKENIZER = tt.TokenizerSpec(
    tt.Pieces.BYTE_LEVEL,
    size=312,  # Of the model's 320 rows: Qwen's tokenizers are smaller than their embeddings.
    trailing=_QWEN_TOKENS,
    eos="<|endoftext|>",
    pad="<|endoftext|>",
    split=tt.Split.DIGITS_BY_ONE,
    nfc=True,
    chat_template=tt.CHATML_TEMPLATE,
)
_QWEN3_TOKENIZER = dataclasses.replace(_QWEN2_TOKENIZER, eos="<|im_end|>", chat_template=None)
_GEMMA_TURNS = ("<start_of_turn>", "<end_of_turn>")
_GEMMA_TOKENIZER = tt.TokenizerSpec(
    tt.Pieces.BYTE_FALLBACK,
    size=352,
    leading=("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", *_GEMMA_TURNS),
    bos="<bos>",
    eos="<eos>",
    pad="<pad>",
    unk="<unk>",
    add_bos=True,
    dummy_prefix=False,
    extra_special=("<mask>", *_GEMMA_TURNS),
)
_GEMMA = {  # Its activation: gemma's hidden_act, gemma2's hidden_activation.
    **{k: v for k, v in _TINY.items() if k != "hidden_act"},
    "vocab_size": 352,
    "head_dim": 32,
    "rms_norm_eps": 1e-6,
    **_rope(1e4),
    "tie_word_embeddings": True,
    "attention_bias": False,
}
#: Why Gemma 2's soft caps are its real ones here.
_GEMMA2_CAPS = (
    "Gemma 2's own 50 and 30: the fixture's 1.0 and 1.5 (set to bite on random weights) keep "
    "the logits within 1.5 of each other, so its loss cannot fall below about 2.9"
)
_MOE = dict(num_experts_per_tok=2, router_aux_loss_coef=1e-3)
#: T5TextTiny's sizes (tasks/t5/tiny.py, text.py): 384 rows = spiece.model's at most 284
#: pieces and 100 sentinels.
_T5_SIZES = dict(
    num_encoder_layers=2,
    num_decoder_layers=2,
    model_dims=64,
    hidden_dims=128,
    num_heads=4,
    dims_per_head=16,
    vocab_size=384,
)
_T5_TOKENIZER = tt.TokenizerSpec(
    tt.Pieces.SENTENCEPIECE,
    size=384,
    leading=("<pad>", "</s>", "<unk>"),
    eos="</s>",
    pad="<pad>",
    unk="<unk>",
    extra_ids=100,
)
_T5_UNLIKE_FIXTURE = {
    "d_model": "T5TextTiny's sizes",
    "d_ff": "T5TextTiny's sizes",
    "d_kv": "T5TextTiny's sizes",
    "vocab_size": "T5TextTiny's 384 (spiece.model's pieces and 100 sentinels)",
}


def _t5_fields(**variant: Any) -> dict[str, Any]:
    fields = hf_models.t5_config(T5Shape(**_T5_SIZES, **variant))
    for name in ("model_type", "architectures", "eos_token_id", "pad_token_id"):
        fields.pop(name)  # The writer's, and the tokenizer's ids.
    return {**fields, "is_decoder": False}


RECIPES: dict[str, Recipe] = {
    "llama": Recipe(
        "Llama 2: byte-fallback BPE (352), BOS <s> added",
        "llama",
        dict(_LLAMA, vocab_size=352, rms_norm_eps=1e-5, **_rope(1e4), tie_word_embeddings=False),
        _LLAMA_TOKENIZER,
        fixture="llama2",
    ),
    "llama3": Recipe(
        "Llama 3: llama3 RoPE scaling, byte-level BPE (320), eos <|eot_id|> <|end_of_text|>",
        "llama",
        dict(
            _LLAMA,
            vocab_size=320,
            rms_norm_eps=1e-5,
            rope_parameters={
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8,
                "rope_theta": 500000.0,
                "rope_type": "llama3",
            },
            tie_word_embeddings=False,
        ),
        tt.TokenizerSpec(
            tt.Pieces.BYTE_LEVEL,
            size=320,
            trailing=(
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|eot_id|>",
                "<|finetune_right_pad_id|>",
            ),
            bos="<|begin_of_text|>",
            eos="<|end_of_text|>",
            pad="<|finetune_right_pad_id|>",
            add_bos=True,
            split=tt.Split.DIGITS_BY_THREE,
            chat_template=tt.LLAMA3_CHAT_TEMPLATE,
        ),
        fixture="llama3",
        eos_tokens=("<|eot_id|>", "<|end_of_text|>"),
    ),
    "mistral": Recipe(
        "Mistral: sliding window of 4 tokens, head_dim 24, byte-level BPE (320)",
        "mistral",
        dict(
            _TINY,
            vocab_size=320,
            head_dim=24,
            sliding_window=4,
            rms_norm_eps=1e-3,
            **_rope(1e6),
            tie_word_embeddings=False,
        ),
        tt.TokenizerSpec(
            tt.Pieces.BYTE_LEVEL,
            size=320,
            leading=("<unk>", "<s>", "</s>"),
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            add_bos=True,
        ),
        fixture="mistral",
    ),
    "qwen2": Recipe(
        "Qwen2: q/k/v biases, tied embeddings, byte-level BPE (312 of 320), ChatML",
        "qwen2",
        dict(_QWEN, vocab_size=320, tie_word_embeddings=True, layer_types=["full_attention"] * 2),
        _QWEN2_TOKENIZER,
        fixture="qwen2",
    ),
    "qwen3": Recipe(
        "Qwen3: q/k norms, head_dim 32, eos <|im_end|> <|endoftext|>",
        "qwen3",
        dict(
            _QWEN,
            vocab_size=320,
            head_dim=32,
            attention_bias=False,
            tie_word_embeddings=False,
            layer_types=["full_attention"] * 2,
        ),
        _QWEN3_TOKENIZER,
        fixture="qwen3",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
    "gemma": Recipe(
        "Gemma: norms 1 + w, embeddings x sqrt(64), byte-fallback BPE (352) without a prefix",
        "gemma",
        dict(_GEMMA, initializer_range=0.3, hidden_act="gelu_pytorch_tanh"),
        _GEMMA_TOKENIZER,
        fixture="gemma",
    ),
    "gemma2": Recipe(
        "Gemma 2: 3 layers sliding/full/sliding (window 4), logit soft caps 50 and 30",
        "gemma2",
        dict(
            _GEMMA,
            initializer_range=0.05,
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=4,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=4,
            hidden_activation="gelu_pytorch_tanh",
        ),
        _GEMMA_TOKENIZER,
        fixture="gemma2",
        eos_tokens=("<eos>", "<end_of_turn>"),
        unlike_fixture={
            "attn_logit_softcapping": _GEMMA2_CAPS,
            "final_logit_softcapping": _GEMMA2_CAPS,
        },
    ),
    "gpt2": Recipe(
        "GPT-2: learned positions (128), LayerNorm and biases, byte-level BPE (320)",
        "gpt2",
        dict(
            vocab_size=320,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_inner=None,
            n_positions=128,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            initializer_range=0.1,
            tie_word_embeddings=True,
            scale_attn_by_inverse_layer_idx=False,
            scale_attn_weights=True,
        ),
        tt.TokenizerSpec(
            tt.Pieces.BYTE_LEVEL,
            size=320,
            trailing=("<|endoftext|>",),
            bos="<|endoftext|>",
            eos="<|endoftext|>",
            unk="<|endoftext|>",
        ),
        fixture="gpt2",
        unlike_fixture={"n_positions": "the fixture's 32 positions: MAX_SEQ_LEN=64 must fit"},
    ),
    "mixtral": Recipe(
        "Mixtral: 4 experts of 32, top 2, Llama 2's tokenizer",
        "mixtral",
        dict(
            _TINY,
            **_MOE,
            vocab_size=352,
            intermediate_size=32,
            num_local_experts=4,
            router_jitter_noise=0.0,
            rms_norm_eps=1e-5,
            **_rope(1e6),
            tie_word_embeddings=False,
        ),
        _LLAMA_TOKENIZER,
        fixture="mixtral",
    ),
    "qwen2_moe": Recipe(
        "Qwen2-MoE: 4 experts of 32, top 2, a shared expert of 48, Qwen2's tokenizer",
        "qwen2_moe",
        dict(
            _QWEN,
            **_MOE,
            vocab_size=320,
            num_experts=4,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=False,
            qkv_bias=True,
            tie_word_embeddings=False,
            layer_types=["full_attention"] * 2,
        ),
        _QWEN2_TOKENIZER,
        fixture="qwen2_moe",
    ),
    "qwen3_moe": Recipe(
        "Qwen3-MoE: 3 layers, the middle one dense, 4 experts of 32, Qwen3's tokenizer",
        "qwen3_moe",
        dict(
            _QWEN,
            **_MOE,
            vocab_size=320,
            num_hidden_layers=3,
            head_dim=32,
            num_local_experts=4,
            moe_intermediate_size=32,
            mlp_only_layers=[1],
            decoder_sparse_step=1,
            norm_topk_prob=True,
            attention_bias=False,
            tie_word_embeddings=False,
        ),
        _QWEN3_TOKENIZER,
        fixture="qwen3_moe",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
    "t5": Recipe(
        "T5 1.0: ReLU, tied logits, spiece.model; T5TextTiny's sizes with --set "
        "'MLP_ACTIVATIONS=relu,' --set LOGITS_VIA_EMBEDDING=True",
        "t5",
        _t5_fields(mlp_activations=("relu",), logits_via_embedding=True),
        _T5_TOKENIZER,
        fixture="t5_v1_0",
        unlike_fixture=_T5_UNLIKE_FIXTURE,
        std=0.05,
        embedding_std=1.0,
    ),
    "flan-t5": Recipe(
        "T5 1.1 / Flan-T5: gated GELU, its own lm_head; T5TextTiny's sizes, spiece.model",
        "t5",
        _t5_fields(),
        _T5_TOKENIZER,
        fixture="t5_flan",
        unlike_fixture={
            **_T5_UNLIKE_FIXTURE,
            "num_layers": "T5TextTiny's 2 encoder layers (the fixture's 3)",
            "tie_word_embeddings": "false, as the hub's flan-t5 configs (transformers 5 "
            "writes true beside scale_decoder_outputs false)",
        },
        std=0.05,
    ),
}


# --- writing ---------------------------------------------------------------------------------


class TinyModelError(ValueError):
    """``--out`` cannot take the model (a file, or a directory that holds files)."""


def write(family: str, out: epath.PathLike, seed: int = 0) -> list[str]:
    """Writes the tiny model of ``family`` (a key of :data:`RECIPES`) into the new or empty
    directory ``out``, from ``seed``; returns the files written.

    Raises:
      TinyModelError: ``out`` is a file, or a directory that is not empty.
      OSError: ``out`` cannot be written.
    """
    recipe = RECIPES[family]
    out = epath.Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TinyModelError(
            f"--out={out} is {'not a directory' if not out.is_dir() else 'not empty'}; give a "
            "new directory (the model is written into an empty one, never over other files; "
            "the same command run again writes nothing)."
        )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tt.write(recipe.tokenizer, generated_text(seed), out)
    ids = _special_ids(recipe, tokenizer)
    fields = {"model_type": recipe.model_type, **recipe.fields, **ids}
    config = hf_models.HfConfig(fields, str(out / hf_models.CONFIG_FILE))
    hf_family, model = hf_models.build_model(config)
    std = recipe.std if recipe.std is not None else recipe.fields["initializer_range"]
    embedding_std = recipe.embedding_std if recipe.embedding_std is not None else std
    params = random_params(model, seed, std, embedding_std)
    files = hf_checkpoint.save(out, params, hf_family, config.fields)
    generation = {name: value for name, value in ids.items() if value is not None}
    (out / hf_checkpoint.GENERATION_CONFIG_FILE).write_text(json.dumps(generation, indent=2) + "\n")
    return [*files, hf_checkpoint.GENERATION_CONFIG_FILE, *tokenizer.files]


def _special_ids(recipe: Recipe, tokenizer: tt.Written) -> dict[str, Any]:
    """config.json's special token ids: bos, eos (the recipe's list) and pad; an
    encoder-decoder's decoder start (its pad: T5's) instead of bos."""
    named = tokenizer.named_ids
    eos = [tokenizer.token_ids[t] for t in recipe.eos_tokens] or named["eos"]
    if recipe.fields.get("is_encoder_decoder"):
        return {
            "decoder_start_token_id": named["pad"],
            "eos_token_id": eos,
            "pad_token_id": named["pad"],
        }
    return {"bos_token_id": named["bos"], "eos_token_id": eos, "pad_token_id": named["pad"]}


def random_params(
    model: config_lib.Config, seed: int, std: float, embedding_std: float
) -> dict[str, np.ndarray]:
    """Float32 weights for ``model`` (a family's config), by our flat paths, as transformers
    initialises a new model: norm scales 1 (0 where the norms scale by ``1 + w``), biases 0,
    embedding tables N(0, ``embedding_std``), the rest N(0, ``std``), drawn from ``seed`` in
    the paths' sorted order. The shapes come from ``jax.eval_shape`` of the model's init:
    nothing is compiled."""
    layer = config_lib.instantiate(model)
    shapes = jax.eval_shape(layer.init, jax.random.key(0), layer.example_batch())
    flat = traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/")
    norm_scale = 0.0 if _norms_add_one(model) else 1.0
    rng = np.random.default_rng(seed)
    params = {}
    for path in sorted(flat):
        name, shape = path.rsplit("/", 1)[-1], flat[path].shape
        if name == "scale":
            params[path] = np.full(shape, norm_scale, np.float32)
        elif name in ("bias", "b") or name.startswith("b_"):
            params[path] = np.zeros(shape, np.float32)
        else:
            deviation = embedding_std if name == "emb_var" else std
            params[path] = rng.normal(0.0, deviation, shape).astype(np.float32)
    return params


def _norms_add_one(model: config_lib.Config) -> bool:
    """Whether ``model``'s RMSNorms scale by ``1 + w`` (Gemma's: ``direct_scale=False``)."""
    return any(
        isinstance(value, fdl.Buildable)
        and value.__fn_or_cls__ is RmsNorm
        and not value.direct_scale
        for value, _ in daglish.iterate(model)
    )


# --- the command line ------------------------------------------------------------------------

#: The command line's own flags (absl's global FLAGS hold the trainer's, when imported).
_FLAGS = flags.FlagValues()
_PROGRAM = "paxlite-tiny-model"


def define_flags(flag_values: flags.FlagValues) -> None:
    """The command line's flags, on ``flag_values`` (:func:`run`: :data:`_FLAGS`)."""
    fv = flag_values
    flags.DEFINE_enum(
        "family", None, list(RECIPES), "The model's family (see above).", flag_values=fv
    )
    flags.DEFINE_string(
        "out",
        None,
        "The directory to write (new or empty; one this command wrote is left as it is).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "seed",
        0,
        "The weights' and the text's seed: the same seed, the same files.",
        lower_bound=0,
        flag_values=fv,
    )
    flags.DEFINE_string(
        "write_text",
        None,
        "Also write the generated text the tokenizer learned, one document a line, to this "
        "file (a training file: TEXT_DATA_PATH).",
        flag_values=fv,
    )


def help_text(flag_values: flags.FlagValues) -> str:
    """``--help``: what the command does, the families, the flags."""
    width = max(map(len, RECIPES))
    families = "\n".join(f"  {name:<{width}}  {r.summary}" for name, r in RECIPES.items())
    return (
        f"{_PROGRAM}: a small random Hugging Face model (config.json, model.safetensors, "
        "generation_config.json, a tokenizer trained on generated text), for trying paxlite "
        "on a CPU.\n\n"
        f"Families (--family; hidden 64, 2 layers, 4 heads unless said):\n{families}\n\n"
        f"{flag_values}"
    )


def parse(flag_values: flags.FlagValues, argv: Sequence[str]) -> list[str]:
    """``argv`` parsed into ``flag_values`` (:func:`define_flags`): the rest of it, or a
    one-line error (``--help``: the families and the flags, exit 0)."""
    return own_flags.parse(flag_values, argv, _PROGRAM, help_text(flag_values))


def check_flags(flag_values: flags.FlagValues, rest: Sequence[str]) -> None:
    """One line and exit 2 for what the command cannot run with: words that are no flag
    (``rest``: what :func:`parse` left, the program first), or no --family or --out."""
    own_flags.refuse_extra_words(rest, _PROGRAM)
    if not flag_values.family or not flag_values.out:
        exits.fail(f"{_PROGRAM} needs --family=NAME (one of {', '.join(RECIPES)}) and --out=DIR.")


def execute(flag_values: flags.FlagValues) -> None:
    """Writes the model (and ``--write_text``'s text) the parsed ``flag_values`` ask for and
    says what it wrote; one line and exit 2 where it cannot (``--out`` or ``--write_text``
    holds something else, or cannot be written). Run again, it finds its own files and
    writes nothing: a docs example can be repeated."""
    given = flag_values
    text = "".join(f"{line}\n" for line in generated_text(given.seed))
    try:
        text_is_new = given.write_text and _check_text_target(
            epath.Path(given.write_text), text, epath.Path(given.out)
        )
        if holds_the_same(given.family, given.out, given.seed):
            print(f"{given.out} already holds --family={given.family} --seed={given.seed}")
        else:
            files = write(given.family, given.out, given.seed)
            print(f"Wrote {given.out}: {', '.join(files)}")
        if text_is_new:
            path = epath.Path(given.write_text)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"Wrote {given.write_text}: {TEXT_LINES} lines of generated text")
    except TinyModelError as e:
        exits.fail(e)
    except OSError as e:
        exits.fail(f"cannot write {e.filename or given.out}: {e.strerror or e}.")


def _check_text_target(path: epath.Path, text: str, out: epath.Path) -> bool:
    """Whether ``--write_text``'s ``path`` is still to be written: False when it already
    holds ``text``. Checked before anything is written.

    Raises:
      TinyModelError: ``path`` holds something else (it is never overwritten), lies in
        ``out`` (the model's directory holds the model alone) or under a file.
    """
    if out.resolve() in path.resolve().parents:
        raise TinyModelError(
            f"--write_text={path} is inside --out={out}; give a file outside the model's directory."
        )
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise TinyModelError(f"--write_text={path}: {blocking} is a file, not a directory.")
    if not path.exists():
        return True
    if path.is_file() and path.read_text() == text:
        return False
    raise TinyModelError(
        f"--write_text={path} already exists and is not this seed's text; give a new file "
        "(an existing one is never overwritten)."
    )


def holds_the_same(family: str, out: epath.PathLike, seed: int) -> bool:
    """Whether ``out`` holds exactly the files :func:`write` writes for ``family`` and
    ``seed`` (byte for byte, nothing else): a repeated command."""
    out = epath.Path(out)
    if not out.is_dir() or not any(out.iterdir()):
        return False
    with tempfile.TemporaryDirectory() as scratch:
        files = write(family, epath.Path(scratch) / "model", seed)
        expected = {name: (epath.Path(scratch) / "model" / name).read_bytes() for name in files}
    present = {path.name for path in out.iterdir()}
    return present == set(expected) and all(
        (out / name).read_bytes() == data for name, data in expected.items()
    )


def main(argv: Sequence[str]) -> None:
    check_flags(_FLAGS, argv)
    execute(_FLAGS)


def _parse(argv: list[str]) -> list[str]:
    """``argv`` parsed into :data:`_FLAGS` (:func:`parse`)."""
    rest = parse(_FLAGS, argv)
    flags.FLAGS.mark_as_parsed()  # absl's own (logging's) flags keep their defaults,
    logging.set_verbosity(logging.WARNING)  # and libraries stay quiet, as in paxlite's runs.
    return rest


def run() -> None:
    """Console-script entry point: on the host's CPU (shapes only; nothing is computed)."""
    jax.config.update("jax_platforms", "cpu")
    define_flags(_FLAGS)
    app.run(main, argv=sys.argv, flags_parser=_parse)
