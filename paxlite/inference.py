"""``paxlite.inference``: the public name of :mod:`paxlite.pretrained.loading`
(``from paxlite.inference import from_pretrained``), kept for the docs and users' code.

This name is the same module object, not a copy: its functions and errors are the ones
``paxlite.pretrained.loading`` defines.
"""

import sys

from paxlite.pretrained import loading

sys.modules[__name__] = loading
