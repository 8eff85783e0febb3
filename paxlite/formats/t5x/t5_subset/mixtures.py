"""``t5.data.mixtures``: importing it registers T5's tasks (``tasks``), as T5's does."""

from __future__ import annotations

from paxlite.formats.t5x.t5_subset import tasks  # noqa: F401 (registers T5's tasks)
