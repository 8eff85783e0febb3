"""A Hugging Face directory's model for an experiment: the knob group of both HF experiments.

``HfModelKnobs`` reads ``HF_MODEL``'s ``config.json`` (a config alone is enough: no
weights or tokenizer are read here), builds the model by its family
(``paxlite.formats.hf.models``) with float32 weights and FPROP_DTYPE compute, scanned
unless its layers differ (the model's shape is config.json's: it has no size knobs), and
translates LORA_TARGET_MODULES from Hugging Face's module names. Its experiments:
``tasks.lm.hf.HfCausalLm`` (fine-tuning on text files through SeqIO) and
``tasks.lm.hf_synthetic.HfSyntheticLm`` (synthetic rows: sizing and speed, no data).
This module imports neither SeqIO nor TensorFlow.
"""

from __future__ import annotations

import functools
import json

import jax.numpy as jnp
from absl import logging
from etils import epath

from paxlite.experiments.base_experiment import KnobError, knobs
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.pretrained import export
from paxlite.runtime import mesh_checks
from praxis_lite import config as config_lib
from praxis_lite.moe import MoeFeedForward
from praxis_lite.sharding import (
    EMBED,
    EXPERT,
    FSDP_AND_TENSOR_PARALLEL_RULES,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    MLP,
    TABLE_EMBED,
    VOCAB,
)
from tasks.lm.knob_groups import knob_group
from tasks.lm.lm_cloud import LmTrainer
from tasks.lm.lm_knobs import LmTrainingKnobs, TransformerLmKnobs, WeightSizes

#: Knobs of paxlite's own Transformer LM (``TransformerLmKnobs``, ``MoeKnobs``) a Hugging
#: Face experiment does not have, since config.json sets them -> config.json's field.
_MODEL_FILE_KNOBS = {
    "NUM_LAYERS": "num_hidden_layers",
    "MODEL_DIMS": "hidden_size",
    "HIDDEN_DIMS": "intermediate_size",
    "NUM_HEADS": "num_attention_heads",
    "NUM_KV_HEADS": "num_key_value_heads",
    "DIMS_PER_HEAD": "head_dim",
    "VOCAB_SIZE": "vocab_size",
    "NUM_EXPERTS": "num_local_experts / num_experts",
    "NUM_EXPERTS_PER_TOKEN": "num_experts_per_tok",
    "MOE_HIDDEN_DIMS": "moe_intermediate_size",
}

_TRANSFORMER_KNOBS = frozenset(knobs(TransformerLmKnobs)) - frozenset(knobs(LmTrainingKnobs))


