"""paxml 1.4: the names and layouts of praxis' Transformer LM parameters (layout) and
paxml's checkpoints as a checkpoint kind (checkpoint).

May import: `paxlite.checkpoints`, `paxlite.runtime` and `praxis_lite`.
"""
