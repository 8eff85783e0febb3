"""T5X: parameter names and layouts (layout), checkpoints legacy and orbax (checkpoint),
config.gin read for the model it describes (gin), and T5X's gin runs: the files and their
includes indexed (gin_sources), read by gin-config under T5X's module names (gin_run,
t5x_modules; T5X's configurables in ``api/``, T5's data package subset in ``t5_subset/``),
turned into the knobs of a paxlite experiment (translation); paxlite's copies of T5X's
standard gin files (gin_files, ``gin_configs/``); a run's MODEL_DIR as T5X lays it out:
``checkpoint_<step>/`` and model-info.txt (model_dir), TensorBoard runs and names
(summaries); T5X's eval and infer: its model functions on paxlite's model (inference),
seqio's evaluator with T5X's outputs (inference_eval), infer's output files (infer_files); a
checkpoint step written in T5X's legacy format an array at a time (legacy_writer).
``paxlite.t5x.train``, ``.eval`` and ``.infer`` are the commands.

May import: `paxlite.checkpoints`, `paxlite.evaluation` (the decode function),
`paxlite.experiments` (the loading rules type), `paxlite.formats`, `paxlite.runtime`,
`paxlite.train` (the train state and steps) and `praxis_lite`.
"""
