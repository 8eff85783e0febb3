"""Tiny Hugging Face fixtures (tests/fixtures/hf), made with torch and transformers by hand."""
