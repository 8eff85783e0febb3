"""Registered experiments (Pax's names and sizes, plus tiny CPU ones)."""