@knob_group
class HfModelKnobs(LmTrainer):
    """The model of a Hugging Face directory's config.json, trained as ``LmTrainer`` trains.

    The model's shape and architecture are config.json's, so the knobs of paxlite's own
    Transformer (NUM_LAYERS, MODEL_DIMS, NORM, NUM_EXPERTS, ...) are not declared here; a
    ``--set`` of one is refused naming config.json's field.

    Attributes (knobs):
      HF_MODEL: the Hugging Face model directory (config.json; safetensors and a
        tokenizer where the experiment reads them).
      ROUTER_AUX_LOSS_COEF: a mixture of experts' load-balancing loss weight in training;
        None: config.json's ``router_aux_loss_coef`` (transformers adds that loss only with
        ``output_router_logits`` true; paxlite always does: set 0 for none). Spread over
        the MoE layers (``hf_models.set_router_aux_loss``).
    """

    HF_MODEL: str | None = None
    ROUTER_AUX_LOSS_COEF: float | None = None

    LOGICAL_AXIS_RULES = FSDP_AND_TENSOR_PARALLEL_RULES  # Weights over 'data' and 'mdl'.
    FPROP_DTYPE = jnp.bfloat16

    def __init__(self) -> None:
        if self.HF_MODEL is None:
            raise KnobError(
                f"{type(self).__qualname__}: HF_MODEL is unset; set --set HF_MODEL=DIR (a Hugging "
                "Face model directory: config.json, safetensors, tokenizer)."
            )
        super().__init__()

    @classmethod
    def undeclared_knob_hint(cls, name: str) -> str:
        """Why a knob of paxlite's own Transformer is not one of this experiment's."""
        if name in _MODEL_FILE_KNOBS or name in _TRANSFORMER_KNOBS:
            field = _MODEL_FILE_KNOBS.get(name)
            where = f" ({field})" if field else ""
            return f"; HF_MODEL's config.json{where} builds the model: leave {name} unset"
        return ""

    @functools.cached_property
    def hf_config(self) -> hf_models.HfConfig:
        """HF_MODEL's config.json (read once)."""
        try:
            return hf_models.HfConfig.load(epath.Path(self.HF_MODEL))
        except hf_models.HfConfigError as e:
            raise KnobError(f"{type(self).__qualname__}: HF_MODEL: {e}") from None

    def vocab_size(self) -> int:
        return self.hf_config.fields["vocab_size"]

    def weight_sizes(self) -> WeightSizes:
        """config.json's sizes, read off the model it builds."""
        _, model = hf_models.build_model(self.hf_config)
        stack = model.lm_tpl.stacked_transformer_tpl
        block = stack.block_tpl
        heads = block.num_heads
        sizes = {
            EMBED: ("config.json's hidden size", block.input_dims),
            TABLE_EMBED: ("config.json's hidden size", block.input_dims),
            MLP: ("config.json's intermediate size", block.hidden_dims),
            HEADS: ("config.json's attention heads", heads),
            KV_HEADS: ("config.json's key/value heads", block.num_kv_heads or heads),
            HEAD_DIM: ("config.json's head dims", block.dims_per_head or block.input_dims // heads),
            VOCAB: ("config.json's vocab_size", model.lm_tpl.vocab_size),
            LAYERS: ("config.json's layers", stack.num_layers),
        }
        moe_block = self._moe_block()
        if moe_block is not None:
            sizes[EXPERT] = ("config.json's experts", moe_block.tr_fflayer_tpl.num_experts)
        return sizes

    def check_model(self, plan: mesh_checks.MeshPlan) -> None:
        """The experts' and the shared expert's hidden dims split evenly too (on 'mlp', as
        the dense feed-forward's)."""
        super().check_model(plan)
        moe_block = self._moe_block()
        if moe_block is None:
            return
        hidden = {
            "expert": moe_block.hidden_dims,
            "shared expert": moe_block.tr_fflayer_tpl.shared_expert_dims,
        }
        for which, size in hidden.items():
            if size:
                plan.check_even_split({MLP: (f"config.json's {which} intermediate size", size)})

    def _moe_block(self) -> config_lib.Config | None:
        """The block config of the MoE layers (None: a dense model)."""
        _, model = hf_models.build_model(self.hf_config)
        stack = model.lm_tpl.stacked_transformer_tpl
        block = stack.moe_block_tpl if stack.moe_layers else stack.block_tpl
        return block if block.tr_fflayer_tpl.__fn_or_cls__ is MoeFeedForward else None

    def model(self) -> config_lib.Config:
        """config.json's model (scanned unless its layers differ): float32 weights, FPROP_DTYPE
        compute, NUM_LOSS_CHUNKS and Z_LOSS_WEIGHT on its softmax."""
        _, model = hf_models.build_model(self.hf_config)
        if self.USE_REPEATED_LAYER:
            reason = hf_models.why_not_scannable(model)
            if reason is None:
                model = hf_models.scanned(model, **self.scan_settings())
            else:
                _say_plain_stack(self.HF_MODEL, reason)
        self._set_router_aux_loss(model)
        self.configure_softmax(model.lm_tpl.softmax_tpl)
        return config_lib.set_dtypes(model, dtype=jnp.float32, fprop_dtype=self.FPROP_DTYPE)

    def _set_router_aux_loss(self, model: config_lib.Config) -> None:
        """ROUTER_AUX_LOSS_COEF (or config.json's) on ``model``'s MoE layers, in place;
        refused for a dense model."""
        coefficient = self.ROUTER_AUX_LOSS_COEF
        if coefficient is None:
            coefficient = float(self.hf_config.fields.get("router_aux_loss_coef") or 0.0)
        if not hf_models.set_router_aux_loss(model, coefficient) and (
            self.ROUTER_AUX_LOSS_COEF is not None
        ):
            raise KnobError(
                f"{type(self).__qualname__}: ROUTER_AUX_LOSS_COEF is set but {self.HF_MODEL} "
                "is no mixture of experts; leave it unset."
            )

    def lora_targets(self) -> tuple[str, ...]:
        """LORA_TARGET_MODULES in Hugging Face's module names (PEFT's default: the family's)."""
        family = hf_models.family_of(self.hf_config)
        try:
            return peft_adapter.lora_targets(family, self.lora_modules())
        except peft_adapter.PeftError as e:
            raise KnobError(f"{type(self).__qualname__}: LORA_TARGET_MODULES: {e}") from None

    def eos_token_id(self) -> int | tuple[int, ...]:
        """The model's EOS id(s): generation_config.json's, else config.json's (no tokenizer
        read, so a config alone sizes the job)."""
        for name in (hf_checkpoint.GENERATION_CONFIG_FILE, hf_models.CONFIG_FILE):
            path = epath.Path(self.HF_MODEL) / name
            eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else eos
        return super().eos_token_id()

    def job_files(self) -> dict[str, str]:
        """HF_MODEL's config, generation config and tokenizer files, kept in the job."""
        return export.kept_files(self.HF_MODEL)


@functools.cache
def _say_plain_stack(hf_model: str, reason: str) -> None:
    """One warning a process that ``hf_model``'s layers keep the plain stack (``reason``:
    why they cannot be scanned), so the scanned stack's remat knobs do not apply."""
    logging.warning(
        "%s: %s: the model keeps the plain stack (USE_REPEATED_LAYER scans alike layers; "
        "CHECKPOINT_POLICY and CHECKPOINT_OFFLOAD_TO_HOST, its remat, do not apply).",
        hf_model,
        reason,
    )
