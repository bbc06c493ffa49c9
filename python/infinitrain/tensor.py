"""Tensor: a native tensor handle plus autograd metadata, and the functions that create tensors.

The data lives in the C++ core (`_C.Tensor`, always contiguous); this class
adds requires_grad, .grad, the recorded Node and hooks, host access and the
in-place fills. The differentiable methods (arithmetic, shape, reductions,
`.to()`, `.backward()`) are attached by infinitrain.tensor_methods, which
forwards them to infinitrain.functional; keeping them out of this module keeps
the op layer free of import cycles.
"""

import numpy as np

from infinitrain import _C, dispatch
from infinitrain import random as _random

DTYPES = ("bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_NUMPY_TO_DTYPE = {np.dtype(d): d for d in DTYPES if d != "bfloat16"}


def _check_dtype(dtype):
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return dtype


class Tensor:
    __slots__ = ("_t", "requires_grad", "grad", "_node", "_hooks", "_post_hooks", "_retains_grad", "__weakref__")
    # NumPy defers `array op tensor` to the tensor's reflected operator instead of converting the tensor.
    __array_priority__ = 1000

    def __init__(self, native, requires_grad=False):
        self._t = native
        self.requires_grad = requires_grad
        self.grad = None
        self._node = None
        self._hooks = None
        self._post_hooks = None
        self._retains_grad = False

    # ---- metadata ----
    @property
    def shape(self):
        return self._t.shape

    @property
    def dtype(self):
        return self._t.dtype

    @property
    def device(self):
        return self._t.device

    @property
    def ndim(self):
        return len(self._t.shape)

    @property
    def data(self):
        """The same storage without autograd history (PyTorch's .data)."""
        return Tensor(self._t)

    @data.setter
    def data(self, other):
        if tuple(other.shape) != self.shape and self.requires_grad:
            raise ValueError(f".data: shape {tuple(other.shape)} does not match {self.shape}")
        self._t = other._t

    def is_floating_point(self):
        return self._t.dtype in FLOAT_DTYPES

    def element_size(self):
        return np.dtype(np.uint16 if self.dtype == "bfloat16" else self.dtype).itemsize

    def dim(self):
        return len(self._t.shape)

    def numel(self):
        return self._t.numel

    def size(self, dim=None):
        if dim is None:
            return self._t.shape
        return self._t.shape[dim]

    @property
    def is_leaf(self):
        return self._node is None

    def is_pinned(self):
        return self._t.is_pinned

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        body = np.array2string(self.numpy(), precision=4, threshold=20, edgeitems=3)
        return f"tensor({body}, dtype={self.dtype}, device={self.device}{grad})"

    # ---- host access ----
    def numpy(self):
        """A host copy (bfloat16 arrives as float32)."""
        return self._t.numpy()

    def __array__(self, dtype=None, copy=None):
        a = self._t.numpy()
        return a if dtype is None else a.astype(dtype)

    def __reduce__(self):
        # Pickles as host data plus dtype, device and requires_grad (a state_dict pickles as PyTorch's does).
        return (_unpickle, (self.numpy(), self.dtype, self.device, self.requires_grad, type(self)))

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item(): the tensor has {self.numel()} elements, expected 1")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def pin_memory(self):
        """A copy in page-locked host memory (a cpu tensor), which copies to a device read asynchronously."""
        return Tensor(self._t.pin_memory())

    # ---- autograd metadata ----
    def detach(self):
        return Tensor(self._t)

    def requires_grad_(self, flag=True):
        if flag and self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"only floating tensors can require grad, this one is {self.dtype}")
        self.requires_grad = flag
        return self

    def register_hook(self, fn):
        """fn(grad) runs when this tensor's gradient is computed; a returned tensor replaces the gradient."""
        if not self.requires_grad:
            raise RuntimeError("register_hook on a tensor that does not require grad")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(fn)
        return fn

    def register_post_accumulate_grad_hook(self, fn):
        """fn(tensor) runs after backward accumulated into this leaf's .grad (DDP starts its all-reduces so)."""
        if not self.requires_grad or self._node is not None:
            raise RuntimeError("register_post_accumulate_grad_hook: only for leaf tensors that require grad")
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(fn)
        return fn

    def retain_grad(self):
        self._retains_grad = True

    def _accumulate_grad(self, g, sole=False):
        """sole: nothing else references g or its memory, so its memory can become .grad (in a fresh wrapper, without
        g's graph state). Otherwise a copy: backward may hand the same gradient tensor to several inputs."""
        if self.grad is None:
            self.grad = Tensor(g._t if sole else dispatch.call("cast", [g], [g.dtype])[0])
        else:
            dispatch.call("axpy_", [self.grad, g], [1.0])

    # ---- in place (no autograd) ----
    def zero_(self):
        dispatch.call("fill_", [self], [0.0])
        return self

    def fill_(self, value):
        dispatch.call("fill_", [self], [float(value)])
        return self

    def copy_(self, src, non_blocking=False):
        """Copies src's values into this tensor (converting dtype; from another device too)."""
        if not isinstance(src, Tensor):
            src = tensor(src, dtype=self.dtype, device=self.device)
        if src.device != self.device:
            src = Tensor(src._t.to(self.device, non_blocking))
        dispatch.call("copy_", [self, src])
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        seed, offset = (generator or _random.default_generator).advance(self.numel())
        dispatch.call("normal_", [self], [float(mean), float(std), seed, offset])
        return self

    def uniform_(self, low=0.0, high=1.0, generator=None):
        seed, offset = (generator or _random.default_generator).advance(self.numel())
        dispatch.call("uniform_", [self], [float(low), float(high), seed, offset])
        return self

    def new_ones(self, shape):
        """Ones of `shape` with this tensor's dtype and device."""
        return full(shape, 1.0, self.dtype, self.device)

    def contiguous(self):
        return self


