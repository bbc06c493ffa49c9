"""Tensor's differentiable methods, PyTorch's names, forwarded to infinitrain.functional.

They are attached here rather than defined in tensor.py so that tensor.py
needs no import of functional (which itself builds Tensors): the op layer has
no import cycle. Importing infinitrain attaches them.
"""

from infinitrain import _C, autograd, runtime
from infinitrain import functional as F
from infinitrain import tensor_ops as T
from infinitrain.tensor import CAST_DTYPES, Tensor, empty, full, tensor, zeros


def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    if create_graph:
        raise NotImplementedError("backward(create_graph=True): higher-order gradients are not supported")
    if inputs is not None:
        raise NotImplementedError("backward(inputs=...): use it.autograd.grad for gradients of chosen tensors")
    autograd.run_backward(self, gradient, bool(retain_graph))


def _device_name(device):
    """to()'s argument that is not a dtype: a device, or an error naming both kinds ("float128" is neither)."""
    try:
        return runtime.parse_device(device)
    except ValueError as e:
        if isinstance(device, str) and ":" not in device:
            names = ", ".join(CAST_DTYPES)
            raise ValueError(f"to: {device!r} is neither a dtype ({names}) nor a device ({e})") from None
        raise


def _accelerator_index(i):
    """An integer device: index i of the registered provider's devices (PyTorch's x.to(0) is cuda:0)."""
    info = _C.privateuse1()
    if info is None:
        raise ValueError(f"to({i}): an integer names an accelerator device, and no provider is registered")
    return f"{info['name']}:{i}"


def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False, memory_format=None):
    """to(device), to(dtype), to(device, dtype), to(other tensor), as positional or keyword arguments."""
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, bool):
            non_blocking = a
        elif isinstance(a, int):
            device = _accelerator_index(a)
        elif a in CAST_DTYPES:
            dtype = a
        else:
            device = a
    if isinstance(device, int) and not isinstance(device, bool):
        device = _accelerator_index(device)
    if dtype is not None and dtype not in CAST_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(CAST_DTYPES)}")
    out = self
    if device is not None and _device_name(device) != self.device:
        out = F.to_device(out, device, non_blocking)
    if dtype is not None and dtype != out.dtype:
        out = F.cast(out, dtype)
    if copy and out is self:
        out = F.clone(self)
    return out


def cuda(self, device=None, non_blocking=False):
    """A copy on the cuda device (index `device`, or the current one)."""
    d = "cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device)
    return to(self, d, non_blocking=non_blocking)


def detach_(self):
    self._node = None
    self.requires_grad = False
    return self


def _grad_fn(self):
    return None if self._node is None else autograd.GradFn(self._node)


def _inplace_alpha(fn):
    def method(self, other, *, alpha=1):
        if alpha != 1:
            other = F.mul(other, alpha) if isinstance(other, Tensor) else other * alpha
        return F.inplace(self, fn, other)

    return method


def _scatter_(self, dim, index, src=None, value=None, *, reduce=None):
    return F.inplace(self, lambda x: T.scatter(x, dim, index, src, value, reduce=reduce))


def _index_add_(self, dim, index, source, *, alpha=1):
    return F.inplace(self, lambda x: T.index_add(x, dim, index, source, alpha=alpha))


def _setitem(self, key, value):
    if self.is_meta:  # recorded for materialisation (an embedding's padding row)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise RuntimeError(
                "a tensor on the meta device takes only a number written into part of it (it has no data); "
                "build on a real device to write tensors into it"
            )
        self._t.init.append(("setitem", key, float(value)))
        return
    F.setitem(self, key, value)


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


def transpose(self, dim0, dim1):
    a, b = dim0, dim1
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
    return F.ValuesIndices(F.amax(self, dim, keepdim), F.argmax(self, dim, keepdim))


def min_(self, dim=None, keepdim=False):
    if isinstance(dim, Tensor):
        return F.minimum(self, dim)
    if dim is None:
        return F.amin(self, None, keepdim)
    return F.ValuesIndices(F.amin(self, dim, keepdim), F.argmin(self, dim, keepdim))


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


def new_tensor(self, data, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)


def type_as(self, other):
    return self.to(other.dtype)


