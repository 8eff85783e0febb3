"""Hugging Face's families as configurations of our layers.

A :class:`Family` reads a model's ``config.json`` into our layers' Fiddle config (a
``LanguageModel`` over a ``TransformerLm`` for the decoder-only families, T5's
``EncoderDecoderModel`` for ``t5``) and names its tensors with a table of
``paxlite.formats.hf.layout``. Each family says which config fields change the math:
one it reads (:class:`HfConfig` tracks them), one known to be inert (ignored), and any
other field gives one warning. A value a family cannot honour (a ``rope_scaling`` type
it lacks, say) is an :class:`HfConfigError` naming it and what is supported.

Both spellings of RoPE's settings are read: transformers 4.x's ``rope_theta`` and
``rope_scaling``, and 5.x's ``rope_parameters``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
from etils import epath

from paxlite.formats.hf import layout as hf_layout
from praxis_lite import config as config_lib
from praxis_lite.layers.activations import GELU, SiLU
from praxis_lite.layers.attentions import DotProductAttention
from praxis_lite.layers.embedding_softmax import (
    Embedding,
    FullSoftmax,
    RopeScaling,
    RotaryPositionalEmbedding,
    SharedEmbeddingSoftmax,
    TrainablePositionalEmbedding,
)
from praxis_lite.layers.normalizations import LayerNorm, RmsNorm
from praxis_lite.layers.repeats import StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import StackedTransformer, Transformer, TransformerFeedForward
from praxis_lite.models.lm import LanguageModel
from praxis_lite.models.t5 import T5_NORM_EPSILON, T5Shape, t5_model
from praxis_lite.moe import Dispatch, MoeFeedForward, TopKWeights

CONFIG_FILE = "config.json"

#: Fields of every config.json that never change the model's numbers (ids of special
#: tokens, training-time settings, bookkeeping; ``max_position_embeddings`` bounds
#: nothing here: RoPE extends to any position).
_INERT = frozenset(
    {
        "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
        "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache",
        "initializer_range", "max_position_embeddings", "output_attentions",
        "output_hidden_states", "return_dict", "tokenizer_class", "id2label", "label2id",
        "problem_type", "is_encoder_decoder", "tie_encoder_decoder",
        "attention_dropout",  # Dropout is the training run's choice (--fdl_set), not the weights'.
    }
)  # fmt: skip


class HfConfigError(ValueError):
    """A config.json paxlite cannot build: the field, its value and what is supported."""


class HfConfig:
    """A model's config.json, remembering which fields were read.

    Attributes:
      fields: the JSON object; path: where it was read (for messages).
    """

    def __init__(self, fields: dict[str, Any], path: str):
        self.fields, self.path = fields, path
        self._read: set[str] = set()

    @classmethod
    def load(cls, directory: epath.Path) -> HfConfig:
        """The config.json of ``directory``, or an HfConfigError saying what is wrong."""
        path = directory / CONFIG_FILE
        try:
            fields = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise HfConfigError(f"{path} is not a readable JSON config ({e}).") from None
        if not isinstance(fields, dict):
            raise HfConfigError(f"{path} holds {type(fields).__name__}, not a JSON object.")
        return cls(fields, str(path))

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name`` (``default`` when absent or null)."""
        self._read.add(name)
        value = self.fields.get(name)
        return default if value is None else value

    def require(self, name: str) -> Any:
        """The field ``name``, or an HfConfigError that it is missing."""
        value = self.get(name)
        if value is None:
            raise HfConfigError(f"{self.path} has no {name!r}, which the model needs.")
        return value

    def refuse(self, name: str, value: Any, supported: str) -> HfConfigError:
        """The error for a ``name`` whose ``value`` this family cannot honour."""
        return HfConfigError(
            f"{self.path}: {name}={json.dumps(value)} is not supported ({supported})."
        )

    def unknown(self, inert: frozenset[str] = frozenset()) -> list[str]:
        """Fields neither read nor known to be inert (``_INERT`` or ``inert``)."""
        return sorted(set(self.fields) - self._read - _INERT - inert)


