"""Other frameworks' checkpoint formats, one module per format and concern.

``pax_layout`` / ``pax_checkpoint``: paxml 1.4's parameter names and checkpoints;
``hf_models`` / ``hf_checkpoint`` / ``hf_tokenizer``: Hugging Face model directories;
``t5x_layout`` / ``t5x_checkpoint``: T5X's legacy (msgpack + tensorstore) checkpoints.
Each registers its checkpoint kinds with ``paxlite.checkpoint_sources``.
"""
