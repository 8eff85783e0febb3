"""The part of T5's ``t5`` package that T5X's gin files and users' task modules import.

The ``t5`` package pins an older SeqIO and TensorFlow than paxlite's, so it cannot be
installed beside them. Under paxlite's T5X commands, and only when the real ``t5`` is not
installed, ``t5.*`` names these modules (``t5x_modules`` installs them): ``t5.data``
(``data``: the default vocabulary and output features, SeqIO's registries),
``t5.data.preprocessors`` (``preprocessors``: translate, span corruption and its
helpers, i.i.d. denoising, SeqIO's rekey/tokenize), ``t5.data.tasks`` and
``t5.data.mixtures`` (``tasks``, ``mixtures``: the WMT translation tasks and C4's span
corruption and i.i.d. denoising, registered under T5's names and read from TFDS under
``--tfds_data_dir``), and ``t5.evaluation.metrics`` (``metrics``: bleu, rouge, accuracy,
sequence accuracy; bleu and rouge need ``pip install "paxlite[t5]"``). Any other ``t5``
module is one error line naming it.

May import: `paxlite.formats` and `praxis_lite`.
"""