@dataclasses.dataclass(frozen=True)
class Family:
    """A Hugging Face model family.

    Attributes:
      model_type: config.json's ``model_type``; architecture: its ``architectures``
        entry (written when saving); build: HfConfig -> our model's Fiddle config;
      table: Hugging Face's names of our parameters (``table_for``: of a config's
        fields, when they decide them; see :meth:`table_of`); inert: the family's own fields that
        never change the numbers (beyond every family's); canonical_name: a stored
        tensor's name as the table spells it, or None for a buffer that is no parameter
        (older checkpoints of a family may name them otherwise); mixture_of_experts: its
        feed-forwards (some or all) are mixtures of experts.
    """

    model_type: str
    architecture: str
    build: Callable[[HfConfig], config_lib.Config]
    table: hf_layout.Table
    inert: frozenset[str] = frozenset()
    canonical_name: Callable[[str], str | None] = lambda name: name
    table_for: Callable[[Mapping[str, Any]], hf_layout.Table] | None = None
    mixture_of_experts: bool = False

    def table_of(self, fields: Mapping[str, Any]) -> hf_layout.Table:
        """The names of a model whose config.json holds ``fields`` (``table`` unless the
        family's names depend on them: T5's MLP is ``wi`` or ``wi_0``/``wi_1``)."""
        return self.table if self.table_for is None else self.table_for(fields)


