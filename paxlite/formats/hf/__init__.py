"""Hugging Face model directories: families as configurations of our layers (models),
their tensor names and layouts (layout), safetensors read onto a run's shardings and written
(checkpoint).

May import: `paxlite.checkpoints`, `paxlite.formats` and `praxis_lite`.
"""
