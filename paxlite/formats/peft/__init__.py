"""PEFT: LoRA adapter directories read onto a run's adapters and written from them.

May import: `paxlite.checkpoints`, `paxlite.formats` and `praxis_lite`.
"""
