"""T5X's configurables under T5X's module names, for T5X's gin files.

A gin file's ``from t5x import utils`` imports ``t5x.utils``; under paxlite's T5X commands
that name is this package's ``utils`` (``t5x_modules`` installs the names), so gin itself
registers, scopes and calls these stand-ins. Each keeps T5X's signature and defaults and
records what it was given; ``translation`` turns the recorded call of the train script
(``train_script.train``) into a paxlite run. Modules: ``utils``, ``models``, ``adafactor``,
``optimizers``, ``partitioning``, ``trainer``, ``gin_utils``, ``decoding``, ``network``
(``t5x.examples.t5.network``), ``train_script``, ``eval_script`` and ``infer_script`` (gin's
``__main__``) and ``convert_script`` (``convert_checkpoint`` of T5X's
``scripts/convert_tf_checkpoint.py``).

May import: `paxlite.formats` and `praxis_lite`.
"""
