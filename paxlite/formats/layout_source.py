"""A checkpoint source whose arrays a name-and-layout table places (``hf_layout.Row``s:
Hugging Face's and T5X's): each run leaf is one array of theirs, or one per layer of a
scanned stack and per expert, in the table's layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paxlite.checkpoints import checkpoint_sources
from paxlite.checkpoints.checkpoint_sources import Variable
from paxlite.formats.hf import layout as hf_layout


class LayoutSource(checkpoint_sources.PartsSource):
    """A :class:`checkpoint_sources.PartsSource` whose ``_leaf_parts`` give each run leaf's
    ``hf_layout.Named`` place: a run leaf's variables have the shape of their array (one
    layer's and expert's) and the run's dtype."""

    def run_names(self, run_params: Mapping[str, Any]) -> dict[str, Variable]:
        out = {}
        for path, where, names in self._leaf_parts(run_params):
            shape = tuple(run_params[path].shape)[where.split_dims :]
            variable = Variable(
                hf_layout.their_shape(where, shape), np.dtype(run_params[path].dtype)
            )
            out.update(dict.fromkeys(names, variable))
        return out