# ---- creation ----


def _native_dtype_of(arr, dtype):
    if dtype is not None:
        return _check_dtype(dtype)
    if arr.dtype.kind == "f":
        return {np.dtype(np.float64): "float64", np.dtype(np.float16): "float16"}.get(arr.dtype, "float32")
    if arr.dtype in _NUMPY_TO_DTYPE:
        return _NUMPY_TO_DTYPE[arr.dtype]
    raise ValueError(f"cannot make a tensor from NumPy dtype {arr.dtype}")


def from_numpy(arr, dtype=None, device="cpu", requires_grad=False, pin_memory=False):
    """A tensor holding a copy of `arr` (NumPy floats keep their width unless dtype says otherwise)."""
    arr = np.asarray(arr)
    dtype = _native_dtype_of(arr, dtype)
    carrier = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
    # ascontiguousarray makes 0-d arrays 1-d; keep the shape.
    native = _C.from_numpy(np.ascontiguousarray(arr, dtype=carrier).reshape(arr.shape), dtype, device, pin_memory)
    t = Tensor(native)
    if requires_grad:
        t.requires_grad_()
    return t


def tensor(data, dtype=None, device="cpu", requires_grad=False):
    """Like torch.tensor: Python floats become float32, ints int64."""
    arr = np.asarray(data)
    if dtype is None and arr.dtype == np.float64 and not isinstance(data, np.ndarray):
        dtype = "float32"
    return from_numpy(arr, dtype, device, requires_grad)


