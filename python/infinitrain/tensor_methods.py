"""Tensor's differentiable methods, PyTorch's names, forwarded to infinitrain.functional.

They are attached here rather than defined in tensor.py so that tensor.py
needs no import of functional (which itself builds Tensors): the op layer has
no import cycle. Importing infinitrain attaches them.
"""

from infinitrain import autograd, runtime
from infinitrain import functional as F
from infinitrain.tensor import DTYPES, Tensor, empty, full, tensor, zeros


def backward(self, grad=None, retain_graph=False):
    autograd.backward(self, grad, retain_graph)


def _device_name(device):
    """to()'s argument that is not a dtype: a device, or an error naming both kinds ("float128" is neither)."""
    try:
        return runtime.parse_device(device)
    except ValueError as e:
        if isinstance(device, str) and ":" not in device:
            raise ValueError(f"to: {device!r} is neither a dtype ({', '.join(DTYPES)}) nor a device ({e})") from None
        raise


def to(self, *args, dtype=None, device=None, non_blocking=False):
    """to(device), to(dtype) or both, as positional or keyword arguments."""
    for a in args:
        if a in DTYPES:
            dtype = a
        else:
            device = a
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    out = self
    if device is not None and _device_name(device) != self.device:
        out = F.to_device(out, device, non_blocking)
    if dtype is not None and dtype != out.dtype:
        out = F.cast(out, dtype)
    return out


