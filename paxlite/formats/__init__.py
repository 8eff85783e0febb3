"""Other frameworks' checkpoint formats, one package per format.

``hf/``: Hugging Face model directories (families as configs of our layers, names and layouts,
safetensors); ``pax/``: paxml 1.4's parameter names and checkpoints; ``t5x/``: T5X's names,
checkpoints (legacy msgpack + tensorstore, and orbax) and config.gin; ``peft/``: PEFT's LoRA
adapter directories. ``layout_source``: a checkpoint source placed by a name-and-layout table.
Each format registers its checkpoint kinds with ``paxlite.checkpoints.checkpoint_sources``.

May import: `paxlite.checkpoints`, `paxlite.experiments` (the loading rules type),
`paxlite.formats` (one format reads another's: PEFT's adapters name Hugging Face's tensors),
`paxlite.runtime`, `paxlite.train` (the train state) and `praxis_lite`.
"""
