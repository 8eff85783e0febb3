"""Evaluation and decoding: one eval pass over an input, the decode program, and the
--mode=eval and --mode=decode runs.

May import: paxlite.runtime, paxlite.train (state and steps) and praxis_lite."""
