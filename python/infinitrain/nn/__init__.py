"""Neural-network building blocks with PyTorch's names."""

from infinitrain.nn import functional, init, utils
from infinitrain.nn.activation import (
    ELU,
    GLU,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    Mish,
    MultiheadAttention,
    Softplus,
)
from infinitrain.nn.conv import Conv1d, Conv2d
from infinitrain.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    NLLLoss,
    SmoothL1Loss,
)
from infinitrain.nn.modules import (
    GELU,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    LogSoftmax,
    Module,
    ModuleDict,
    ModuleList,
    MSELoss,
    Parameter,
    ParameterDict,
    ParameterList,
    ReLU,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Unflatten,
)
from infinitrain.nn.normalization import GroupNorm

__all__ = [
    "BCELoss",
    "BCEWithLogitsLoss",
    "Conv1d",
    "Conv2d",
    "CosineEmbeddingLoss",
    "CrossEntropyLoss",
    "Dropout",
    "ELU",
    "Embedding",
    "Flatten",
    "GELU",
    "GLU",
    "GroupNorm",
    "Hardtanh",
    "HuberLoss",
    "Identity",
    "KLDivLoss",
    "L1Loss",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSigmoid",
    "LogSoftmax",
    "MSELoss",
    "Mish",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiheadAttention",
    "NLLLoss",
    "Parameter",
    "ParameterDict",
    "ParameterList",
    "RMSNorm",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "SmoothL1Loss",
    "Softmax",
    "Softplus",
    "Tanh",
    "Unflatten",
    "functional",
    "init",
    "utils",
]


def __getattr__(name):
    # nn.parallel (DistributedDataParallel) sits above infinitrain.distributed, which imports nn: loaded on use.
    if name == "parallel":
        import importlib

        return importlib.import_module("infinitrain.nn.parallel")
    raise AttributeError(f"module 'infinitrain.nn' has no attribute '{name}'")