def rope_settings(cfg: HfConfig) -> dict[str, Any]:
    """RotaryPositionalEmbedding's fields from either spelling of RoPE's settings."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling")
    if scaling:
        params.update(scaling)
    theta = params.get("rope_theta", cfg.get("rope_theta", 10_000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    fields: dict[str, Any] = {"max_timescale": float(theta)}
    if kind == "default":
        return fields
    if kind not in ("linear", "llama3"):
        raise cfg.refuse("rope type", kind, "supported: default, linear, llama3")
    fields.update(scaling=RopeScaling(kind), scaling_factor=float(params["factor"]))
    if kind == "llama3":
        fields.update(
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position=int(params["original_max_position_embeddings"]),
        )
    return fields


#: Hugging Face's ``hidden_act`` / ``hidden_activation`` / ``activation_function`` names.
_ACTIVATIONS = {
    "silu": lambda: SiLU.HParams.config(),
    "gelu_pytorch_tanh": lambda: GELU.HParams.config(approximate=True),
    "gelu_new": lambda: GELU.HParams.config(approximate=True),
    "gelu": lambda: GELU.HParams.config(approximate=False),
}


def _activation(cfg: HfConfig, field: str, default: str) -> config_lib.Config:
    name = cfg.get(field, default)
    if name not in _ACTIVATIONS:
        raise cfg.refuse(field, name, f"supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


@dataclasses.dataclass(frozen=True)
class _Options:
    """What sets the Llama-like families apart.

    Attributes:
      qkv_bias: q/k/v biases (Qwen2). qk_norm: per-head q/k RMSNorm (Qwen3).
      sliding_windows: each layer's attention window (Mistral: all; Gemma 2: alternate).
      gemma: norms scaling by ``1 + w``, embeddings by ``sqrt(D)``, ``hidden_activation``.
      gemma2: norms after the attention and the feed-forward too, logit soft caps, the
        query scaled by ``query_pre_attn_scalar ** -0.5``.
      experts: how config.json spells its mixture of experts (None: dense).
    """

    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_windows: tuple[int | None, ...] = ()
    gemma: bool = False
    gemma2: bool = False
    experts: _Experts | None = None


@dataclasses.dataclass(frozen=True)
class _Experts:
    """How a family spells its mixture of experts in config.json.

    Attributes:
      hidden: the field of an expert's hidden dims (Mixtral: ``intermediate_size``).
      renormalize: the field saying whether the chosen experts' softmax weights are
        renormalised to sum to 1 (Qwen's ``norm_topk_prob``, false by default); None: always
        (Mixtral).
      shared_expert: a shared expert behind a sigmoid gate (Qwen2-MoE's
        ``shared_expert_intermediate_size``).
      sparse_step: the MoE layers are chosen by ``decoder_sparse_step`` and
        ``mlp_only_layers`` (Qwen); otherwise every layer is one.
    """

    hidden: str = "moe_intermediate_size"
    renormalize: str | None = "norm_topk_prob"
    shared_expert: bool = False
    sparse_step: bool = True


#: The number of experts: transformers reads either name in each family (Mixtral and
#: Qwen3-MoE save ``num_local_experts``, Qwen's Hub configs say ``num_experts``).
_EXPERT_COUNT = ("num_experts", "num_local_experts")

#: Fields of other mixture-of-experts families (DeepSeek's) that paxlite's routing lacks,
#: what they are, and the values that change nothing (other values are refused).
_UNSUPPORTED_ROUTING: dict[str, tuple[str, tuple[Any, ...]]] = {
    "n_group": ("DeepSeek's grouped routing", (1,)),
    "topk_group": ("DeepSeek's grouped routing", (1,)),
    "topk_method": ("DeepSeek's routing methods", ("greedy",)),
    "scoring_func": ("a router score other than the softmax", ("softmax",)),
    "routed_scaling_factor": ("scaled routed experts", (1, 1.0)),
    "n_shared_experts": ("DeepSeek's shared experts", (0,)),
    "first_k_dense_replace": ("DeepSeek's leading dense layers", (0,)),
    "moe_layer_freq": ("DeepSeek's MoE layer frequency", (1,)),
    "kv_lora_rank": ("multi-head latent attention (MLA)", ()),
    "q_lora_rank": ("multi-head latent attention (MLA)", ()),
}

#: Mixture-of-experts model types paxlite does not build, and what they need.
_UNSUPPORTED_MOE_TYPES = {
    "deepseek_v2": "DeepSeek's grouped routing and multi-head latent attention (kv_lora_rank)",
    "deepseek_v3": "DeepSeek's grouped routing, its sigmoid router with a score bias and "
    "multi-head latent attention (kv_lora_rank)",
    "gpt_oss": "gpt-oss' attention sinks and its clamped SwiGLU experts with biases",
    "qwen3_next": "Qwen3-Next's gated DeltaNet layers",
    "olmoe": "OLMoE",
    "jamba": "Jamba's Mamba layers",
    "dbrx": "DBRX",
}


def _llama_like(cfg: HfConfig, options: _Options) -> config_lib.Config:
    """A LanguageModel config of Llama's shape: RMSNorm pre-norm blocks, RoPE, a gated MLP."""
    d, heads = cfg.require("hidden_size"), cfg.require("num_attention_heads")
    if cfg.get("mlp_bias", False):
        raise cfg.refuse("mlp_bias", True, "supported: false")
    if cfg.get("pretraining_tp", 1) != 1:
        raise cfg.refuse("pretraining_tp", cfg.get("pretraining_tp"), "supported: 1")
    epsilon = float(cfg.get("rms_norm_eps", 1e-6))

    def norm() -> config_lib.Config:  # A new config each time: a shared one shares weights.
        return RmsNorm.HParams.config(epsilon=epsilon, direct_scale=not options.gemma)

    activation = (
        _activation(cfg, "hidden_activation", "gelu_pytorch_tanh")
        if options.gemma
        else _activation(cfg, "hidden_act", "silu")
    )
    attention = DotProductAttention.HParams.config(
        use_bias=options.qkv_bias or cfg.get("attention_bias", False),
        use_post_bias=cfg.get("attention_bias", False),
        rotary_tpl=RotaryPositionalEmbedding.HParams.config(**rope_settings(cfg)),
        qk_norm_tpl=norm() if options.qk_norm else None,
    )
    feed_forward = TransformerFeedForward.HParams.config(
        use_bias=False, use_gated_activation=True, activation_tpl=activation, ln_tpl=norm()
    )
    block = Transformer.HParams.config(
        input_dims=d,
        hidden_dims=cfg.require("intermediate_size"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        dims_per_head=cfg.get("head_dim", d // heads),
        ln_tpl=norm(),
        tr_atten_tpl=attention,
        tr_fflayer_tpl=feed_forward,
    )
    stack = StackedTransformer.HParams.config(
        num_layers=cfg.require("num_hidden_layers"),
        block_tpl=block,
        sliding_windows=options.sliding_windows,
    )
    if options.experts is not None:
        _add_experts(cfg, options.experts, stack)
    tied = cfg.get("tie_word_embeddings", options.gemma)
    softmax = (
        SharedEmbeddingSoftmax.HParams.config(scale_sqrt_depth=options.gemma)
        if tied
        else FullSoftmax.HParams.config(use_bias=False)
    )
    if options.gemma2:
        _gemma2_extras(cfg, block, feed_forward, softmax, norm)
    lm = TransformerLm.HParams.config(
        model_dims=d,
        vocab_size=cfg.require("vocab_size"),
        softmax_tpl=softmax,
        embedding_tpl=None if tied else Embedding.HParams.config(scale_sqrt_depth=options.gemma),
        stacked_transformer_tpl=stack,
        final_ln_tpl=norm(),
    )
    return LanguageModel.HParams.config(lm_tpl=lm)


def _add_experts(cfg: HfConfig, experts: _Experts, stack: config_lib.Config) -> None:
    """Makes ``stack``'s MoE layers (all, or Qwen's choice) blocks whose feed-forward is a
    dropless top-k ``MoeFeedForward`` of the dense one's norm and activation, in place."""
    for field, (what, inert) in _UNSUPPORTED_ROUTING.items():
        if cfg.get(field) is not None and cfg.get(field) not in inert:
            raise cfg.refuse(field, cfg.get(field), f"{what} is not implemented in paxlite")
    count_field = next((f for f in _EXPERT_COUNT if cfg.get(f) is not None), _EXPERT_COUNT[0])
    count, k = cfg.require(count_field), cfg.require("num_experts_per_tok")
    if not 1 <= k <= count:
        raise cfg.refuse(
            "num_experts_per_tok", k, f"it must be between 1 and {count_field}={count}"
        )
    renormalize = cfg.get(experts.renormalize, False) if experts.renormalize else True
    dense_block = stack.block_tpl
    dense_ff = dense_block.tr_fflayer_tpl
    shared = cfg.require("shared_expert_intermediate_size") if experts.shared_expert else 0
    moe_ff = MoeFeedForward.HParams.config(
        num_experts=count,
        num_experts_per_token=k,
        dispatch=Dispatch.DROPLESS,
        top_k_weights=TopKWeights.RENORMALIZED if renormalize else TopKWeights.SOFTMAX,
        use_gated_activation=True,
        activation_tpl=copy.deepcopy(dense_ff.activation_tpl),
        ln_tpl=copy.deepcopy(dense_ff.ln_tpl),
        load_balance_loss_weight=0.0,  # Training sets it (HfCausalLm: router_aux_loss_coef).
        shared_expert_dims=shared,
        shared_expert_gate=bool(shared),
    )
    moe_block = copy.deepcopy(dense_block)
    moe_block.tr_fflayer_tpl = moe_ff
    moe_block.hidden_dims = cfg.require(experts.hidden)
    layers = _moe_layers(cfg, experts, stack.num_layers)
    if len(layers) == stack.num_layers:
        stack.block_tpl = moe_block
    else:
        stack.moe_layers, stack.moe_block_tpl = layers, moe_block


def _moe_layers(cfg: HfConfig, experts: _Experts, num_layers: int) -> tuple[int, ...]:
    """The MoE layers: every one, or (Qwen) those after each ``decoder_sparse_step`` that
    ``mlp_only_layers`` does not keep dense."""
    if not experts.sparse_step:
        return tuple(range(num_layers))
    step = cfg.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise cfg.refuse("decoder_sparse_step", step, "a whole number of at least 1")
    dense = set(cfg.get("mlp_only_layers", []))
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def _gemma2_extras(
    cfg: HfConfig,
    block: config_lib.Config,
    feed_forward: config_lib.Config,
    softmax: config_lib.Config,
    norm: Callable[[], config_lib.Config],
) -> None:
    """Gemma 2's post-norms, soft caps and query scaling, set on the configs in place."""
    block.post_ln_tpl, feed_forward.post_ln_tpl = norm(), norm()
    block.tr_atten_tpl.atten_logit_cap = float(cfg.get("attn_logit_softcapping", 0.0))
    block.tr_atten_tpl.query_scale = float(cfg.require("query_pre_attn_scalar")) ** -0.5
    softmax.soft_cap_logits = float(cfg.get("final_logit_softcapping", 0.0))


def _layer_windows(cfg: HfConfig, default_pattern: Callable[[int], str]) -> tuple[int | None, ...]:
    """Each layer's window from ``layer_types`` ('sliding_attention': ``sliding_window``;
    'full_attention': none), or from ``default_pattern(layer)`` when it is absent."""
    layers = cfg.require("num_hidden_layers")
    types = cfg.get("layer_types") or [default_pattern(i) for i in range(layers)]
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown or len(types) != layers:
        raise cfg.refuse(
            "layer_types", types, f"supported: {layers} of sliding_attention, full_attention"
        )
    window = cfg.get("sliding_window")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _no_sliding_window(cfg: HfConfig) -> None:
    """Qwen's optional per-layer sliding window: refused when on."""
    if cfg.get("use_sliding_window", False):
        raise cfg.refuse("use_sliding_window", True, "supported: false")
    layer_types = set(cfg.get("layer_types", ["full_attention"]))
    if layer_types != {"full_attention"}:
        raise cfg.refuse("layer_types", sorted(layer_types), 'supported: all "full_attention"')


def _llama(cfg: HfConfig) -> config_lib.Config:
    return _llama_like(cfg, _Options())


def _mistral(cfg: HfConfig) -> config_lib.Config:
    window = cfg.get("sliding_window")
    return _llama_like(cfg, _Options(sliding_windows=(window,) * cfg.require("num_hidden_layers")))


#: Qwen's sliding-window settings, read only while use_sliding_window is on (refused).
_QWEN_INERT = frozenset({"sliding_window", "max_window_layers"})


def _qwen2(cfg: HfConfig) -> config_lib.Config:
    _no_sliding_window(cfg)
    return _llama_like(cfg, _Options(qkv_bias=True))


def _qwen3(cfg: HfConfig) -> config_lib.Config:
    _no_sliding_window(cfg)
    return _llama_like(cfg, _Options(qk_norm=True))


def _mixtral(cfg: HfConfig) -> config_lib.Config:
    """Mistral's attention; every feed-forward ``num_local_experts`` SwiGLU experts, each
    token to its top ``num_experts_per_tok`` by a softmax over the chosen logits, with
    ``router_jitter_noise`` in training. MixtralConfig's defaults for what config.json
    leaves out."""
    _default(cfg, rms_norm_eps=1e-5, num_key_value_heads=8)
    if cfg.get("rope_parameters") is None and cfg.get("rope_scaling") is None:
        _default(cfg, rope_theta=1e6)
    window = cfg.get("sliding_window")
    windows = (window,) * cfg.require("num_hidden_layers")
    experts = _Experts("intermediate_size", renormalize=None, sparse_step=False)
    model = _llama_like(cfg, _Options(sliding_windows=windows, experts=experts))
    jitter = float(cfg.get("router_jitter_noise", 0.0))
    model.lm_tpl.stacked_transformer_tpl.block_tpl.tr_fflayer_tpl.input_jitter = jitter
    return model


def _default(cfg: HfConfig, **values: Any) -> None:
    """Fills the fields config.json leaves out with the family's defaults (transformers'
    config class's), in place: they are saved with the model too."""
    for name, value in values.items():
        if cfg.fields.get(name) is None:
            cfg.fields[name] = value


def _qwen2_moe(cfg: HfConfig) -> config_lib.Config:
    """Qwen2's attention (its q/k/v biases per ``qkv_bias``); MoE layers with a shared expert."""
    _no_sliding_window(cfg)
    _default(cfg, num_key_value_heads=16)  # Qwen2MoeConfig's.
    experts = _Experts(shared_expert=True)
    return _llama_like(cfg, _Options(qkv_bias=cfg.get("qkv_bias", True), experts=experts))


def _qwen3_moe(cfg: HfConfig) -> config_lib.Config:
    """Qwen3's attention (q/k norms); MoE layers without a shared expert."""
    _no_sliding_window(cfg)
    _default(cfg, num_key_value_heads=4)  # Qwen3MoeConfig's.
    return _llama_like(cfg, _Options(qk_norm=True, experts=_Experts()))


#: The MoE families' fields that never change a forward pass: the training-time aux loss
#: (HfCausalLm reads ``router_aux_loss_coef`` itself).
_MOE_INERT = frozenset({"output_router_logits", "router_aux_loss_coef"})


#: Gemma's ``hidden_act`` is superseded by ``hidden_activation`` (transformers reads that).
_GEMMA_INERT = frozenset({"hidden_act"})


def _causal_only(cfg: HfConfig) -> None:
    """Gemma's ``use_bidirectional_attention`` (an embedding model's): refused when on."""
    if cfg.get("use_bidirectional_attention", False):
        raise cfg.refuse("use_bidirectional_attention", True, "supported: false")


def _gemma(cfg: HfConfig) -> config_lib.Config:
    _causal_only(cfg)
    return _llama_like(cfg, _Options(gemma=True))


def _gemma2(cfg: HfConfig) -> config_lib.Config:
    _causal_only(cfg)
    windows = _layer_windows(  # transformers' default: even layers windowed, odd ones global.
        cfg, lambda i: "sliding_attention" if (i + 1) % 2 else "full_attention"
    )
    return _llama_like(cfg, _Options(gemma=True, gemma2=True, sliding_windows=windows))


def _gpt2(cfg: HfConfig) -> config_lib.Config:
    """GPT-2: learned positions, LayerNorm with biases, biases everywhere, tied embeddings."""
    d, heads = cfg.require("n_embd"), cfg.require("n_head")
    if cfg.get("scale_attn_by_inverse_layer_idx", False):
        raise cfg.refuse("scale_attn_by_inverse_layer_idx", True, "supported: false")
    if not cfg.get("scale_attn_weights", True):
        raise cfg.refuse("scale_attn_weights", False, "supported: true")
    epsilon = float(cfg.get("layer_norm_epsilon", 1e-5))

    def norm() -> config_lib.Config:
        return LayerNorm.HParams.config(epsilon=epsilon)

    block = Transformer.HParams.config(
        input_dims=d,
        hidden_dims=cfg.get("n_inner") or 4 * d,
        num_heads=heads,
        ln_tpl=norm(),
        tr_atten_tpl=DotProductAttention.HParams.config(use_bias=True),
        tr_fflayer_tpl=TransformerFeedForward.HParams.config(
            use_bias=True,
            activation_tpl=_activation(cfg, "activation_function", "gelu_new"),
            ln_tpl=norm(),
        ),
    )
    lm = TransformerLm.HParams.config(
        model_dims=d,
        vocab_size=cfg.require("vocab_size"),
        softmax_tpl=SharedEmbeddingSoftmax.HParams.config(scale_sqrt_depth=False),
        position_emb_tpl=TrainablePositionalEmbedding.HParams.config(
            max_seq_length=cfg.require("n_positions")
        ),
        stacked_transformer_tpl=StackedTransformer.HParams.config(
            num_layers=cfg.require("n_layer"), block_tpl=block
        ),
        final_ln_tpl=norm(),
    )
    if not cfg.get("tie_word_embeddings", True):
        raise cfg.refuse("tie_word_embeddings", False, "supported: true")
    return LanguageModel.HParams.config(lm_tpl=lm)


def _gpt2_name(stored: str) -> str | None:
    """The Hub's original GPT-2 files name tensors without ``transformer.`` and keep the
    attention's causal-mask buffers (``attn.bias``, ``attn.masked_bias``): not parameters."""
    if stored.endswith((".attn.bias", ".attn.masked_bias")):
        return None
    return stored if stored.startswith(("transformer.", "lm_head.")) else "transformer." + stored


#: GPT-2's training-time and bookkeeping fields (its dropouts, the
#: summary head of its double-heads variant, the attention kernel's upcast choice).
_GPT2_INERT = frozenset(
    {
        "resid_pdrop", "embd_pdrop", "attn_pdrop", "reorder_and_upcast_attn", "n_ctx",
        "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
        "summary_first_dropout", "add_cross_attention", "task_specific_params",
    }
)  # fmt: skip


#: T5's feed_forward_proj -> T5Shape.mlp_activations (HF's gelu here is the tanh one).
_T5_ACTIVATIONS = {
    "relu": ("relu",),
    "gated-gelu": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "gated-silu": ("silu", "linear"),
}
#: T5's training-time and derived fields (``is_gated_act`` and ``dense_act_fn`` follow from
#: ``feed_forward_proj``; ids of special tokens are the generation's).
_T5_INERT = frozenset(
    {
        "dropout_rate", "classifier_dropout", "initializer_factor", "n_positions",
        "is_gated_act", "dense_act_fn", "task_specific_params", "output_past",
        "gradient_checkpointing", "decoder_start_token_id", "max_length",
    }
)  # fmt: skip


def _t5(cfg: HfConfig) -> config_lib.Config:
    """T5's EncoderDecoderModel (``praxis_lite.models.t5``): T5 1.0 (relu, tied) or T5 1.1
    and flan-t5 (gated-gelu, a separate lm_head)."""
    return t5_model(t5_shape_of(cfg), fprop_dtype=jnp.float32, scanned=False)


def t5_shape_of(cfg: HfConfig) -> T5Shape:
    """The sizes and variant of the T5 that ``cfg`` (a ``model_type: t5`` config.json)
    describes; an HfConfigError for what T5's layers here cannot honour."""
    projection = cfg.get("feed_forward_proj", "relu")
    if projection not in _T5_ACTIVATIONS:
        raise cfg.refuse("feed_forward_proj", projection, f"supported: {sorted(_T5_ACTIVATIONS)}")
    if float(cfg.get("layer_norm_epsilon", T5_NORM_EPSILON)) != T5_NORM_EPSILON:
        raise cfg.refuse("layer_norm_epsilon", cfg.get("layer_norm_epsilon"), "supported: 1e-06")
    if cfg.get("is_decoder", False):
        raise cfg.refuse("is_decoder", True, "the encoder-decoder's config says false")
    if cfg.get("decoder_start_token_id", 0) != 0:
        raise cfg.refuse("decoder_start_token_id", cfg.get("decoder_start_token_id"), "T5's 0")
    layers = cfg.require("num_layers")
    return T5Shape(
        num_encoder_layers=layers,
        num_decoder_layers=cfg.get("num_decoder_layers", layers),
        model_dims=cfg.require("d_model"),
        hidden_dims=cfg.require("d_ff"),
        num_heads=cfg.require("num_heads"),
        dims_per_head=cfg.require("d_kv"),
        vocab_size=cfg.require("vocab_size"),
        mlp_activations=_T5_ACTIVATIONS[projection],
        logits_via_embedding=_t5_logits_via_embedding(cfg),
        relative_buckets=cfg.get("relative_attention_num_buckets", 32),
        relative_max_distance=cfg.get("relative_attention_max_distance", 128),
    )


def t5_config(shape: T5Shape) -> dict[str, Any]:
    """The config.json of a ``T5ForConditionalGeneration`` of ``shape`` (the inverse of
    :func:`t5_shape_of`; T5's special ids), e.g. for a model that came from T5X."""
    projection = {v: k for k, v in _T5_ACTIVATIONS.items()}[shape.mlp_activations]
    tied = shape.logits_via_embedding
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "d_model": shape.model_dims,
        "d_kv": shape.dims_per_head,
        "num_heads": shape.num_heads,
        "d_ff": shape.hidden_dims,
        "num_layers": shape.num_encoder_layers,
        "num_decoder_layers": shape.num_decoder_layers,
        "vocab_size": shape.vocab_size,
        "feed_forward_proj": projection,
        "tie_word_embeddings": tied,
        "scale_decoder_outputs": tied,
        "relative_attention_num_buckets": shape.relative_buckets,
        "relative_attention_max_distance": shape.relative_max_distance,
        "layer_norm_epsilon": T5_NORM_EPSILON,
        "is_encoder_decoder": True,
        "decoder_start_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "dropout_rate": 0.0,
    }


def _t5_logits_via_embedding(cfg: HfConfig) -> bool:
    """T5 1.0's logits: the shared table after scaling by ``d_model**-0.5``. transformers 5
    writes ``scale_decoder_outputs`` for it (and ``tie_word_embeddings`` true either way);
    older configs say ``tie_word_embeddings``."""
    tied = bool(cfg.get("tie_word_embeddings", True))
    return bool(cfg.get("scale_decoder_outputs", tied))


def _t5_table(fields: Mapping[str, Any]) -> hf_layout.Table:
    return hf_layout.t5_table(gated=fields.get("feed_forward_proj", "relu").startswith("gated"))


def _t5_name(stored: str) -> str | None:
    """T5's stored names; the stacks' copies of the shared table are no parameters."""
    if stored in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        return None
    return stored


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaForCausalLM", _llama, hf_layout.LLAMA_TABLE),
        Family("mistral", "MistralForCausalLM", _mistral, hf_layout.LLAMA_TABLE),
        Family("qwen2", "Qwen2ForCausalLM", _qwen2, hf_layout.LLAMA_TABLE, _QWEN_INERT),
        Family("qwen3", "Qwen3ForCausalLM", _qwen3, hf_layout.LLAMA_TABLE, _QWEN_INERT),
        Family("gemma", "GemmaForCausalLM", _gemma, hf_layout.LLAMA_TABLE, _GEMMA_INERT),
        Family("gemma2", "Gemma2ForCausalLM", _gemma2, hf_layout.GEMMA2_TABLE, _GEMMA_INERT),
        Family("gpt2", "GPT2LMHeadModel", _gpt2, hf_layout.GPT2_TABLE, _GPT2_INERT, _gpt2_name),
        Family(
            "mixtral",
            "MixtralForCausalLM",
            _mixtral,
            hf_layout.MIXTRAL_TABLE,
            _MOE_INERT,
            mixture_of_experts=True,
        ),
        Family(
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            _qwen2_moe,
            hf_layout.QWEN_MOE_TABLE,
            _MOE_INERT | _QWEN_INERT,
            mixture_of_experts=True,
        ),
        Family(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            _qwen3_moe,
            hf_layout.QWEN_MOE_TABLE,
            _MOE_INERT | _QWEN_INERT,
            mixture_of_experts=True,
        ),
        Family(
            "t5",
            "T5ForConditionalGeneration",
            _t5,
            hf_layout.t5_table(gated=True),
            _T5_INERT,
            _t5_name,
            _t5_table,
        ),
    )
}


