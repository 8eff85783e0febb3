"""``t5x.gin_utils``: the config summary a run writes (``MODEL_DIR/config.gin``)."""

from __future__ import annotations

from typing import Any

import gin

#: The file T5X (and paxlite's T5X commands) write into the model directory.
CONFIG_FILE = "config.gin"


def summarize_gin_config(model_dir: str, summary_writer: Any = None, step: int = 0) -> str:
    """T5X's config summary: the text written to ``model_dir/config.gin``
    (``gin.config_str()``). paxlite writes it with the job's other files, once the run's
    checks have passed."""
    del model_dir, summary_writer, step
    return gin.config_str()
