"""Optimizers (frozen, Fiddle-configurable dataclasses over optax), learning-rate
schedules, and Adafactor factored by logical axis names (T5X's).

May import: only the top-level praxis_lite modules.
"""
