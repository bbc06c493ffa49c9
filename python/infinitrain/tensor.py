"""Tensor: a native tensor handle plus autograd metadata.

The data lives in the C++ core (`_C.Tensor`, always contiguous); this class
adds requires_grad, .grad, the recorded Node and hooks, and PyTorch-style
methods that forward to infinitrain.functional.
"""

import numpy as np

from infinitrain import _C, autograd

DTYPES = ("bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
_NUMPY_TO_DTYPE = {np.dtype(d): d for d in DTYPES if d != "bfloat16"}


def _check_dtype(dtype):
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return dtype


def _dim(d, ndim, op):
    if not -ndim <= d < ndim:
        raise IndexError(f"{op}: dim {d} out of range for a {ndim}-d tensor (expected {-ndim} <= dim < {ndim})")
    return d % ndim


def _to_device_name(device):
    """Tensor.to's positional argument that is not a dtype: a device, or a clear error naming both kinds."""
    try:
        return _C.parse_device(device)
    except (ValueError, TypeError) as e:
        if isinstance(device, str) and ":" not in device:
            raise ValueError(f"to: {device!r} is neither a dtype ({', '.join(DTYPES)}) nor a device ({e})") from None
        raise


class Tensor:
    __slots__ = ("_t", "requires_grad", "grad", "_node", "_hooks", "_retains_grad", "__weakref__")

    def __init__(self, native, requires_grad=False):
        self._t = native
        self.requires_grad = requires_grad
        self.grad = None
        self._node = None
        self._hooks = None
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

    # ---- autograd ----
    def backward(self, grad=None, retain_graph=False):
        autograd.backward(self, grad, retain_graph)

    def detach(self):
        return Tensor(self._t)

    def requires_grad_(self, flag=True):
        if flag and self.dtype not in ("float32", "bfloat16", "float64", "float16"):
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

    def retain_grad(self):
        self._retains_grad = True

    def _accumulate_grad(self, g):
        if self.grad is None:
            # A copy: backward may hand the same gradient tensor to several inputs.
            self.grad = Tensor(_C.op("cast")([g._t], [g.dtype])[0])
        else:
            _C.op("axpy_")([self.grad._t, g._t], [1.0])

    # ---- conversion ----
    def to(self, *args, dtype=None, device=None):
        for a in args:
            if a in DTYPES:
                dtype = a
            else:
                device = a
        out = self
        if device is not None:
            device = _to_device_name(device)
        if device is not None and device != self.device:
            out = F.to_device(out, device)
        if dtype is not None and dtype != out.dtype:
            out = F.cast(out, _check_dtype(dtype))
        return out

    def cpu(self):
        return self.to("cpu")

    def float(self):
        return self.to("float32")

    def bfloat16(self):
        return self.to("bfloat16")

    def double(self):
        return self.to("float64")

    def long(self):
        return self.to("int64")

    def contiguous(self):
        return self

    def clone(self):
        return F.clone(self)

    # ---- in-place (no autograd) ----
    def zero_(self):
        _C.op("fill_")([self._t], [0.0])
        return self

    def fill_(self, value):
        _C.op("fill_")([self._t], [float(value)])
        return self

    def copy_(self, src):
        if not isinstance(src, Tensor):
            src = tensor(src, dtype=self.dtype, device=self.device)
        if src.device != self.device:
            src = src.to(self.device)
        _C.op("copy_")([self._t, src._t], [])
        return self

    def normal_(self, mean=0.0, std=1.0, generator=None):
        from infinitrain import random

        seed, offset = (generator or random.default_generator).advance(self.numel())
        _C.op("normal_")([self._t], [float(mean), float(std), seed, offset])
        return self

    def uniform_(self, low=0.0, high=1.0, generator=None):
        from infinitrain import random

        seed, offset = (generator or random.default_generator).advance(self.numel())
        _C.op("uniform_")([self._t], [float(low), float(high), seed, offset])
        return self

    # ---- shape ----
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return F.reshape(self, shape)

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        n = self.ndim
        s, e = start_dim % n if n else 0, end_dim % n if n else 0
        shape = self.shape[:s] + (-1,) + self.shape[e + 1 :]
        return self.reshape(shape)

    def unsqueeze(self, dim):
        n = self.ndim + 1
        if not -n <= dim < n:
            raise IndexError(f"unsqueeze: dim {dim} out of range for a {self.ndim}-d tensor")
        dim %= n
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim=None):
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        if not -max(self.ndim, 1) <= dim < max(self.ndim, 1):
            raise IndexError(f"squeeze: dim {dim} out of range for a {self.ndim}-d tensor")
        if self.ndim == 0:
            return self
        dim %= self.ndim
        if self.shape[dim] != 1:
            return self
        return self.reshape(self.shape[:dim] + self.shape[dim + 1 :])

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
        return F.permute(self, dims)

    def transpose(self, a, b):
        dims = list(range(self.ndim))
        a, b = _dim(a, self.ndim, "transpose"), _dim(b, self.ndim, "transpose")
        dims[a], dims[b] = dims[b], dims[a]
        return self.permute(dims)

    @property
    def T(self):
        return self.permute(tuple(range(self.ndim))[::-1])

    def expand(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return F.expand(self, shape)

    def split(self, split_size, dim=0):
        return F.split(self, split_size, dim)

    def chunk(self, chunks, dim=0):
        if chunks < 1:
            raise ValueError(f"chunk: chunks must be >= 1, got {chunks}")
        n = self.shape[dim]
        size = max(1, -(-n // chunks))
        return self.split(size, dim)

    def __getitem__(self, index):
        return F.getitem(self, index)

    # ---- arithmetic ----
    def __add__(self, o):
        return F.add(self, o)

    def __radd__(self, o):
        return F.add(self, o)

    def __sub__(self, o):
        return F.sub(self, o)

    def __rsub__(self, o):
        return F.add(F.neg(self), o)

    def __mul__(self, o):
        return F.mul(self, o)

    def __rmul__(self, o):
        return F.mul(self, o)

    def __truediv__(self, o):
        return F.div(self, o)

    def __rtruediv__(self, o):
        return F.mul(F.pow(self, -1.0), o)

    def __neg__(self):
        return F.neg(self)

    def __pow__(self, p):
        return F.pow(self, p)

    def __matmul__(self, o):
        return F.matmul(self, o)

    def __eq__(self, o):
        return F.compare("eq", self, o)

    def __ne__(self, o):
        return F.compare("ne", self, o)

    def __lt__(self, o):
        return F.compare("lt", self, o)

    def __le__(self, o):
        return F.compare("le", self, o)

    def __gt__(self, o):
        return F.compare("gt", self, o)

    def __ge__(self, o):
        return F.compare("ge", self, o)

    __hash__ = object.__hash__

    def __iadd__(self, o):
        return self.__add__(o)

    def matmul(self, o):
        return F.matmul(self, o)

    def sum(self, dim=None, keepdim=False):
        return F.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return F.mean(self, dim, keepdim)

    def amax(self, dim=None, keepdim=False):
        return F.amax(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """The maximum; with an int dim, (values, indices) as in PyTorch."""
        if dim is None:
            return F.amax(self, None, keepdim)
        return F.amax(self, dim, keepdim), F.argmax(self, dim, keepdim)

    def argmax(self, dim=-1, keepdim=False):
        return F.argmax(self, dim, keepdim)

    def exp(self):
        return F.exp(self)

    def log(self):
        return F.log(self)

    def sqrt(self):
        return F.sqrt(self)

    def rsqrt(self):
        return F.rsqrt(self)

    def tanh(self):
        return F.tanh(self)

    def sigmoid(self):
        return F.sigmoid(self)

    def relu(self):
        return F.relu(self)

    def abs(self):
        return F.abs(self)

    def softmax(self, dim=-1):
        return F.softmax(self, dim)

    def log_softmax(self, dim=-1):
        return F.log_softmax(self, dim)

    def masked_fill(self, mask, value):
        return F.masked_fill(self, mask, value)

    def tril(self, k=0):
        return F.tril(self, k)

    def triu(self, k=0):
        return F.triu(self, k)

    def clamp(self, low=None, high=None):
        return F.clamp(self, low, high)


# ---- creation ----


def _native_dtype_of(arr, dtype):
    if dtype is not None:
        return _check_dtype(dtype)
    if arr.dtype.kind == "f":
        return {np.dtype(np.float64): "float64", np.dtype(np.float16): "float16"}.get(arr.dtype, "float32")
    if arr.dtype in _NUMPY_TO_DTYPE:
        return _NUMPY_TO_DTYPE[arr.dtype]
    raise ValueError(f"cannot make a tensor from NumPy dtype {arr.dtype}")


def from_numpy(arr, dtype=None, device="cpu", requires_grad=False):
    """A tensor holding a copy of `arr` (NumPy floats keep their width unless dtype says otherwise)."""
    arr = np.asarray(arr)
    dtype = _native_dtype_of(arr, dtype)
    carrier = np.float32 if dtype == "bfloat16" else np.dtype(dtype)
    # ascontiguousarray makes 0-d arrays 1-d; keep the shape.
    t = Tensor(_C.from_numpy(np.ascontiguousarray(arr, dtype=carrier).reshape(arr.shape), dtype, device))
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


def empty(*shape, dtype="float32", device="cpu", requires_grad=False):
    t = Tensor(_C.empty(list(_shape(shape)), _check_dtype(dtype), device))
    return t.requires_grad_() if requires_grad else t


def full(shape, value, dtype="float32", device="cpu", requires_grad=False):
    t = empty(*_shape((shape,)), dtype=dtype, device=device).fill_(value)
    return t.requires_grad_() if requires_grad else t


def zeros(*shape, dtype="float32", device="cpu", requires_grad=False):
    return full(_shape(shape), 0.0, dtype, device, requires_grad)


def ones(*shape, dtype="float32", device="cpu", requires_grad=False):
    return full(_shape(shape), 1.0, dtype, device, requires_grad)


def zeros_like(t, dtype=None):
    return zeros(t.shape, dtype=dtype or t.dtype, device=t.device)


def ones_like(t, dtype=None):
    return ones(t.shape, dtype=dtype or t.dtype, device=t.device)


def randn(*shape, dtype="float32", device="cpu", requires_grad=False, generator=None):
    t = empty(*_shape(shape), dtype=dtype, device=device).normal_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def rand(*shape, dtype="float32", device="cpu", requires_grad=False, generator=None):
    t = empty(*_shape(shape), dtype=dtype, device=device).uniform_(generator=generator)
    return t.requires_grad_() if requires_grad else t


def arange(n, dtype="int64", device="cpu"):
    return from_numpy(np.arange(n), dtype=dtype, device=device)


# Imported last: functional needs Tensor, and Tensor's methods need functional.
from infinitrain import functional as F  # noqa: E402
