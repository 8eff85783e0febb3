"""Checkpoints: orbax saves and restores of the train state (train_checkpoints; failed
background writes seen as they fail: commit_watch), each
host's input position (input_positions), the registry of checkpoint kinds a run can read
parameters from (checkpoint_sources), and Pax's loading rules (init_from).

May import: `paxlite.runtime`, `paxlite.experiments` (the loading rules type), `paxlite.train`
(the train state, the console log, the prefetched batches), `paxlite.formats` (init_from
imports each format so its kinds are registered) and `praxis_lite`.
"""
