"""T5X: parameter names and layouts (layout), checkpoints legacy and orbax (checkpoint),
and config.gin read for the model it describes (gin).

May import: `paxlite.checkpoints`, `paxlite.formats`, `paxlite.runtime` and `praxis_lite`.
"""
