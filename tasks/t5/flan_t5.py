"""Flan-T5 under T5X's names: T5 1.1's sizes with T5X's fine-tuning setup.

``configs/runs/finetune.gin`` on ``t5_1_1/{small,...,xxl}.gin``: a constant learning
rate of 1e-3, dropout 0.1, the rest as the T5 1.1 family (Adafactor, z-loss, the loss
summed over tokens, batch 128). Meant to start from a Flan-T5 checkpoint (``--init_from``)
and to fine-tune on your SeqIO task, registered by your own module::

    paxlite --exp=tasks.t5.flan_t5.FlanT5Base --job_log_dir=/tmp/flan_base \\
        --init_from=/ckpts/flan_t5_base/checkpoint_1184000 \\
        --set MIXTURE_OR_TASK_NAME=my_task --set MIXTURE_OR_TASK_MODULE=my_tasks \\
        --set "TASK_FEATURE_LENGTHS={'inputs': 512, 'targets': 128}"
"""

from __future__ import annotations

from paxlite.experiments import registry
from tasks.lm.knob_groups import knob_group
from tasks.t5.t5_1_1 import T5v11Base, T5v11Large, T5v11Small, T5v11Spmd, T5v11Xl, T5v11Xxl
from tasks.t5.t5x_setup import T5xLrSchedule


@knob_group
class FlanT5Finetune(T5v11Spmd):
    """T5X's fine-tuning setup on the T5 1.1 family (``runs/finetune.gin``); the task is
    yours (MIXTURE_OR_TASK_NAME, required), decoded and scored at each eval."""

    LEARNING_RATE = 1e-3
    LR_SCHEDULE = T5xLrSchedule.CONSTANT
    LR_WARMUP_STEPS = 1000
    DROPOUT_PROB = 0.1
    MIXTURE_OR_TASK_NAME = None
    DECODE_VALIDATION = True
    NUM_TRAIN_STEPS = 20_000
    CHECKPOINT_EVERY_N_STEPS = 5000


@registry.register
class FlanT5Small(FlanT5Finetune, T5v11Small):
    """Flan-T5 Small (``t5_1_1/small.gin``; T5X's flan_t5_small/checkpoint_1198000)."""


@registry.register
class FlanT5Base(FlanT5Finetune, T5v11Base):
    """Flan-T5 Base (``t5_1_1/base.gin``; flan_t5_base/checkpoint_1184000)."""


@registry.register
class FlanT5Large(FlanT5Finetune, T5v11Large):
    """Flan-T5 Large (``t5_1_1/large.gin``; flan_t5_large/checkpoint_1164000)."""


@registry.register
class FlanT5Xl(FlanT5Finetune, T5v11Xl):
    """Flan-T5 XL (``t5_1_1/xl.gin``; flan_t5_xl/checkpoint_1138000)."""


@registry.register
class FlanT5Xxl(FlanT5Finetune, T5v11Xxl):
    """Flan-T5 XXL, 11B (``t5_1_1/xxl.gin``; flan_t5_xxl/checkpoint_1114000)."""
