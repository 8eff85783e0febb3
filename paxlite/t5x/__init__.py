"""T5X's commands, for T5X users: ``python -m paxlite.t5x.train`` (``.eval``, ``.infer``)
takes T5X's ``t5x/train.py`` (``eval.py``, ``infer.py``) flags and gin files unchanged and
runs them as a paxlite job (``train``, ``eval``, ``infer``; their shared flags and gin
reading: ``command``; eval's and infer's job and checkpoints: ``inference_run``), and
``convert_tf_checkpoint`` is T5X's script that converts a Mesh TensorFlow checkpoint.

The reading of gin files, T5X's names and their translation are T5X's format
(``paxlite.formats.t5x``); this package is command-line glue, as ``paxlite.main`` is.

May import: `paxlite` (its ``main``: a T5X run is a paxlite run), `paxlite.cli`,
`paxlite.experiments`, `paxlite.formats`, `paxlite.runtime`, `paxlite.checkpoints`,
`paxlite.t5x` and `paxlite.train` (restoring a checkpoint's parameters; a converted one's
train state).
"""