_METHODS = {
    "backward": backward,
    "cuda": cuda,
    "detach_": detach_,
    "grad_fn": property(_grad_fn),
    "t": T.t,
    "mT": property(lambda self: self.transpose(-2, -1)),
    "unflatten": T.unflatten,
    "narrow": T.narrow,
    "flip": T.flip,
    "roll": T.roll,
    "scatter": T.scatter,
    "scatter_": _scatter_,
    "scatter_add_": lambda self, dim, index, src: F.inplace(self, lambda x: T.scatter_add(x, dim, index, src)),
    "index_add_": _index_add_,
    "index_add": lambda self, dim, index, source, *, alpha=1: T.index_add(self, dim, index, source, alpha=alpha),
    "lerp": T.lerp,
    "lerp_": lambda self, end, weight: F.inplace(self, T.lerp, end, weight),
    "addcmul": T.addcmul,
    "addcmul_": lambda self, tensor1, tensor2, *, value=1: F.inplace(
        self, lambda x: T.addcmul(x, tensor1, tensor2, value=value)
    ),
    "addcdiv": T.addcdiv,
    "addcdiv_": lambda self, tensor1, tensor2, *, value=1: F.inplace(
        self, lambda x: T.addcdiv(x, tensor1, tensor2, value=value)
    ),
    "prod": T.prod,
    "clip": F.clamp,
    "clip_": lambda self, min=None, max=None: F.inplace(self, F.clamp, min, max),
    "round": F.round,
    "floor": F.floor,
    "ceil": F.ceil,
    "trunc": F.trunc,
    "sign": F.sign,
    "erf": F.erf,
    "log1p": F.log1p,
    "expm1": F.expm1,
    "exp2": T.exp2,
    "log2": T.log2,
    "log10": T.log10,
    "tan": T.tan,
    "reciprocal": T.reciprocal,
    "cumsum": F.cumsum,
    "cumprod": T.cumprod,
    "sort": F.sort,
    "argsort": F.argsort,
    "all": T.all,
    "any": T.any,
    "norm": T.norm,
    "logsumexp": T.logsumexp,
    "mm": T.mm,
    "mv": T.mv,
    "dot": T.dot,
    "outer": T.outer,
    "isnan": T.isnan,
    "isinf": T.isinf,
    "isfinite": T.isfinite,
    "nan_to_num": T.nan_to_num,
    "nonzero": T.nonzero,
    "unique": T.unique,
    "where": lambda self, condition, y: F.where(condition, self, y),
    "masked_select": T.masked_select,
    "logical_not": T.logical_not,
    "logical_and": T.logical_and,
    "logical_or": T.logical_or,
    "fmod": T.fmod,
    "remainder": T.remainder,
    "diag": T.diag,
    "diagonal": T.diagonal,
    "trace": T.trace,
    "tile": T.tile,
    "movedim": T.movedim,
    "swapaxes": T.swapaxes,
    "kthvalue": T.kthvalue,
    "median": T.median,
    "count_nonzero": T.count_nonzero,
    "take_along_dim": T.take_along_dim,
    "allclose": T.allclose,
    "isclose": T.isclose,
    "equal": T.equal,
    "relu_": lambda self: F.inplace(self, F.relu),
    "exp_": lambda self: F.inplace(self, F.exp),
    "sqrt_": lambda self: F.inplace(self, F.sqrt),
    "neg_": lambda self: F.inplace(self, F.neg),
    "abs_": lambda self: F.inplace(self, F.abs),
    "pow_": lambda self, exponent: F.inplace(self, F.pow, exponent),
    "__abs__": F.abs,
    "__pos__": lambda self: self,
    "__floordiv__": T.floor_divide,
    "__rfloordiv__": lambda self, other: T.floor_divide(other, self),
    "__mod__": T.remainder,
    "__rmod__": lambda self, other: T.remainder(other, self),
    "__rpow__": lambda self, other: F.pow(other, self),
    "__rmatmul__": lambda self, other: F.matmul(
        other if isinstance(other, Tensor) else tensor(other, device=self.device), self
    ),
    "__xor__": lambda self, o: T.logical_xor(self, o) if self.dtype == "bool" else NotImplemented,
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
    "repeat_interleave": lambda self, repeats, dim=None, *, output_size=None: T.repeat_interleave(self, repeats, dim),
    "half": lambda self: self.to("float16"),
    "int": lambda self: self.to("int32"),
    "bool": lambda self: self.to("bool"),
    "type_as": type_as,
    "new_tensor": new_tensor,
    "new_zeros": lambda self, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False: (
        zeros(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
    ),
    "new_full": lambda self,
    size,
    fill_value,
    *,
    dtype=None,
    device=None,
    requires_grad=False,
    layout=None,
    pin_memory=False: full(
        size, fill_value, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad
    ),
    "new_empty": lambda self, *size, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False: (
        empty(*size, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)
    ),
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
    "__setitem__": _setitem,
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
    "add_": _inplace_alpha(F.add),
    "sub_": _inplace_alpha(F.sub),
    "mul_": lambda self, value: F.inplace(self, F.mul, value),
    "div_": lambda self, value, *, rounding_mode=None: F.inplace(self, T.div, value, rounding_mode=rounding_mode),
    "add": lambda self, other, *, alpha=1: T.add(self, other, alpha=alpha),
    "sub": lambda self, other, *, alpha=1: T.sub(self, other, alpha=alpha),
    "mul": lambda self, value: F.mul(self, value),
    "div": lambda self, value, *, rounding_mode=None: T.div(self, value, rounding_mode=rounding_mode),
    "pow": F.pow,
    "neg": F.neg,
    "masked_fill_": F.masked_fill_,
    "clamp_": lambda self, min=None, max=None: F.inplace(self, F.clamp, min, max),
    "clamp_min_": lambda self, m: F.inplace(self, F.clamp, m, None),
    "clamp_max_": lambda self, m: F.inplace(self, F.clamp, None, m),
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
    "matmul": lambda self, tensor2: F.matmul(self, tensor2),
    "bmm": lambda self, batch2: T.bmm(self, batch2),
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
