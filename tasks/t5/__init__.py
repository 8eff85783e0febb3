"""Encoder-decoder (T5) experiments: the model knobs, the family base, tiny CPU ones."""
