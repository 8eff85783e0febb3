"""Trained models in Python: from_pretrained (loading), the Pretrained* classes
(logits, generate, encode, save_pretrained), LoRA adapters on a config and its weights, and
paxlite-export (a fine-tuned Hugging Face model back as a Hugging Face directory).

May import: `paxlite.checkpoints`, `paxlite.cli` (overrides, exits), `paxlite.experiments`,
`paxlite.formats`, `paxlite.runtime`, `paxlite.train` and `praxis_lite`.
"""
