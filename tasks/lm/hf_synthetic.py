"""A Hugging Face config's model on synthetic tokens: ``HfSyntheticLm`` with ``HF_MODEL=DIR``.

What MaxText's ``dataset_type=synthetic`` is for: the speed, memory and MFU of a model
before any data or tokenizer exists. The model is ``HF_MODEL``'s config.json built as
``HfCausalLm`` builds it (``tasks.lm.hf_model.HfModelKnobs``: float32 weights and Adam,
FPROP_DTYPE compute, scanned blocks with CHECKPOINT_POLICY's remat, NUM_LOSS_CHUNKS,
LoRA by Hugging Face's module names); a directory holding only config.json is enough,
and its weights are random. The batches are ``SyntheticLmData``'s (LmSyntheticTiny's) rows
over config.json's vocabulary. Neither SeqIO nor TensorFlow is imported, so this runs
where only jax, flax, optax, orbax, fiddle and gin are installed::

    paxlite --exp=HfSyntheticLm --job_log_dir=/tmp/bench --mode=benchmark \\
        --set HF_MODEL=/models/llama-3-8b --set LORA_RANK=16 --set PERCORE_BATCH_SIZE=4
"""

from __future__ import annotations

from paxlite.experiments import registry
from tasks.lm.hf_model import HfModelKnobs
from tasks.lm.synthetic import SyntheticLmData


@registry.register
class HfSyntheticLm(HfModelKnobs, SyntheticLmData):
    """HF_MODEL's config.json model (random weights) trained on synthetic rows."""

    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 1
    LEARNING_RATE = 1e-4
