"""LoRA fine-tuning knobs (PEFT's ``LoraConfig`` names): adapters on chosen projections, the
rest of the model frozen.

``LORA_RANK > 0`` turns them on: every attention and feed-forward layer of the model gets
``praxis_lite.layers.lora.LoraSettings`` on the projections LORA_TARGET_MODULES names, and
the learner trains the adapters only (``bprop_variable_inclusion``, ``paxlite.train.trainable``)::

    paxlite --exp=tasks.lm.hf.HfCausalLm --set HF_MODEL=/models/llama --set LORA_RANK=16 \\
        --set LORA_ALPHA=32 --set LORA_TARGET_MODULES=q_proj,k_proj,v_proj,o_proj ...

Target names are the model's own: praxis's for paxlite's LMs (``query``, ``key``,
``value``, ``post``, ``ffn_layer1``, ``ffn_layer1_gate``, ``ffn_layer2``), Hugging Face's
module names for ``HfCausalLm`` (``q_proj``, ``c_attn``, ...). ``all-linear`` is every
projection of the blocks (never the output head), as in PEFT.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from praxis_lite import config as config_lib
from praxis_lite.layers.lora import ADAPTER_PATTERN, LoraSettings
from praxis_lite.layers.lora_targets import (
    ATTENTION_TARGETS,
    FEED_FORWARD_TARGETS,
    FUSED_QKV,
    set_lora,
)
from tasks.lm.knob_groups import knob_group

ALL_LINEAR = "all-linear"
#: What the learner trains under LoRA: the adapters, by their variable names.
ADAPTERS_ONLY = ("params/" + ADAPTER_PATTERN,)
_BASE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@knob_group
class LoraKnobs(BaseExperiment):
    """LoRA adapters (PEFT's meaning of each knob).

    Attributes:
      LORA_RANK: the adapters' rank ``r``; 0: no LoRA (the whole model trains).
      LORA_ALPHA: PEFT's ``lora_alpha``: the update is scaled by ``alpha / r``.
      LORA_DROPOUT: dropout on the adapters' input while training.
      LORA_TARGET_MODULES: comma-separated projection names, or ``all-linear``; empty:
        the model's default (PEFT's: q and v).
      LORA_USE_RSLORA: scale by ``alpha / sqrt(r)`` (rsLoRA).
      LORA_BASE_DTYPE: the frozen weights' dtype (``bfloat16`` halves them); None: the
        model's own (float32). The adapters stay float32.
    """

    LORA_RANK: int = 0
    LORA_ALPHA: float = 8.0
    LORA_DROPOUT: float = 0.0
    LORA_TARGET_MODULES: str = ""
    LORA_USE_RSLORA: bool = False
    LORA_BASE_DTYPE: str | None = None

    def validate(self) -> None:
        super().validate()
        name = type(self).__qualname__
        if self.LORA_RANK < 0:
            raise KnobError(f"{name}: LORA_RANK={self.LORA_RANK} must be >= 0 (0: no LoRA).")
        if not self.LORA_RANK:
            return
        if self.LORA_ALPHA <= 0:
            raise KnobError(f"{name}: LORA_ALPHA={self.LORA_ALPHA} must be > 0.")
        if not 0 <= self.LORA_DROPOUT < 1:
            raise KnobError(f"{name}: LORA_DROPOUT={self.LORA_DROPOUT} must be in [0, 1).")
        if self.LORA_BASE_DTYPE is not None and self.LORA_BASE_DTYPE not in _BASE_DTYPES:
            raise KnobError(
                f"{name}: LORA_BASE_DTYPE={self.LORA_BASE_DTYPE!r}; choose one of "
                f"{', '.join(_BASE_DTYPES)} (or leave it unset: the model's own)."
            )
        self.lora_targets()

    def lora_modules(self) -> list[str]:
        """LORA_TARGET_MODULES as a list (empty: none given)."""
        return [m.strip() for m in self.LORA_TARGET_MODULES.split(",") if m.strip()]

    def lora_targets(self) -> tuple[str, ...]:
        """Our layers' target names for LORA_TARGET_MODULES (subclasses of other families
        translate their own names).

        Raises:
          KnobError: a name the model has no projection for.
        """
        modules = self.lora_modules() or ["query", "value"]
        if modules == [ALL_LINEAR]:
            return ATTENTION_TARGETS + FEED_FORWARD_TARGETS
        valid = ATTENTION_TARGETS + FEED_FORWARD_TARGETS + (FUSED_QKV,)
        unknown = [m for m in modules if m not in valid]
        if unknown:
            raise KnobError(
                f"{type(self).__qualname__}: LORA_TARGET_MODULES names {', '.join(unknown)}, "
                f"which this model does not have; choose from {', '.join(valid)} or "
                f"{ALL_LINEAR}."
            )
        return tuple(modules)

    def lora_settings(self, targets: tuple[str, ...]) -> config_lib.Config:
        """The LoraSettings config of these knobs for a layer's ``targets``."""
        return config_lib.Config(
            LoraSettings,
            rank=self.LORA_RANK,
            alpha=float(self.LORA_ALPHA),
            dropout_prob=self.LORA_DROPOUT,
            use_rslora=self.LORA_USE_RSLORA,
            targets=targets,
        )

    def with_lora(self, task: Any) -> Any:
        """``task`` with adapters on the model's targeted projections and a learner that
        trains them only; unchanged when LORA_RANK is 0."""
        if not self.LORA_RANK:
            return task
        if self.LORA_BASE_DTYPE is not None:
            config_lib.set_dtypes(task.model, dtype=_BASE_DTYPES[self.LORA_BASE_DTYPE])
        set_lora(task.model, self.lora_targets(), self.lora_settings)
        task.learner.bprop_variable_inclusion = ADAPTERS_ONLY
        return task
