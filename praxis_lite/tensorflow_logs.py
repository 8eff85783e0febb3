"""TensorFlow's start-up lines, quieted before any module here imports it (SeqIO's data
pipelines): its C++ log below errors (``TF_CPP_MIN_LOG_LEVEL``) and the "oneDNN custom
operations are on" notice (``TF_ENABLE_ONEDNN_OPTS``). What the user set wins.

TensorFlow 2.19 and later print "Could not find cuda drivers" (``cudart_stub``) on a host
without CUDA whatever these say (tensorflow/tensorflow#100442); runs that read no SeqIO or
text data never import TensorFlow.
"""

from __future__ import annotations

import os


def quiet() -> None:
    """Sets TensorFlow's logging variables where the user has not (before its import)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