def reshape(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return F.reshape(self, shape)


def flatten(self, start_dim=0, end_dim=-1):
    n = self.ndim
    s, e = start_dim % n if n else 0, end_dim % n if n else 0
    return self.reshape(self.shape[:s] + (-1,) + self.shape[e + 1 :])


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
    for d in (a, b):
        if not -self.ndim <= d < self.ndim:
            raise IndexError(f"transpose: dim {d} out of range for a {self.ndim}-d tensor")
    dims[a], dims[b] = dims[b], dims[a]
    return F.permute(self, dims)


def expand(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return F.expand(self, shape)


def chunk(self, chunks, dim=0):
    if chunks < 1:
        raise ValueError(f"chunk: chunks must be >= 1, got {chunks}")
    return F.split(self, max(1, -(-self.shape[dim] // chunks)), dim)


def max_(self, dim=None, keepdim=False):
    """The maximum; with an int dim, (values, indices) as in PyTorch; with a tensor, the elementwise maximum."""
    if isinstance(dim, Tensor):
        return F.maximum(self, dim)
    if dim is None:
        return F.amax(self, None, keepdim)
    return F.amax(self, dim, keepdim), F.argmax(self, dim, keepdim)


def min_(self, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return F.minimum(self, dim)
    if dim is None:
        return F.amin(self, None, keepdim)
    return F.amin(self, dim, keepdim), F.argmin(self, dim, keepdim)


def _inplace(fn):
    """An in-place operator: computes out of place, then x holds the result (functional._commit)."""

    def method(self, other):
        return F.inplace(self, fn, other)

    return method


def view(self, *shape):
    """Like reshape; view(dtype) is not supported (tensors here own their storage)."""
    if len(shape) == 1 and isinstance(shape[0], str):
        raise NotImplementedError("view(dtype) is not supported; use .to(dtype)")
    return reshape(self, *shape)


def repeat(self, *sizes):
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    if len(sizes) < self.ndim:
        raise ValueError(f"repeat: {len(sizes)} sizes for a {self.ndim}-d tensor")
    x = self.reshape((1,) * (len(sizes) - self.ndim) + self.shape)
    inter, final = [], []
    for s, r in zip(x.shape, sizes, strict=True):
        inter += [r, s]
        final.append(s * r)
    return F.expand(x.reshape([v for s in x.shape for v in (1, s)]), inter).reshape(final)


def new_tensor(self, data, dtype=None):
    return tensor(data, dtype=dtype or self.dtype, device=self.device)


def type_as(self, other):
    return self.to(other.dtype)


_METHODS = {
    "backward": backward,
    "to": to,
    "cpu": lambda self: self.to("cpu"),
    "float": lambda self: self.to("float32"),
    "bfloat16": lambda self: self.to("bfloat16"),
    "double": lambda self: self.to("float64"),
    "long": lambda self: self.to("int64"),
    "clone": F.clone,
    "reshape": reshape,
    "view": view,
    "view_as": lambda self, other: reshape(self, other.shape),
    "reshape_as": lambda self, other: reshape(self, other.shape),
    "expand_as": lambda self, other: F.expand(self, other.shape),
    "repeat": repeat,
    "repeat_interleave": lambda self, repeats, dim=0: F.repeat_interleave(self, repeats, dim),
    "half": lambda self: self.to("float16"),
    "int": lambda self: self.to("int32"),
    "bool": lambda self: self.to("bool"),
    "type_as": type_as,
    "new_tensor": new_tensor,
    "new_zeros": lambda self, *shape, dtype=None: zeros(*shape, dtype=dtype or self.dtype, device=self.device),
    "new_full": lambda self, shape, value, dtype=None: full(shape, value, dtype or self.dtype, self.device),
    "new_empty": lambda self, *shape, dtype=None: empty(*shape, dtype=dtype or self.dtype, device=self.device),
    "flatten": flatten,
    "unsqueeze": unsqueeze,
    "squeeze": squeeze,
    "permute": permute,
    "transpose": transpose,
    "T": property(lambda self: F.permute(self, tuple(range(self.ndim))[::-1])),
    "expand": expand,
    "split": lambda self, split_size, dim=0: F.split(self, split_size, dim),
    "chunk": chunk,
    "__getitem__": F.getitem,
    "__setitem__": F.setitem,
    "__add__": F.add,
    "__radd__": F.add,
    "__iadd__": _inplace(F.add),
    "__sub__": F.sub,
    "__rsub__": F.rsub,
    "__isub__": _inplace(F.sub),
    "__mul__": F.mul,
    "__rmul__": F.mul,
    "__imul__": _inplace(F.mul),
    "__truediv__": F.div,
    "__rtruediv__": F.rdiv,
    "__itruediv__": _inplace(F.div),
    "__neg__": F.neg,
    "__invert__": F.logical_not,
    "__and__": lambda self, o: F.mul(self, o) if self.dtype == "bool" else NotImplemented,  # logical and
    "__or__": lambda self, o: F.add(self, o) if self.dtype == "bool" else NotImplemented,  # logical or
    "add_": _inplace(F.add),
    "sub_": _inplace(F.sub),
    "mul_": _inplace(F.mul),
    "div_": _inplace(F.div),
    "add": F.add,
    "sub": F.sub,
    "mul": F.mul,
    "div": F.div,
    "pow": F.pow,
    "neg": F.neg,
    "masked_fill_": F.masked_fill_,
    "clamp_": lambda self, min=None, max=None: F.inplace(self, F.clamp, min, max),
    "clamp_min": lambda self, m: F.clamp(self, m, None),
    "clamp_max": lambda self, m: F.clamp(self, None, m),
    "maximum": F.maximum,
    "minimum": F.minimum,
    "amin": F.amin,
    "min": min_,
    "argmin": F.argmin,
    "var": F.var,
    "std": F.std,
    "square": lambda self: F.mul(self, self),
    "sin": F.sin,
    "cos": F.cos,
    "gelu": F.gelu,
    "silu": F.silu,
    "topk": lambda self, k, dim=-1, largest=True, sorted=True: F.topk(self, k, dim, largest, sorted),
    "gather": F.gather,
    "scatter_add": F.scatter_add,
    "index_select": F.index_select,
    "unbind": lambda self, dim=0: tuple(self.select(dim, i) for i in range(self.shape[dim])),
    "select": lambda self, dim, i: F.getitem(self, (slice(None),) * (dim % self.ndim) + (i,)),
    "eq": F.eq,
    "ne": F.ne,
    "lt": F.lt,
    "le": F.le,
    "gt": F.gt,
    "ge": F.ge,
    "__pow__": F.pow,
    "__matmul__": F.matmul,
    "__eq__": F.eq,
    "__ne__": F.ne,
    "__lt__": F.lt,
    "__le__": F.le,
    "__gt__": F.gt,
    "__ge__": F.ge,
    "__hash__": object.__hash__,
    "matmul": F.matmul,
    "sum": F.sum,
    "mean": F.mean,
    "amax": F.amax,
    "max": max_,
    "argmax": F.argmax,
    "exp": F.exp,
    "log": F.log,
    "sqrt": F.sqrt,
    "rsqrt": F.rsqrt,
    "tanh": F.tanh,
    "sigmoid": F.sigmoid,
    "relu": F.relu,
    "abs": F.abs,
    "softmax": F.softmax,
    "log_softmax": F.log_softmax,
    "masked_fill": F.masked_fill,
    "tril": F.tril,
    "triu": F.triu,
    "clamp": F.clamp,
}

for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)
