"""Tokenizers: Hugging Face tokenizer directories (hf_tokenizer) and their chat
templates (hf_chat).

May import: only the top-level praxis_lite modules.
"""
