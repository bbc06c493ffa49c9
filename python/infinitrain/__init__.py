"""infinitrain: train language models on any accelerator that plugs in as a provider.

import infinitrain as it
x = it.randn(4, 8, requires_grad=True)
(x * x).sum().backward()
"""

import builtins as _builtins
import os as _os

_int, _bool = _builtins.int, _builtins.bool


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
    accelerator,
    amp,
    autograd,
    backends,
    checkpoint,
    composites,  # noqa: F401  (registers the fused ops' composites)
    data,
    distributed,
    dtypes,
    functional,
    models,
    nn,
    ops,
    optim,
    profiler,
    random,
    runtime,
    tensor_methods,  # noqa: F401  (attaches Tensor's op methods)
    tensor_ops,
    utils,
)
from infinitrain.amp import GradScaler, autocast
from infinitrain.autograd import enable_grad, is_grad_enabled, no_grad
from infinitrain.dtypes import dtype, finfo, get_default_dtype, iinfo, set_default_dtype
from infinitrain.functional import (
    abs,
    amax,
    amin,
    argmax,
    argmin,
    cat,
    ceil,
    cos,
    cumsum,
    erf,
    erfc,
    exp,
    expm1,
    floor,
    gather,
    index_select,
    log,
    log1p,
    log_softmax,
    matmul,
    maximum,
    mean,
    minimum,
    multinomial,
    relu,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    softmax,
    sqrt,
    stack,
    std,
    sum,
    tanh,
    tril,
    triu,
    trunc,
    var,
    where,
)
from infinitrain.random import Generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state
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
from infinitrain.tensor_ops import *  # noqa: F403  (PyTorch's torch.* functions)
from infinitrain.tensor_ops import __all__ as _tensor_ops_names

__version__ = "0.1.0"

# dtypes are their names (str subclasses with PyTorch's attributes); PyTorch's aliases name the same ones.
uint8, int8, int32, int64 = (dtypes.of(n) for n in ("uint8", "int8", "int32", "int64"))
float16, bfloat16, float32, float64 = (dtypes.of(n) for n in ("float16", "bfloat16", "float32", "float64"))
float8_e4m3fn, float8_e5m2 = (dtypes.of(n) for n in dtypes.FLOAT8)
bool_, long, half, double = dtypes.of("bool"), int64, float16, float64
# `it.bool`, `it.int` and `it.float` would shadow builtins inside this file, so they are set this way.
globals().update({"bool": dtypes.of("bool"), "int": int32, "float": float32})


def device(type, index=None):  # noqa: A002 (PyTorch's parameter name)
    """A device: its canonical name ('cpu', 'cuda:0') as a str subclass with .type and .index. A device type no
    provider of this build registers is kept as given (its use raises the error naming what exists)."""
    name = type if index is None else f"{type}:{index}"
    if isinstance(name, runtime.Device):
        return name
    try:
        return runtime.parse_device(name)
    except ValueError:
        if not isinstance(name, str) or not name.split(":")[0].isidentifier():
            raise
        return runtime.Device(name)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def is_floating_point(input):
    return input.is_floating_point()


def flatten(input, start_dim=0, end_dim=-1):
    return input.flatten(start_dim, end_dim)


def set_num_threads(int):  # noqa: A002 (PyTorch's parameter name)
    """The CPU kernels' thread count (OpenMP), for parallel regions this thread opens from now on."""
    _C.set_num_threads(_int(int))


def get_num_threads():
    return _C.get_num_threads()


def set_float32_matmul_precision(precision):
    """'highest' (float32 GEMMs in float32, the default), 'high' or 'medium' (providers may use TF32 tensor cores
    for float32 GEMMs and attention: about 10 mantissa bits per product)."""
    _C.set_float32_matmul_precision(precision)


def get_float32_matmul_precision():
    return _C.float32_matmul_precision()


_deterministic = [False]


def use_deterministic_algorithms(mode, *, warn_only=False):
    """Recorded: the kernels here are chosen by shape alone, and their results do not change run to run on the
    cpu; GPU kernels that add with atomics (embedding and scatter backward) do not become deterministic."""
    _deterministic[0] = _bool(mode)


def are_deterministic_algorithms_enabled():
    return _deterministic[0]


def compile(
    model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None, disable=False, **kwargs
):
    """torch.compile: returns a callable with model's behaviour (infinitrain.compiler); PyTorch's other options
    (name, recompile limits) are accepted and have nothing to tune here."""
    from infinitrain import compiler

    return compiler.compile(
        model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options, disable=disable
    )


def __getattr__(name):
    # it.cuda, it.sim, it.maca, ...: one generic device namespace per provider name (infinitrain.accelerator).
    if name in accelerator.names():
        return accelerator.module(name)
    raise AttributeError(f"module 'infinitrain' has no attribute '{name}'")


__all__ = sorted(
    {
        "DTYPES",
        "Generator",
        "GradScaler",
        "OutOfMemoryError",
        "Tensor",
        "abs",
        "amax",
        "amin",
        "amp",
        "arange",
        "argmax",
        "argmin",
        "autocast",
        "autograd",
        "backends",
        "bfloat16",
        "cat",
        "ceil",
        "checkpoint",
        "compile",
        "cos",
        "cumsum",
        "data",
        "device",
        "distributed",
        "double",
        "dtype",
        "empty",
        "empty_like",
        "enable_grad",
        "erf",
        "erfc",
        "exp",
        "expm1",
        "finfo",
        "flatten",
        "float16",
        "float32",
        "float64",
        "float8_e4m3fn",
        "float8_e5m2",
        "floor",
        "from_numpy",
        "full",
        "full_like",
        "functional",
        "gather",
        "get_default_dtype",
        "get_float32_matmul_precision",
        "get_num_threads",
        "get_rng_state",
        "half",
        "iinfo",
        "index_select",
        "initial_seed",
        "int8",
        "int32",
        "int64",
        "is_floating_point",
        "is_grad_enabled",
        "is_tensor",
        "load",
        "log",
        "log1p",
        "log_softmax",
        "long",
        "manual_seed",
        "matmul",
        "maximum",
        "mean",
        "minimum",
        "models",
        "multinomial",
        "nn",
        "no_grad",
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
        "randperm",
        "random",
        "relu",
        "round",
        "rsqrt",
        "runtime",
        "save",
        "seed",
        "set_default_dtype",
        "set_float32_matmul_precision",
        "set_num_threads",
        "set_rng_state",
        "sigmoid",
        "sign",
        "sin",
        "softmax",
        "sqrt",
        "stack",
        "std",
        "sum",
        "tanh",
        "tensor",
        "tril",
        "triu",
        "trunc",
        "uint8",
        "use_deterministic_algorithms",
        "utils",
        "var",
        "where",
        "zeros",
        "zeros_like",
    }
    | set(_tensor_ops_names)
)
