"""Neural-network building blocks with PyTorch's names."""

from infinitrain.nn import functional
from infinitrain.nn.modules import (
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    Module,
    ModuleList,
    Parameter,
    RMSNorm,
    Sequential,
)

__all__ = [
    "Dropout",
    "Embedding",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "Parameter",
    "RMSNorm",
    "Sequential",
    "functional",
]
