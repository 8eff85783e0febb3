"""Registered experiments (Pax's names and sizes, plus tiny CPU ones)."""

from praxis_lite import tensorflow_logs

tensorflow_logs.quiet()  # Before any task module imports TensorFlow (SeqIO's tasks).