def scanned(model: config_lib.Config, **stack_fields: Any) -> config_lib.Config:
    """``model`` (a family's LanguageModel config) with its blocks in a scanned stack
    (``StackedTransformerRepeated``: one compiled block, remat by its ``checkpoint_policy``,
    ``stack_fields``); its weights read and saved under the same Hugging Face names.

    Raises:
      HfConfigError: the blocks differ (Gemma 2's per-layer sliding windows, Qwen-MoE's
        dense layers among MoE ones).
    """
    plain = model.lm_tpl.stacked_transformer_tpl
    reason = why_not_scannable(model)
    if reason:
        raise HfConfigError(
            f"{reason}, so the layers cannot be one scanned block; keep the plain stack "
            "(USE_REPEATED_LAYER=False)."
        )
    block = copy.deepcopy(plain.block_tpl)
    if plain.sliding_windows:
        block.tr_atten_tpl.sliding_window = plain.sliding_windows[0]
    model = copy.deepcopy(model)
    model.lm_tpl.stacked_transformer_tpl = StackedTransformerRepeated.HParams.config(
        num_layers=plain.num_layers, block_tpl=block, **stack_fields
    )
    return model


def why_not_scannable(model: config_lib.Config) -> str | None:
    """Why ``model``'s (a family's LanguageModel config) blocks differ, so that
    :func:`scanned` cannot stack them (Gemma 2's alternating sliding windows, Qwen-MoE's dense
    layers among MoE ones); None when they are alike."""
    plain = model.lm_tpl.stacked_transformer_tpl
    if plain.moe_layers:
        return (
            f"only layers {list(plain.moe_layers)} of the {plain.num_layers} are mixtures of "
            "experts (decoder_sparse_step, mlp_only_layers)"
        )
    if plain.sliding_windows and len(set(plain.sliding_windows)) > 1:
        return "the layers' sliding windows differ (layer_types)"
    return None


