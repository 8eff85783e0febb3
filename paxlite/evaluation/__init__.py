"""Evaluation and decoding: one eval pass over an input, the decode program, and the
--mode=eval and --mode=decode runs.

May import: `paxlite.experiments`, `paxlite.runtime`, `paxlite.train` (init or restore, the
console log, the run result) and `praxis_lite`.
"""
