"""Tensor's differentiable methods, PyTorch's names, forwarded to infinitrain.functional.

They are attached here rather than defined in tensor.py so that tensor.py
needs no import of functional (which itself builds Tensors): the op layer has
no import cycle. Importing infinitrain attaches them.
"""

from infinitrain import autograd, runtime
from infinitrain import functional as F
from infinitrain.tensor import DTYPES, Tensor


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
    """The maximum; with an int dim, (values, indices) as in PyTorch."""
    if dim is None:
        return F.amax(self, None, keepdim)
    return F.amax(self, dim, keepdim), F.argmax(self, dim, keepdim)


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
    "view": reshape,
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
    "__add__": F.add,
    "__radd__": F.add,
    "__iadd__": F.add,
    "__sub__": F.sub,
    "__rsub__": lambda self, o: F.add(F.neg(self), o),
    "__mul__": F.mul,
    "__rmul__": F.mul,
    "__truediv__": F.div,
    "__rtruediv__": lambda self, o: F.mul(F.pow(self, -1.0), o),
    "__neg__": F.neg,
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
