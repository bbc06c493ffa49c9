"""infinitrain: train language models on any accelerator that plugs in as a provider.

import infinitrain as it
x = it.randn(4, 8, requires_grad=True)
(x * x).sum().backward()
"""

from infinitrain import _C  # noqa: F401, I001  (the native core loads first)
from infinitrain import tensor_methods  # noqa: F401  (attaches Tensor's op methods)
from infinitrain import composites  # noqa: F401  (registers the fused ops' composites)
from infinitrain import amp, backends, checkpoint, data, distributed, functional, models, nn, ops, optim, profiler
from infinitrain import random
from infinitrain import runtime
from infinitrain.autograd import enable_grad, is_grad_enabled, no_grad
from infinitrain.functional import cat, stack, where
from infinitrain.random import Generator, manual_seed
from infinitrain.runtime import OutOfMemoryError
from infinitrain.tensor import (
    DTYPES,
    Tensor,
    arange,
    empty,
    from_numpy,
    full,
    ones,
    ones_like,
    rand,
    randn,
    tensor,
    zeros,
    zeros_like,
)

__version__ = "0.1.0"

bool_, uint8, int8, int32, int64 = "bool", "uint8", "int8", "int32", "int64"
float16, bfloat16, float32, float64 = "float16", "bfloat16", "float32", "float64"

__all__ = [
    "DTYPES",
    "Generator",
    "OutOfMemoryError",
    "Tensor",
    "amp",
    "backends",
    "checkpoint",
    "data",
    "distributed",
    "models",
    "random",
    "runtime",
    "arange",
    "cat",
    "empty",
    "enable_grad",
    "from_numpy",
    "full",
    "functional",
    "is_grad_enabled",
    "manual_seed",
    "nn",
    "no_grad",
    "ones",
    "ones_like",
    "ops",
    "optim",
    "profiler",
    "rand",
    "randn",
    "stack",
    "tensor",
    "where",
    "zeros",
    "zeros_like",
]
