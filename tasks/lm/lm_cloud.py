"""The decoder-only LM family base (Pax's ``LmCloudSpmd``): knobs -> task config.

Leaves set knobs (sizes, batch, mesh) and ``datasets()``; everything else is
derived here through the pure builders of ``model_params``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from paxlite.base_experiment import BaseExperiment
from praxis_lite.layers.repeats import RematPolicy
from tasks.lm import model_params
from tasks.lm.model_params import Activation, Norm


class LmCloudSpmd(BaseExperiment):
    """Family base of dense decoder-only LMs trained with Adam.

    Attributes (knobs): model shape (NUM_LAYERS, MODEL_DIMS, HIDDEN_DIMS,
    NUM_HEADS, NUM_KV_HEADS, DIMS_PER_HEAD, VOCAB_SIZE, MAX_SEQ_LEN), block
    choices (ACTIVATION, USE_GATED_ACTIVATION, NORM, USE_ROTARY_POSITION_EMB,
    USE_BIAS, USE_REPEATED_LAYER, REMAT_POLICY, DROPOUT_PROB, FPROP_DTYPE),
    optimizer (LEARNING_RATE, WEIGHT_DECAY, ADAM_BETA1/2, ADAM_EPSILON,
    CLIP_GRADIENT_NORM_TO_VALUE, LR_WARMUP_STEPS, LR_COS_MIN_RATIO) and loop
    (NUM_TRAIN_STEPS, SAVE_INTERVAL_STEPS, SUMMARY_INTERVAL_STEPS,
    EVAL_INTERVAL_STEPS, MAX_TO_KEEP).
    """

    NUM_LAYERS: int
    MODEL_DIMS: int
    HIDDEN_DIMS: int
    NUM_HEADS: int
    NUM_KV_HEADS: int | None = None
    DIMS_PER_HEAD: int | None = None
    VOCAB_SIZE: int = 32000
    MAX_SEQ_LEN: int = 1024
    ACTIVATION: Activation = Activation.GELU
    USE_GATED_ACTIVATION: bool = False
    NORM: Norm = Norm.LAYER_NORM
    USE_ROTARY_POSITION_EMB: bool = True
    USE_BIAS: bool = True
    USE_REPEATED_LAYER: bool = True
    REMAT_POLICY: RematPolicy = RematPolicy.SAVE_NOTHING
    DROPOUT_PROB: float = 0.0
    FPROP_DTYPE: Any = jnp.bfloat16
    SOFT_CAP_LOGITS: float = 0.0
    Z_LOSS_WEIGHT: float = 0.0

    LEARNING_RATE: float = 2.5e-4
    WEIGHT_DECAY: float = 1e-3
    ADAM_BETA1: float = 0.9
    ADAM_BETA2: float = 0.99
    ADAM_EPSILON: float = 1e-6
    CLIP_GRADIENT_NORM_TO_VALUE: float = 1.0
    LR_WARMUP_STEPS: int = 4000
    LR_COS_MIN_RATIO: float = 0.1

    NUM_TRAIN_STEPS: int = 500_000
    SAVE_INTERVAL_STEPS: int = 5000
    SUMMARY_INTERVAL_STEPS: int = 100
    EVAL_INTERVAL_STEPS: int = 0
    MAX_TO_KEEP: int = 10

    def model(self) -> Any:
        """The LanguageModel config from the model knobs."""
        return model_params.transformer_lm(
            num_layers=self.NUM_LAYERS,
            model_dims=self.MODEL_DIMS,
            hidden_dims=self.HIDDEN_DIMS,
            num_heads=self.NUM_HEADS,
            num_kv_heads=self.NUM_KV_HEADS,
            dims_per_head=self.DIMS_PER_HEAD,
            vocab_size=self.VOCAB_SIZE,
            activation=self.ACTIVATION,
            use_gated_activation=self.USE_GATED_ACTIVATION,
            norm=self.NORM,
            use_rotary_position_emb=self.USE_ROTARY_POSITION_EMB,
            use_bias=self.USE_BIAS,
            use_repeated_layer=self.USE_REPEATED_LAYER,
            remat_policy=self.REMAT_POLICY,
            dropout_prob=self.DROPOUT_PROB,
            soft_cap_logits=self.SOFT_CAP_LOGITS,
            z_loss_weight=self.Z_LOSS_WEIGHT,
            fprop_dtype=self.FPROP_DTYPE,
        )

    def task(self) -> Any:
        learner = model_params.adam_learner(
            learning_rate=self.LEARNING_RATE,
            weight_decay=self.WEIGHT_DECAY,
            beta1=self.ADAM_BETA1,
            beta2=self.ADAM_BETA2,
            epsilon=self.ADAM_EPSILON,
            clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE,
            warmup_steps=self.LR_WARMUP_STEPS,
            decay_start=self.LR_WARMUP_STEPS,
            decay_end=self.NUM_TRAIN_STEPS,
            min_ratio=self.LR_COS_MIN_RATIO,
        )
        return model_params.single_task(
            self.model(),
            learner,
            num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.SAVE_INTERVAL_STEPS,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS,
            max_to_keep=self.MAX_TO_KEEP,
        )


def bfloat16_compute(task_cfg: Any) -> None:
    """Fiddler: float32 weights, bfloat16 compute everywhere in the model."""
    from praxis_lite import config as config_lib

    config_lib.set_dtypes(task_cfg.model, fprop_dtype=jnp.bfloat16)
