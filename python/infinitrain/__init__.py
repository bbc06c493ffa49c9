"""infinitrain: train language models on any accelerator that plugs in as a provider.

import infinitrain as it
x = it.randn(4, 8, requires_grad=True)
(x * x).sum().backward()
"""

import os as _os


def _preload_blas():
    """Loads the scipy-openblas32 wheel's OpenBLAS (the core links it by soname) before the core, with
    OPENBLAS_NUM_THREADS=1 while it initialises: its thread pool would otherwise start one idle thread per
    core, and the kernels thread with OpenMP instead (infinitrain/kernels/cpu/blas.h)."""
    import ctypes

    old = _os.environ.get("OPENBLAS_NUM_THREADS")
    _os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before the import: importing the package loads the library
    try:
        import scipy_openblas32

        ctypes.CDLL(_os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so"), mode=ctypes.RTLD_GLOBAL)
    except ImportError:
        pass  # the dynamic loader then looks for it by soname and names it if it is missing
    finally:
        if old is None:
            del _os.environ["OPENBLAS_NUM_THREADS"]
        else:
            _os.environ["OPENBLAS_NUM_THREADS"] = old


_preload_blas()
try:
    from infinitrain import _C  # noqa: F401, I001  (the native core loads first)
except ImportError as _e:
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if not any(n.startswith("_C.") and n.endswith(".so") for n in _os.listdir(_here)):
        raise ImportError(
            f"infinitrain's native core (_C.so) is not built in {_here}: run `./bazelw run //python:develop` "
            "in the checkout (it builds the core and installs the package into .venv; add --config=sim for the "
            "sim provider), then use .venv/bin/python; or install the wheel from `./bazelw build //python:wheel`"
        ) from None
    raise ImportError(f"infinitrain's native core failed to load: {_e}") from _e
from infinitrain import (
    amp,
    backends,
    checkpoint,
    composites,  # noqa: F401  (registers the fused ops' composites)
    data,
    distributed,
    functional,
    models,
    nn,
    ops,
    optim,
    profiler,
    random,
    runtime,
    tensor_methods,  # noqa: F401  (attaches Tensor's op methods)
)
from infinitrain.amp import GradScaler, autocast
from infinitrain.autograd import enable_grad, is_grad_enabled, no_grad
from infinitrain.functional import (
    abs,
    amax,
    amin,
    argmax,
    argmin,
    cat,
    clamp,
    cos,
    exp,
    gather,
    index_select,
    log,
    log_softmax,
    matmul,
    maximum,
    mean,
    minimum,
    multinomial,
    relu,
    rsqrt,
    sigmoid,
    sin,
    softmax,
    sqrt,
    stack,
    std,
    sum,
    tanh,
    topk,
    tril,
    triu,
    var,
    where,
)
from infinitrain.random import Generator, manual_seed
from infinitrain.runtime import OutOfMemoryError
from infinitrain.serialization import load, save
from infinitrain.tensor import (
    DTYPES,
    Tensor,
    arange,
    empty,
    empty_like,
    from_numpy,
    full,
    full_like,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    randperm,
    tensor,
    zeros,
    zeros_like,
)

__version__ = "0.1.0"

# dtypes are their names (strings); PyTorch's aliases name the same ones.
uint8, int8, int32, int64 = "uint8", "int8", "int32", "int64"
float16, bfloat16, float32, float64 = "float16", "bfloat16", "float32", "float64"
bool_, long, half, double = "bool", "int64", "float16", "float64"
# `it.bool`, `it.int` and `it.float` would shadow builtins inside this file, so they are set this way.
globals().update({"bool": "bool", "int": "int32", "float": "float32"})


def device(name):
    """A device name in canonical form ('cpu', 'sim:0'); devices are strings here."""
    return runtime.parse_device(name)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def is_floating_point(t):
    return t.is_floating_point()


def numel(t):
    return t.numel()


def flatten(t, start_dim=0, end_dim=-1):
    return t.flatten(start_dim, end_dim)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    import numpy as np

    return bool(np.allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, equal_nan=equal_nan))


__all__ = [
    "DTYPES",
    "Generator",
    "GradScaler",
    "OutOfMemoryError",
    "Tensor",
    "abs",
    "allclose",
    "amax",
    "amin",
    "amp",
    "arange",
    "argmax",
    "argmin",
    "autocast",
    "backends",
    "cat",
    "checkpoint",
    "clamp",
    "cos",
    "data",
    "device",
    "distributed",
    "empty",
    "empty_like",
    "enable_grad",
    "exp",
    "flatten",
    "from_numpy",
    "full",
    "full_like",
    "functional",
    "gather",
    "index_select",
    "is_floating_point",
    "is_grad_enabled",
    "is_tensor",
    "load",
    "log",
    "log_softmax",
    "manual_seed",
    "matmul",
    "maximum",
    "mean",
    "minimum",
    "models",
    "multinomial",
    "nn",
    "no_grad",
    "numel",
    "ones",
    "ones_like",
    "ops",
    "optim",
    "profiler",
    "rand",
    "rand_like",
    "randint",
    "randn",
    "randn_like",
    "random",
    "randperm",
    "relu",
    "rsqrt",
    "runtime",
    "save",
    "sigmoid",
    "sin",
    "softmax",
    "sqrt",
    "stack",
    "std",
    "sum",
    "tanh",
    "tensor",
    "topk",
    "tril",
    "triu",
    "var",
    "where",
    "zeros",
    "zeros_like",
]
