"""Hugging Face model directories: families as configurations of our layers (models),
their tensor names and layouts (layout), safetensors read onto a run's shardings and written
(checkpoint), and tiny random models of each family with their tokenizers
(tiny_models, tiny_tokenizers: ``paxlite-tiny-model``).

May import: `paxlite.checkpoints`, `paxlite.cli` (the command's one-line errors),
`paxlite.formats` and `praxis_lite`.
"""
