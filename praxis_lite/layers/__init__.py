"""The praxis_lite layers: each module holds one family of layers.

The names a Pax experiment file reaches through ``from praxis import layers`` are here too
(``layers.GELU``, ``layers.AutodiffCheckpointType.SAVE_NOTHING``, ``layers.Transformer``, ...),
so such a file ports by its imports (docs/pax.md, "Porting a Pax experiment").

May import: only the top-level praxis_lite modules (``flops``: each stack states its layout).
"""

from praxis_lite.layers.activations import GELU, Identity, ReLU, Sigmoid, SiLU, Tanh
from praxis_lite.layers.attentions import DotProductAttention
from praxis_lite.layers.embedding_softmax import (
    Embedding,
    FullSoftmax,
    PositionalEmbedding,
    RotaryPositionalEmbedding,
    SharedEmbeddingSoftmax,
    TrainablePositionalEmbedding,
)
from praxis_lite.layers.normalizations import LayerNorm, RmsNorm
from praxis_lite.layers.pipeline import LayerwiseShardablePipelined
from praxis_lite.layers.repeats import AutodiffCheckpointType, StackedTransformerRepeated
from praxis_lite.layers.transformer_models import TransformerLm
from praxis_lite.layers.transformers import (
    StackedTransformer,
    Transformer,
    TransformerFeedForward,
)

__all__ = [
    "AutodiffCheckpointType",
    "DotProductAttention",
    "Embedding",
    "FullSoftmax",
    "GELU",
    "Identity",
    "LayerNorm",
    "LayerwiseShardablePipelined",
    "PositionalEmbedding",
    "ReLU",
    "RmsNorm",
    "RotaryPositionalEmbedding",
    "SharedEmbeddingSoftmax",
    "Sigmoid",
    "SiLU",
    "StackedTransformer",
    "StackedTransformerRepeated",
    "Tanh",
    "TrainablePositionalEmbedding",
    "Transformer",
    "TransformerFeedForward",
    "TransformerLm",
]
