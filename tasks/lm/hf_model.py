"""A Hugging Face directory's model for an experiment: the knob group of both HF experiments.

``HfModelKnobs`` reads ``HF_MODEL``'s ``config.json`` (a config alone is enough: no
weights or tokenizer are read here), builds the model by its family
(``paxlite.formats.hf.models``) with float32 weights and FPROP_DTYPE compute, scanned
unless its layers differ, refuses model knobs that disagree with config.json, and
translates LORA_TARGET_MODULES from Hugging Face's module names. Its experiments:
``tasks.lm.hf.HfCausalLm`` (fine-tuning on text files through SeqIO) and
``tasks.lm.hf_synthetic.HfSyntheticLm`` (synthetic rows: sizing and speed, no data).
This module imports neither SeqIO nor TensorFlow.
"""

from __future__ import annotations

import functools
import json

import jax.numpy as jnp
from etils import epath

from paxlite.experiments.base_experiment import KnobError
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.peft import adapter as peft_adapter
from paxlite.pretrained import export
from praxis_lite import config as config_lib
from praxis_lite.sharding import FSDP_AND_TENSOR_PARALLEL_RULES
from tasks.lm.knob_groups import knob_group
from tasks.lm.lm_cloud import LmCloudSpmd
from tasks.moe.moe_knobs import moe_knobs_set

#: Model knob -> config.json's names for that size (Llama's, then GPT-2's): the model is
#: built with config.json's, so a knob set otherwise is a contradiction.
_SIZE_KNOBS = {
    "NUM_LAYERS": ("num_hidden_layers", "n_layer"),
    "MODEL_DIMS": ("hidden_size", "n_embd"),
    "HIDDEN_DIMS": ("intermediate_size", "n_inner"),
    "NUM_HEADS": ("num_attention_heads", "n_head"),
    "NUM_KV_HEADS": ("num_key_value_heads",),
    "DIMS_PER_HEAD": ("head_dim",),
    "VOCAB_SIZE": ("vocab_size",),
}


@knob_group
class HfModelKnobs(LmCloudSpmd):
    """The model of a Hugging Face directory's config.json, for an LmCloudSpmd-style experiment.

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
        if isinstance(self.HF_MODEL, str):
            self._check_sizes()
            self.VOCAB_SIZE = self.hf_config.fields["vocab_size"]
        super().__init__()

    @functools.cached_property
    def hf_config(self) -> hf_models.HfConfig:
        """HF_MODEL's config.json (read once)."""
        try:
            return hf_models.HfConfig.load(epath.Path(self.HF_MODEL))
        except hf_models.HfConfigError as e:
            raise KnobError(f"{type(self).__qualname__}: HF_MODEL: {e}") from None

    def _check_sizes(self) -> None:
        """KnobError listing each model knob set to other than config.json says."""
        fields = self.hf_config.fields
        differ = []
        for knob, names in _SIZE_KNOBS.items():
            theirs = next((fields[n] for n in names if fields.get(n) is not None), None)
            ours = getattr(type(self), knob, None)
            if theirs is not None and _set_here(type(self), knob) and ours != theirs:
                differ.append(f"{knob}={ours} (config.json: {theirs})")
        if differ:
            raise KnobError(
                f"{type(self).__qualname__}: {self.HF_MODEL}/config.json builds the model, and "
                f"these knobs disagree with it: {'; '.join(differ)}; leave them unset."
            )
        moe = moe_knobs_set(type(self))
        if moe:
            raise KnobError(
                f"{type(self).__qualname__}: {self.HF_MODEL}/config.json builds the model; the "
                f"mixture-of-experts knobs {', '.join(moe)} do not apply to it: leave them unset."
            )

    def model(self) -> config_lib.Config:
        """config.json's model (scanned unless its layers differ): float32 weights, FPROP_DTYPE
        compute, NUM_LOSS_CHUNKS and Z_LOSS_WEIGHT on its softmax."""
        _, model = hf_models.build_model(self.hf_config)
        if self.USE_REPEATED_LAYER:
            model = hf_models.scanned(
                model,
                checkpoint_policy=self.CHECKPOINT_POLICY,
                offload_to_host=self.CHECKPOINT_OFFLOAD_TO_HOST,
            )
        self._set_router_aux_loss(model)
        softmax = model.lm_tpl.softmax_tpl
        softmax.num_chunks, softmax.z_loss_weight = self.NUM_LOSS_CHUNKS, self.Z_LOSS_WEIGHT
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


def _set_here(cls: type, knob: str) -> bool:
    """Whether ``knob`` was given a value below HfModelKnobs (a subclass or ``--set``)."""
    for klass in cls.__mro__:
        if klass is HfModelKnobs:
            return False
        if knob in vars(klass):
            return True
    return False