def set_router_aux_loss(model: config_lib.Config, coefficient: float) -> int:
    """Gives ``model``'s (a family's LanguageModel config, plain or :func:`scanned`) MoE
    feed-forwards the load-balancing loss weight ``coefficient / M``, ``M`` its MoE layers,
    in place: their losses sum to ``coefficient`` times their mean (transformers computes one
    loss over every layer's routes pooled; both are k x coefficient at perfect balance).
    Returns ``M`` (0: a dense model, nothing set)."""
    stack = model.lm_tpl.stacked_transformer_tpl
    some = stack.__fn_or_cls__ is StackedTransformer and bool(stack.moe_layers)
    moe_block = stack.moe_block_tpl if some else stack.block_tpl
    if moe_block.tr_fflayer_tpl.__fn_or_cls__ is not MoeFeedForward:
        return 0
    layers = len(stack.moe_layers) if some else stack.num_layers
    moe_block.tr_fflayer_tpl.load_balance_loss_weight = coefficient / layers
    return layers


def family_of(cfg: HfConfig) -> Family:
    """The family of ``cfg``'s ``model_type``, or an HfConfigError listing the supported."""
    model_type = cfg.get("model_type")
    if model_type in _UNSUPPORTED_MOE_TYPES:
        raise cfg.refuse(
            "model_type",
            model_type,
            f"{_UNSUPPORTED_MOE_TYPES[model_type]} is not implemented in paxlite; its mixtures "
            f"of experts: {', '.join(n for n, f in FAMILIES.items() if f.mixture_of_experts)}",
        )
    if model_type not in FAMILIES:
        raise cfg.refuse("model_type", model_type, f"supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def build_model(cfg: HfConfig) -> tuple[Family, config_lib.Config]:
    """The family and our model's config for ``cfg``; warns once of fields it does not know."""
    family = family_of(cfg)
    model = family.build(cfg)
    unknown = cfg.unknown(family.inert)
    if unknown:
        logging.warning(
            "%s: ignoring fields paxlite does not know for %s: %s.",
            cfg.path,
            family.model_type,
            ", ".join(unknown),
        )
    return family, model