def _shape(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def empty(*shape, dtype="float32", device="cpu", requires_grad=False, pin_memory=False):
    t = Tensor(_C.empty(list(_shape(shape)), _check_dtype(dtype), device, pin_memory))
    return t.requires_grad_() if requires_grad else t


def _fill_dtype(value):
    """full()'s dtype for a fill value, as PyTorch infers it: bool, int64 or float32."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int64"
    return "float32"


def full(shape, value, dtype=None, device="cpu", requires_grad=False):
    if isinstance(value, Tensor):
        value = value.item()
    t = empty(*_shape((shape,)), dtype=dtype or _fill_dtype(value), device=device).fill_(value)
    return t.requires_grad_() if requires_grad else t


def full_like(t, value, dtype=None, device=None, requires_grad=False):
    return full(t.shape, value, dtype or t.dtype, device or t.device, requires_grad)


def empty_like(t, dtype=None, device=None):
    return empty(*t.shape, dtype=dtype or t.dtype, device=device or t.device)


def zeros(*shape, dtype="float32", device="cpu", requires_grad=False):
    return full(_shape(shape), 0.0, dtype, device, requires_grad)


def ones(*shape, dtype="float32", device="cpu", requires_grad=False):
    return full(_shape(shape), 1.0, dtype, device, requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False):
    return zeros(t.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False):
    return ones(t.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad)


def randn_like(t, dtype=None, device=None, generator=None):
    return randn(*t.shape, dtype=dtype or t.dtype, device=device or t.device, generator=generator)


def rand_like(t, dtype=None, device=None, generator=None):
    return rand(*t.shape, dtype=dtype or t.dtype, device=device or t.device, generator=generator)


def randn(*shape, dtype="float32", device="cpu", requires_grad=False, generator=None):
    t = empty(*_shape(shape), dtype=dtype, device=device).normal_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def rand(*shape, dtype="float32", device="cpu", requires_grad=False, generator=None):
    t = empty(*_shape(shape), dtype=dtype, device=device).uniform_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def host_rng(generator, n):
    """A NumPy generator for a host-side draw of n numbers from our generator's counter stream: the same
    (seed, offset) gives the same numbers on every device, and the generator moves on by n."""
    seed, offset = (generator or _random.default_generator).advance(n)
    return np.random.default_rng([seed, offset])


def randint(*args, size=None, generator=None, dtype="int64", device="cpu", requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers uniform in [low, high), as PyTorch's."""
    if size is not None:
        args = (*args, size)
    if len(args) == 2:
        low, (high, size) = 0, args
    elif len(args) == 3:
        low, high, size = args
    else:
        raise TypeError("randint(high, size) or randint(low, high, size)")
    size = _shape((size,)) if isinstance(size, (tuple, list)) else _shape((size,))
    low, high = int(low), int(high)
    if high <= low:
        raise ValueError(f"randint: need low < high, got [{low}, {high})")
    n = int(np.prod(size)) if size else 1
    values = host_rng(generator, n).integers(low, high, size=size, dtype=np.int64)
    if requires_grad:
        raise ValueError("randint: integer tensors cannot require grad")
    return from_numpy(values, dtype=dtype, device=device)


def randperm(n, generator=None, dtype="int64", device="cpu"):
    return from_numpy(host_rng(generator, n).permutation(int(n)), dtype=dtype, device=device)


def arange(start, end=None, step=1, *, dtype=None, device="cpu", requires_grad=False):
    """arange(end) or arange(start, end, step), as PyTorch: int64 when every bound is an integer, float32
    otherwise (unless dtype says)."""
    if end is None:
        start, end = 0, start
    for name, v in (("start", start), ("end", end), ("step", step)):
        if isinstance(v, Tensor):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange: {name} must be a number, got {v!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    values = np.arange(start, end, step, dtype=np.int64 if ints else np.float64)
    t = from_numpy(values, dtype=dtype or ("int64" if ints else "float32"), device=device)
    return t.requires_grad_() if requires_grad else t


def _unpickle(array, dtype, device, requires_grad, cls):
    t = from_numpy(array, dtype=dtype, device=device)
    if cls is not Tensor:
        t = cls(t, requires_grad) if requires_grad is not None else cls(t)
    elif requires_grad:
        t.requires_grad_()
    return t
