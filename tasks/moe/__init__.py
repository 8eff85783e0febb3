"""Mixture-of-experts experiments: the MoE knob group (``moe_knobs``, mixed into every
decoder-only LM's knobs) and MoE LMs at real sizes on synthetic tokens (``synthetic``)."""
