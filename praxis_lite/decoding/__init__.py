"""Decoding inside jit: prefill and the cached greedy/sampling loop (sampling), beam
search, the cache's rows (decode_cache), Hugging Face's logits controls and stop strings.

May import: only the top-level praxis_lite modules (a model hands its step function in).
"""
