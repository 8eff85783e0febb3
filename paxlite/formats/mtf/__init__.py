"""Mesh TensorFlow's T5 checkpoints (the T5 library's ``model.ckpt-<step>``, e.g.
``gs://t5-data/pretrained_models/t5.1.1.base/model.ckpt-1000000``): the TensorFlow bundle
found and read a tensor at a time (bundle), MTF's names and layouts for paxlite's T5 (layout),
``operative_config.gin`` read for what shapes cannot say (operative_config), and the
registered checkpoint kind with the T5 its tensors describe (checkpoint).

May import: `paxlite.checkpoints`, `paxlite.formats`, `paxlite.runtime` and `praxis_lite`.
"""
