"""Models: the contract the trainer meets every model through (base.BaseModel), the
decoder-only LM (lm), the encoder-decoder (encoder_decoder), the classification MLP
(classification) and T5 as a configuration of the layers (t5).

May import: `praxis_lite.layers`, `praxis_lite.decoding` and the top-level praxis_lite modules.
"""
