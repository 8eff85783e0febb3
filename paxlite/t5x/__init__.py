"""T5X's commands, for T5X users: ``python -m paxlite.t5x.train`` takes T5X's ``t5x/train.py``
flags and gin files unchanged and runs them as a paxlite job (``train``).

The reading of gin files, T5X's names and their translation are T5X's format
(``paxlite.formats.t5x``); this package is command-line glue, as ``paxlite.main`` is.

May import: `paxlite` (its ``main``: a T5X run is a paxlite run), `paxlite.cli`,
`paxlite.experiments`, `paxlite.formats`, `paxlite.runtime` and `paxlite.checkpoints`.
"""
