"""Mixture of experts: the MoE feed-forward layer, its routing and its dispatch.

``layer`` (``MoeFeedForward``, a block's ``tr_fflayer_tpl``), ``routing`` (GShard's top-2
with groups and a capacity, exactly as praxis 1.4.0; dropless top-k; the auxiliary
losses) and ``dispatch`` (dropless: routes sorted by expert, grouped matmuls).

May import: `praxis_lite.layers` (the activations and norms the experts use).
"""

from praxis_lite.moe.layer import Dispatch, MoeFeedForward
from praxis_lite.moe.routing import SecondExpertPolicy, TopKWeights

__all__ = ["Dispatch", "MoeFeedForward", "SecondExpertPolicy", "TopKWeights"]
