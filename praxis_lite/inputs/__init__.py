"""Inputs: the BaseInput contract (Pax semantics), synthetic inputs, SeqIO inputs for LMs
and seq2seq, their data checks, LM task registration, T5's span corruption and a tiny
SeqIO task the package registers (byte reversal, nothing downloaded).

May import: `praxis_lite.decoding` (stop strings), `praxis_lite.tokenizers` and the top-level
praxis_lite modules.
"""

from praxis_lite import tensorflow_logs

tensorflow_logs.quiet()  # Before any input module imports TensorFlow.
