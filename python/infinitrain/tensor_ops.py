"""PyTorch's torch.* functions built from the differentiable ops of infinitrain.functional: creation helpers,
shape and index functions, pointwise math, reductions, linear algebra (einsum among them), comparisons and type
queries. Each takes PyTorch's parameters and gives its dtypes; gradients come from the ops it is made of.

Functions whose result size depends on the values (nonzero, masked_select, unique, bincount) read the values to
the host, as PyTorch's do (a synchronisation).
"""

import builtins
import math
import string

import numpy as np

from infinitrain import autograd, dispatch, dtypes
from infinitrain import functional as F
from infinitrain.functional import ValuesIndices
from infinitrain.tensor import FLOAT_DTYPES, Tensor, empty, from_numpy, full, tensor, zeros

_FLOATS = frozenset(FLOAT_DTYPES)

__all__ = [
    "add",
    "addbmm",
    "addcdiv",
    "addcmul",
    "addmm",
    "all",
    "allclose",
    "any",
    "arctan2",
    "argsort",
    "argwhere",
    "as_tensor",
    "atan2",
    "baddbmm",
    "bernoulli",
    "bincount",
    "bmm",
    "broadcast_tensors",
    "broadcast_to",
    "can_cast",
    "cdist",
    "chunk",
    "clamp",
    "clip",
    "clone",
    "concat",
    "concatenate",
    "count_nonzero",
    "cumprod",
    "detach",
    "diag",
    "diagonal",
    "dist",
    "div",
    "divide",
    "dot",
    "einsum",
    "empty_strided",
    "eq",
    "equal",
    "exp2",
    "eye",
    "flip",
    "floor_divide",
    "fmod",
    "gather",
    "ge",
    "ger",
    "greater",
    "greater_equal",
    "gt",
    "hstack",
    "index_add",
    "index_select",
    "inference_mode",
    "inner",
    "is_inference_mode_enabled",
    "isclose",
    "isfinite",
    "isinf",
    "isnan",
    "isneginf",
    "isposinf",
    "kthvalue",
    "le",
    "lerp",
    "less",
    "less_equal",
    "linspace",
    "log10",
    "log2",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logspace",
    "logsumexp",
    "lt",
    "masked_fill",
    "masked_select",
    "max",
    "median",
    "meshgrid",
    "min",
    "mm",
    "movedim",
    "mul",
    "multiply",
    "mv",
    "nan_to_num",
    "narrow",
    "ne",
    "neg",
    "negative",
    "nonzero",
    "norm",
    "normal",
    "not_equal",
    "numel",
    "outer",
    "permute",
    "pow",
    "prod",
    "promote_types",
    "randint_like",
    "reciprocal",
    "remainder",
    "repeat_interleave",
    "reshape",
    "result_type",
    "roll",
    "scatter",
    "scatter_add",
    "set_grad_enabled",
    "sort",
    "split",
    "square",
    "squeeze",
    "std_mean",
    "sub",
    "subtract",
    "swapaxes",
    "t",
    "take_along_dim",
    "tan",
    "tensor_split",
    "tile",
    "topk",
    "trace",
    "transpose",
    "true_divide",
    "unbind",
    "unflatten",
    "unique",
    "unsqueeze",
    "var_mean",
    "vdot",
    "vstack",
]


def _t(x, like=None):
    """x as a tensor (a Python number beside `like` takes PyTorch's scalar dtype)."""
    if isinstance(x, Tensor):
        return x
    if like is not None:
        return tensor(x, dtype=dispatch.scalar_dtype(x, like.dtype), device=like.device)
    return tensor(x)


def _float(x):
    return x if x.dtype in _FLOATS else F.cast(x, dtypes.get_default_dtype())


# ---- creation ------------------------------------------------------------------------------------------------


def as_tensor(data, dtype=None, device=None):
    """data as a tensor: a tensor already of that dtype and device is returned as it is."""
    if isinstance(data, Tensor):
        out = data
        if dtype is not None and out.dtype != dtype:
            out = F.cast(out, dtype)
        if device is not None and out.device != device:
            out = out.to(device)
        return out
    return tensor(data, dtype=dtype, device=device or "cpu")


def linspace(start, end, steps, *, dtype=None, device="cpu", requires_grad=False):
    values = np.linspace(float(start), float(end), int(steps))
    out = from_numpy(values, dtype=dtype or dtypes.get_default_dtype(), device=device)
    return out.requires_grad_() if requires_grad else out


def logspace(start, end, steps, base=10.0, *, dtype=None, device="cpu", requires_grad=False):
    values = np.power(float(base), np.linspace(float(start), float(end), int(steps)))
    out = from_numpy(values, dtype=dtype or dtypes.get_default_dtype(), device=device)
    return out.requires_grad_() if requires_grad else out


def eye(n, m=None, *, dtype=None, device="cpu", requires_grad=False):
    out = from_numpy(
        np.eye(int(n), int(n if m is None else m)), dtype=dtype or dtypes.get_default_dtype(), device=device
    )
    return out.requires_grad_() if requires_grad else out


def randint_like(input, low=0, high=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    from infinitrain.tensor import randint

    if high is None:
        low, high = 0, low
    return randint(
        low, high, input.shape, generator=generator, dtype=dtype or input.dtype, device=device or input.device
    )


def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    """Normal draws: mean and std tensors or numbers (broadcast), or numbers with a size."""
    from infinitrain.tensor import randn

    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        like = mean if isinstance(mean, Tensor) else std
        shape = np.broadcast_shapes(tuple(getattr(mean, "shape", ())), tuple(getattr(std, "shape", ())))
        z = randn(*shape, dtype=like.dtype, device=like.device, generator=generator)
        return F.add(F.mul(z, std), mean)
    if size is None:
        raise TypeError("normal(mean, std, size): size is needed when mean and std are numbers")
    z = randn(*tuple(size), dtype=dtype or dtypes.get_default_dtype(), device=device or "cpu", generator=generator)
    out = F.affine(z, float(std), float(mean))
    return out.requires_grad_() if requires_grad else out


def bernoulli(input, p=None, *, generator=None):
    """1.0 with probability input (or p) per element, else 0.0, in input's dtype."""
    from infinitrain.tensor import rand_like

    u = rand_like(_float(input), generator=generator)
    prob = input if p is None else full(input.shape, float(p), dtype=u.dtype, device=input.device)
    return F.cast(F.lt(u, prob), input.dtype if input.dtype in _FLOATS else u.dtype)


# ---- grad mode -----------------------------------------------------------------------------------------------


class inference_mode(autograd._GradMode):  # noqa: N801 (PyTorch's name)
    """Like no_grad (a context manager and decorator): no graph is recorded inside."""

    def __init__(self, mode=True):
        super().__init__(not mode)

    def __call__(self, fn):
        if isinstance(fn, bool):  # inference_mode(False) used as a decorator factory's argument
            return inference_mode(fn)
        return super().__call__(fn)


def is_inference_mode_enabled():
    return not autograd.is_grad_enabled()


class set_grad_enabled(autograd._GradMode):  # noqa: N801
    """set_grad_enabled(mode): sets grad mode at once (as a function) and restores it at the end of a `with`."""

    def __init__(self, mode):
        super().__init__(bool(mode))
        self.prev = autograd.is_grad_enabled()
        autograd._state.enabled = bool(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        autograd._state.enabled = self.prev


# ---- shapes and joining --------------------------------------------------------------------------------------

concat = F.cat


def concatenate(tensors, axis=0):
    return F.cat(tensors, axis)


def hstack(tensors):
    tensors = list(tensors)
    return F.cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    return F.cat([t if t.ndim > 1 else t.reshape(1, -1) for t in tensors], 0)


def split(tensor, split_size_or_sections, dim=0):
    return F.split(tensor, split_size_or_sections, dim)


def chunk(input, chunks, dim=0):
    return input.chunk(chunks, dim)


def tensor_split(input, indices_or_sections, dim=0):
    """Pieces of nearly equal size (an int: the first n % k pieces one longer) or cut at the given indices."""
    n = input.shape[dim]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if k < 1:
            raise ValueError(f"tensor_split: sections must be >= 1, got {k}")
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    else:
        cuts = [builtins.min(builtins.max(int(c), 0), n) for c in indices_or_sections]
        bounds = [0, *cuts, n]
        sizes = [builtins.max(b - a, 0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return F.split(input, sizes, dim)


def unbind(input, dim=0):
    return input.unbind(dim)


def squeeze(input, dim=None):
    return input.squeeze(dim)


def unsqueeze(input, dim):
    return input.unsqueeze(dim)


def reshape(input, shape):
    return input.reshape(shape)


def unflatten(input, dim, sizes):
    dim %= builtins.max(input.ndim, 1)
    return input.reshape(input.shape[:dim] + tuple(sizes) + input.shape[dim + 1 :])


def transpose(input, dim0, dim1):
    return input.transpose(dim0, dim1)


def swapaxes(input, axis0, axis1):
    return input.transpose(axis0, axis1)


def permute(input, dims):
    return F.permute(input, [d % input.ndim for d in dims])


def movedim(input, source, destination):
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    n = input.ndim
    src, dst = [s % n for s in src], [d % n for d in dst]
    rest = [d for d in range(n) if d not in src]
    order = [None] * n
    for s, d in zip(src, dst, strict=True):
        order[d] = s
    it_rest = iter(rest)
    order = [o if o is not None else next(it_rest) for o in order]
    return F.permute(input, order)


def t(input):
    """The transpose of a tensor of at most 2 dims."""
    if input.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, got {input.ndim}")
    return input if input.ndim < 2 else input.transpose(0, 1)


def narrow(input, dim, start, length):
    dim %= input.ndim
    start = int(start) % input.shape[dim] if int(start) < 0 else int(start)
    if start + length > input.shape[dim]:
        raise IndexError(f"narrow: start ({start}) + length ({length}) exceeds dimension size ({input.shape[dim]})")
    return F.slice(input, dim, start, start + int(length))


def _ids(index):
    return index if index.dtype == "int64" else F.cast(index, "int64")


def _flat_positions(input, dim, index):
    """Flat positions in input of index's elements along dim (index may be smaller than input outside dim, as
    PyTorch allows): the element at p goes to p with p[dim] replaced by index[p]."""
    strides = [int(np.prod(input.shape[d + 1 :])) for d in range(input.ndim)]
    grid = np.indices(index.shape).reshape(index.ndim, -1)
    base = sum(grid[d] * strides[d] for d in range(index.ndim) if d != dim)
    base = from_numpy(np.asarray(base, dtype=np.int64).reshape(-1), device=input.device)
    return F.add(base, F.mul(_ids(index).reshape(-1), strides[dim]))


def _scatter_sum(base, dim, index, src):
    """base with src's elements added at index along dim: the op directly when index matches base outside dim,
    else through flat positions."""
    if index.shape == src.shape and builtins.all(index.shape[d] == base.shape[d] for d in range(base.ndim) if d != dim):
        return F.scatter_add(base, dim, index, src)
    pos = _flat_positions(base, dim, index)
    for d, n in enumerate(index.shape):
        if src.shape[d] != n:
            src = F.slice(src, d, 0, n)
    return F.scatter_add(base.reshape(-1), 0, pos, src.reshape(-1)).reshape(base.shape)


def scatter_add(input, dim, index, src):
    return _scatter_sum(input, dim % input.ndim, _ids(index), src)


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """input with src's values (or value) written at index along dim. With repeated indices the written values
    are summed (PyTorch keeps one of them, which one unspecified)."""
    if reduce is not None:
        raise NotImplementedError("scatter: reduce= is not supported; use scatter_add or scatter_reduce")
    dim %= input.ndim
    index = _ids(index)
    if src is None:
        if value is None:
            raise TypeError("scatter: pass src or value")
        src = full(index.shape, value, dtype=input.dtype, device=input.device)
    elif not isinstance(src, Tensor):
        src = full(index.shape, src, dtype=input.dtype, device=input.device)
    for d, n in enumerate(index.shape):  # src may be larger than index: its leading part is used
        if src.shape[d] != n:
            src = F.slice(src, d, 0, n)
    base = input if input.dtype in _FLOATS else F.cast(input, "float64")
    srcw = src if src.dtype == base.dtype else F.cast(src, base.dtype)
    z = zeros(base.shape, dtype=base.dtype, device=base.device)
    hit = F.gt(_scatter_sum(z, dim, index, full(index.shape, 1.0, dtype=base.dtype, device=base.device)), 0.0)
    placed = _scatter_sum(z, dim, index, srcw)
    out = F.where(hit, placed, base)
    return out if out.dtype == input.dtype else F.cast(out, input.dtype)


def index_add(input, dim, index, source, *, alpha=1):
    """input with alpha * source's slices along dim added at the positions index (1-d) names; repeats add up."""
    dim %= input.ndim
    ids = _ids(index).reshape([-1 if d == dim else 1 for d in range(source.ndim)])
    ids = F.cast(F.expand(F.cast(ids, "float64"), source.shape), "int64") if ids.shape != source.shape else ids
    src = source if alpha == 1 else F.mul(source, alpha)
    if input.dtype not in _FLOATS:
        return F.cast(F.scatter_add(F.cast(input, "float64"), dim, ids, F.cast(src, "float64")), input.dtype)
    return F.scatter_add(input, dim, ids, src if src.dtype == input.dtype else F.cast(src, input.dtype))


def gather(input, dim, index, *, sparse_grad=False):
    return F.gather(input, dim % input.ndim, _ids(index))


def index_select(input, dim, index):
    return F.index_select(input, dim, index)


def take_along_dim(input, indices, dim=None):
    if dim is None:
        return F.gather(input.reshape(-1), 0, _ids(indices).reshape(-1))
    dim %= input.ndim
    shape = list(np.broadcast_shapes(input.shape[:dim] + (1,) + input.shape[dim + 1 :], indices.shape))
    ishape = list(shape)
    ishape[dim] = indices.shape[dim]
    xshape = list(shape)
    xshape[dim] = input.shape[dim]
    x = input if tuple(xshape) == input.shape else F.expand(input, xshape)
    idx = _ids(indices)
    idx = idx if tuple(ishape) == idx.shape else F.expand(F.cast(idx, "float64"), ishape)
    return F.gather(x, dim, _ids(idx))


def masked_fill(input, mask, value):
    return F.masked_fill(input, mask, value)


def masked_select(input, mask):
    """The elements of input where mask (broadcast) is True, as a 1-d tensor (reads the mask to the host)."""
    shape = np.broadcast_shapes(input.shape, mask.shape)
    x = input if input.shape == shape else F.expand(input, shape)
    ids = np.flatnonzero(np.broadcast_to(mask.numpy().astype(bool), shape).reshape(-1))
    return F.index_select(x.reshape(-1), 0, ids)


def nonzero(input, *, as_tuple=False):
    """Indices of the nonzero elements: [n, ndim] int64, or one 1-d tensor per dim with as_tuple."""
    idx = np.argwhere(input.numpy() != 0)
    if as_tuple:
        if input.ndim == 0:
            return (from_numpy(idx[:, :1].reshape(-1) * 0, device=input.device),)
        return tuple(from_numpy(np.ascontiguousarray(idx[:, d]), device=input.device) for d in range(input.ndim))
    return from_numpy(idx.astype(np.int64), device=input.device)


def argwhere(input):
    return nonzero(input)


def diagonal(input, offset=0, dim1=0, dim2=1):
    """The diagonal of the (dim1, dim2) planes, offset above (> 0) or below (< 0), as the last dim."""
    n = input.ndim
    d1, d2 = dim1 % n, dim2 % n
    rest = [d for d in range(n) if d not in (d1, d2)]
    x = F.permute(input, rest + [d1, d2]) if rest + [d1, d2] != list(range(n)) else input
    r, c = x.shape[-2], x.shape[-1]
    rows = np.arange(builtins.max(0, -offset), r)
    cols = rows + offset
    keep = cols < c
    flat = rows[keep] * c + cols[keep]
    return F.index_select(x.reshape(x.shape[:-2] + (r * c,)), -1, flat)


def diag(input, diagonal=0):
    """A 1-d input becomes a square matrix with it on the given diagonal; a 2-d input gives that diagonal."""
    if input.ndim == 2:
        return globals()["diagonal"](input, diagonal)
    if input.ndim != 1:
        raise ValueError(f"diag: expected a 1-d or 2-d tensor, got {input.ndim}-d")
    n = input.shape[0]
    size = n + builtins.abs(diagonal)
    rows = np.arange(n) + builtins.max(0, -diagonal)
    pos = rows * size + rows + diagonal
    base = input if input.dtype in _FLOATS else F.cast(input, "float64")
    z = zeros(size * size, dtype=base.dtype, device=input.device)
    out = F.scatter_add(z, 0, from_numpy(pos, device=input.device), base).reshape(size, size)
    return out if out.dtype == input.dtype else F.cast(out, input.dtype)


def trace(input):
    return F.sum(diagonal(input))


def flip(input, dims):
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = input
    for d in dims:
        d %= input.ndim
        out = F.index_select(out, d, np.arange(input.shape[d] - 1, -1, -1))
    return out


def roll(input, shifts, dims=None):
    if dims is None:
        return roll(input.reshape(-1), shifts, 0).reshape(input.shape)
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = input
    for s, d in zip(shifts, dims, strict=True):
        n = input.shape[d]
        if n:
            out = F.index_select(out, d, (np.arange(n) - s) % n)
    return out


def repeat_interleave(input, repeats, dim=None, *, output_size=None):
    """Each element (or slice along dim) repeated: an int, or one count per element (a tensor or list)."""
    x = input.reshape(-1) if dim is None else input
    d = 0 if dim is None else dim % x.ndim
    if isinstance(repeats, int):
        return F.repeat_interleave(x, repeats, d)
    counts = np.asarray(repeats.numpy() if isinstance(repeats, Tensor) else repeats).astype(np.int64).reshape(-1)
    if counts.size == 1:
        return F.repeat_interleave(x, int(counts[0]), d)
    if counts.size != x.shape[d] or (counts < 0).any():
        raise ValueError(f"repeat_interleave: expected {x.shape[d]} non-negative repeats, got {counts.size}")
    return F.index_select(x, d, np.repeat(np.arange(x.shape[d]), counts))


def tile(input, dims):
    dims = tuple(dims)
    if len(dims) < input.ndim:
        dims = (1,) * (input.ndim - len(dims)) + dims
    return input.repeat(*dims)


def broadcast_to(input, shape):
    return F.expand(input, tuple(shape))


def broadcast_tensors(*tensors):
    shape = np.broadcast_shapes(*(t.shape for t in tensors))
    return tuple(t if t.shape == shape else F.expand(t, shape) for t in tensors)


def meshgrid(*tensors, indexing="ij"):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = list(tensors)
    xy = indexing == "xy" and len(ts) >= 2
    if xy:  # 'xy' is 'ij' with the first two inputs and outputs swapped
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t.numel() for t in ts)
    out = []
    for i, t_ in enumerate(ts):
        view = [1] * len(ts)
        view[i] = -1
        out.append(F.expand(t_.reshape(view), shape))
    if xy:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


# ---- pointwise -----------------------------------------------------------------------------------------------


def clamp(input, min=None, max=None):  # noqa: A002 (PyTorch's names)
    return F.clamp(input, min, max)


clip = clamp


def neg(input):
    return F.neg(input)


negative = neg


def exp2(input):
    return F.exp(F.mul(_float(input), math.log(2.0)))


def log2(input):
    return F.mul(F.log(_float(input)), 1.0 / math.log(2.0))


def log10(input):
    return F.mul(F.log(_float(input)), 1.0 / math.log(10.0))


def square(input):
    return F.mul(input, input)


def tan(input):
    x = _float(input)
    return F.div(F.sin(x), F.cos(x))


def reciprocal(input):
    return F.pow(_float(input), -1.0)


def add(input, other, *, alpha=1):
    if alpha != 1:
        other = F.mul(other, alpha) if isinstance(other, Tensor) else other * alpha
    return F.add(input, other) if isinstance(input, Tensor) else F.add(_t(other), input)


def sub(input, other, *, alpha=1):
    if alpha != 1:
        other = F.mul(other, alpha) if isinstance(other, Tensor) else other * alpha
    return F.sub(input, other) if isinstance(input, Tensor) else F.rsub(_t(other), input)


subtract = sub


def mul(input, other):
    return F.mul(input, other) if isinstance(input, Tensor) else F.mul(other, input)


multiply = mul


def div(input, other, *, rounding_mode=None):
    """True division, or with rounding_mode 'trunc' or 'floor' the rounded quotient (integers stay integers)."""
    if rounding_mode not in (None, "trunc", "floor"):
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    input, other = _pair(input, other)
    if rounding_mode is None:
        return F.div(input, other)
    rnd = F.floor if rounding_mode == "floor" else F.trunc
    dtype = dispatch.result_dtype(input, other)
    if dtype in _FLOATS:
        return rnd(F.div(input, other))
    # Integers: the quotient in float64 (exact below 2**53), rounded, back to the integer dtype.
    return F.cast(rnd(F.div(F.cast(input, "float64"), F.cast(other, "float64"))), dtype)


divide = div


def true_divide(dividend, divisor):
    return F.div(dividend, divisor)


def floor_divide(input, other):
    return div(input, other, rounding_mode="floor")


def pow(input, exponent):
    return F.pow(input, exponent)


def _pair(input, other):
    if not isinstance(input, Tensor):
        input = _t(input, other)
    if not isinstance(other, Tensor):
        other = _t(other, input)
    return input, other


def remainder(input, other):
    return F.remainder(*_pair(input, other))


def fmod(input, other):
    return F.fmod(*_pair(input, other))


def atan2(input, other):
    return F.atan2(*_pair(_float(input), other))


arctan2 = atan2


def lerp(input, end, weight):
    """input + weight * (end - input)."""
    return F.add(input, F.mul(F.sub(end, input), weight))


def addcmul(input, tensor1, tensor2, *, value=1):
    return F.add(input, F.mul(F.mul(tensor1, tensor2), value))


def addcdiv(input, tensor1, tensor2, *, value=1):
    return F.add(input, F.mul(F.div(tensor1, tensor2), value))


def isnan(input):
    if input.dtype not in _FLOATS:
        return F.ne(input, input)
    return F.ne(input, input)


def isinf(input):
    if input.dtype not in _FLOATS:
        return F.ne(input, input)  # all False, as a bool tensor
    return F.eq(F.abs(input), math.inf)


def isfinite(input):
    if input.dtype not in _FLOATS:
        return F.eq(input, input)
    return F.eq(F.sub(input, input), 0.0)


def isposinf(input):
    return F.eq(input, math.inf)


def isneginf(input):
    return F.eq(input, -math.inf)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    if input.dtype not in _FLOATS:
        return F.clone(input)
    fi = dtypes.finfo(input.dtype)
    hi = fi.max if posinf is None else posinf
    lo = fi.min if neginf is None else neginf
    out = F.masked_fill(input, F.ne(input, input), float(nan))
    out = F.masked_fill(out, F.eq(input, math.inf), float(hi))
    return F.masked_fill(out, F.eq(input, -math.inf), float(lo))


def logical_not(input):
    return F.logical_not(input)


def _bool(x):
    return x if x.dtype == "bool" else F.ne(x, 0)


def logical_and(input, other):
    return F.cast(F.mul(F.cast(_bool(input), "float32"), F.cast(_bool(_t(other, input)), "float32")), "bool")


def logical_or(input, other):
    a, b = F.cast(_bool(input), "float32"), F.cast(_bool(_t(other, input)), "float32")
    return F.gt(F.add(a, b), 0.0)


def logical_xor(input, other):
    return F.ne(_bool(input), _bool(_t(other, input)))


def eq(input, other):
    return F.eq(input, other)


def ne(input, other):
    return F.ne(input, other)


def lt(input, other):
    return F.lt(input, other)


def le(input, other):
    return F.le(input, other)


def gt(input, other):
    return F.gt(input, other)


def ge(input, other):
    return F.ge(input, other)


greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other|, elementwise (infinities close only to themselves)."""
    a, b = _pair(input, other)
    work = "float64" if "float64" in (a.dtype, b.dtype) else "float32"
    a, b = F.cast(a, work), F.cast(b, work)
    diff = F.abs(F.sub(a, b))
    close = F.le(diff, F.add(F.mul(F.abs(b), rtol), atol))
    same = F.eq(a, b)  # infinities of one sign, and exact equality
    out = logical_or(close, same)
    if equal_nan:
        out = logical_or(out, logical_and(isnan(a), isnan(b)))
    return out


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(all(isclose(input, other, rtol, atol, equal_nan)).item())


def equal(input, other):
    """True when both have the same shape and elements (a host read)."""
    if input.shape != other.shape:
        return False
    return bool(all(F.eq(input, other)).item())


# ---- reductions ----------------------------------------------------------------------------------------------


def _dims_of(x, dim):
    if dim is None:
        return list(range(x.ndim))
    return [dim % builtins.max(x.ndim, 1)] if isinstance(dim, int) else [d % builtins.max(x.ndim, 1) for d in dim]


def all(input, dim=None, keepdim=False):  # noqa: A001 (PyTorch's name)
    """Whether every element (along dim) is nonzero, as a bool tensor."""
    bad = F.cast(F.eq(input, 0) if input.dtype != "bool" else F.logical_not(input), "float32")
    return F.eq(F.sum(bad, dim, keepdim), 0.0)


def any(input, dim=None, keepdim=False):  # noqa: A001
    good = F.cast(_bool(input), "float32")
    return F.gt(F.sum(good, dim, keepdim), 0.0)


def count_nonzero(input, dim=None):
    return F.cast(F.sum(F.cast(_bool(input), "float64"), dim), "int64")


def var_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    c = (1 if unbiased else 0) if unbiased is not None else correction
    return F.var(input, dim, keepdim=keepdim, correction=c), F.mean(input, dim, keepdim)


def std_mean(input, dim=None, *, correction=1, keepdim=False, unbiased=None):
    c = (1 if unbiased else 0) if unbiased is not None else correction
    return F.std(input, dim, keepdim=keepdim, correction=c), F.mean(input, dim, keepdim)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """The product (along dim): magnitudes as exp of a float64 sum of logs, the sign from the count of negatives,
    zero when an element is zero; its gradient is the product of the other elements (exact for one zero)."""
    if dtype is not None:
        input = F.cast(input, dtype)
    out_dtype = input.dtype if input.dtype in _FLOATS else "int64"
    x = F.cast(input, "float64")
    dims = _dims_of(x, dim) if x.ndim else None
    xd = x.detach()
    zero = F.cast(F.eq(xd, 0.0), "float64")
    neg = F.cast(F.lt(xd, 0.0), "float64")
    safe = F.where(F.eq(xd, 0.0), 1.0, F.abs(xd))
    logsum = F.sum(F.log(safe), dims, keepdim=True)
    zeros_n = F.sum(zero, dims, keepdim=True)
    negs = F.sum(neg, dims, keepdim=True)
    sign = F.affine(F.remainder(negs, _t(2.0, negs)), -2.0, 1.0)
    others = F.mul(F.exp(logsum), sign)  # the product of the nonzero elements
    full_prod = F.mul(others, F.cast(F.eq(zeros_n, 0.0), "float64"))
    out = (
        _ProdNode.apply(x, full_prod, others, zeros_n) if x.requires_grad and autograd.is_grad_enabled() else full_prod
    )
    if not keepdim and dims is not None:
        out = out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in dims))
    elif x.ndim == 0:
        out = out.reshape(())
    if out_dtype == "int64":
        out = F.round(out)  # exp of a sum of logs lands near, not on, the integer
    return out if out_dtype == "float64" else F.cast(out, out_dtype)


class _ProdNode:
    @staticmethod
    def apply(x, full_prod, others, zeros_n):
        out = Tensor(full_prod._t)

        def backward(g):
            xd = x.detach()
            nonzero = F.where(F.eq(xd, 0.0), 1.0, xd)
            g_nz = F.div(F.mul(g, full_prod), nonzero)  # for nonzero elements: prod / x
            g_z = F.mul(g, F.mul(others, F.cast(F.eq(zeros_n, 1.0), "float64")))  # the only zero: the others' product
            return (F.where(F.eq(xd, 0.0), g_z, g_nz),)

        return dispatch.record(out, (x,), backward, "prod")


def cumprod(input, dim, *, dtype=None):
    """Running products along dim (float64 logs and a running sign and zero count); the gradient is taken through
    those ops, so it is NaN at elements that are 0."""
    if dtype is not None:
        input = F.cast(input, dtype)
    x = F.cast(input, "float64")
    zero = F.cast(F.eq(x, 0.0), "float64")
    safe = F.where(F.eq(x, 0.0), 1.0, F.abs(x))
    mag = F.exp(F.cumsum(F.log(safe), dim))
    negs = F.cumsum(F.cast(F.lt(x, 0.0), "float64"), dim)
    sign = F.affine(F.remainder(negs, _t(2.0, negs)), -2.0, 1.0)
    out = F.mul(F.mul(mag, sign), F.cast(F.eq(F.cumsum(zero, dim), 0.0), "float64"))
    if input.dtype not in _FLOATS:
        return F.cast(F.round(out), "int64")
    return F.cast(out, input.dtype)


def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(input))) along dim, shifted by the maximum so nothing overflows."""
    x = _float(input)
    m = F.amax(x.detach(), dim, keepdim=True)
    m = F.masked_fill(m, F.eq(F.abs(m), math.inf), 0.0)  # all -inf (or +inf) rows: no inf - inf
    out = F.add(F.log(F.sum(F.exp(F.sub(x, m)), dim, keepdim=True)), m)
    if not keepdim:
        out = out.reshape(tuple(s for i, s in enumerate(x.shape) if i not in _dims_of(x, dim)))
    return out


def max(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    """The maximum; with an int dim, (values, indices); with a tensor, the elementwise maximum."""
    return input.max(dim, keepdim)


def min(input, dim=None, keepdim=False, *, out=None):  # noqa: A001
    return input.min(dim, keepdim)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """The vector p-norm over dim (all elements by default): 'fro' and 2, 1, inf, -inf, 0 or any p."""
    x = _float(input) if dtype is None else F.cast(input, dtype)
    a = F.abs(x)
    if p in ("fro", 2, 2.0):
        return F.sqrt(F.sum(F.mul(x, x), dim, keepdim))
    if p == "nuc":
        raise NotImplementedError("norm: the nuclear norm is not supported")
    if p == math.inf:
        return F.amax(a, dim, keepdim)
    if p == -math.inf:
        return F.amin(a, dim, keepdim)
    if p == 0:
        return F.sum(F.cast(F.ne(x, 0.0), x.dtype), dim, keepdim)
    if p == 1:
        return F.sum(a, dim, keepdim)
    return F.pow(F.sum(F.pow(a, float(p)), dim, keepdim), 1.0 / float(p))


def dist(input, other, p=2):
    return norm(F.sub(input, other), p)


def sort(input, dim=-1, descending=False, stable=False):
    return F.sort(input, dim, descending, stable)


def argsort(input, dim=-1, descending=False, stable=False):
    return F.argsort(input, dim, descending, stable)


def topk(input, k, dim=-1, largest=True, sorted=True):
    return ValuesIndices(*F.topk(input, k, dim, largest, sorted))


def kthvalue(input, k, dim=-1, keepdim=False):
    """The k-th smallest value (1-based) along dim and its index."""
    n = input.shape[dim]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue: k ({k}) out of range for a dimension of size {n}")
    v, i = F.sort(input, dim)
    at = (slice(None),) * (dim % input.ndim) + (k - 1,)
    v, i = F.getitem(v, at), F.getitem(i, at)
    if keepdim:
        v, i = v.unsqueeze(dim), i.unsqueeze(dim)
    return ValuesIndices(v, i)


def median(input, dim=None, keepdim=False):
    """The lower median (of an even count, the smaller middle value), as PyTorch's; with dim also its index."""
    if dim is None:
        flat = input.reshape(-1)
        v, _ = F.sort(flat)
        return F.getitem(v, (flat.shape[0] - 1) // 2)
    return kthvalue(input, (input.shape[dim] - 1) // 2 + 1, dim, keepdim)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values, sorted (a host read, as PyTorch's); optionally the inverse map and the counts."""
    a = input.numpy()
    if dim is not None:
        values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True, axis=dim)
    else:
        values, inverse, counts = np.unique(a.reshape(-1), return_inverse=True, return_counts=True)
        inverse = inverse.reshape(a.shape)
    out = from_numpy(values, dtype=input.dtype, device=input.device)
    extra = []
    if return_inverse:
        extra.append(from_numpy(inverse.astype(np.int64), device=input.device))
    if return_counts:
        extra.append(from_numpy(counts.astype(np.int64), device=input.device))
    return (out, *extra) if extra else out


def bincount(input, weights=None, minlength=0):
    """Counts of each non-negative integer in a 1-d input (weighted sums with weights), on the host."""
    ids = input.numpy()
    if ids.ndim != 1 or (ids.size and ids.min() < 0):
        raise ValueError("bincount: input must be a 1-d tensor of non-negative integers")
    w = None if weights is None else weights.numpy().astype(np.float64)
    counts = np.bincount(ids.astype(np.int64), weights=w, minlength=int(minlength))
    dtype = "int64" if weights is None else (weights.dtype if weights.dtype in _FLOATS else "float64")
    return from_numpy(counts, dtype=dtype, device=input.device)


# ---- linear algebra ------------------------------------------------------------------------------------------


def _check_dims(name, x, n):
    if x.ndim != n:
        raise ValueError(f"{name}: expected a {n}-d tensor, got shape {tuple(x.shape)}")


def mm(input, mat2):
    _check_dims("mm", input, 2)
    _check_dims("mm", mat2, 2)
    return F.matmul(input, mat2)


def bmm(input, mat2):  # Tensor.bmm names it batch2: both positional in practice
    _check_dims("bmm", input, 3)
    _check_dims("bmm", mat2, 3)
    if input.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm: batch sizes differ, {input.shape[0]} and {mat2.shape[0]}")
    return F.matmul(input, mat2)


def mv(input, vec):
    _check_dims("mv", input, 2)
    _check_dims("mv", vec, 1)
    return F.matmul(input, vec.reshape(-1, 1)).reshape(-1)


def dot(input, tensor):  # noqa: A002
    _check_dims("dot", input, 1)
    _check_dims("dot", tensor, 1)
    return F.sum(F.mul(input, tensor))


vdot = dot
inner = dot


def outer(input, vec2):
    return F.mul(input.reshape(-1, 1), vec2.reshape(1, -1))


ger = outer


def _scaled(x, s):
    return x if s == 1 else F.mul(x, s)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return (
        F.add(_scaled(F.matmul(mat1, mat2), alpha), _scaled(input, beta))
        if beta != 0
        else _scaled(F.matmul(mat1, mat2), alpha)
    )


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    prod_ = _scaled(bmm(batch1, batch2), alpha)
    return prod_ if beta == 0 else F.add(prod_, _scaled(input, beta))


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    prod_ = _scaled(F.sum(bmm(batch1, batch2), 0), alpha)
    return prod_ if beta == 0 else F.add(prod_, _scaled(input, beta))


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """Pairwise p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M] -> [..., P, R]."""
    d = F.sub(x1.unsqueeze(-2), x2.unsqueeze(-3))
    return norm(d, p, dim=-1)


def _einsum_parse(equation, operands):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {len(terms)} terms in {equation!r} for {len(operands)} operands")
    free = [c for c in string.ascii_letters if c not in eq]
    ell_dims = builtins.max(
        (op.ndim - (len(tm) - 3) for tm, op in zip(terms, operands, strict=True) if "..." in tm), default=0
    )
    ell = "".join(free[:ell_dims])
    parsed = []
    for tm, op in zip(terms, operands, strict=True):
        if "..." in tm:
            k = op.ndim - (len(tm) - 3)
            tm = tm.replace("...", ell[ell_dims - k :] if k else "")
        if len(tm) != op.ndim:
            raise ValueError(f"einsum: term {tm!r} has {len(tm)} labels for an operand of {op.ndim} dims")
        parsed.append(tm)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {}
        for tm in parsed:
            for c in tm:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    return parsed, out


def _einsum_diag(x, labels):
    """Repeated labels in one operand (ii, iij) take the diagonal."""
    while len(set(labels)) != len(labels):
        for c in labels:
            i, j = labels.index(c), labels.index(c, labels.index(c) + 1) if labels.count(c) > 1 else -1
            if j >= 0:
                x = diagonal(x, 0, i, j)  # the diagonal becomes the last dim
                labels = "".join(ch for k, ch in enumerate(labels) if k not in (i, j)) + c
                break
    return x, labels


def _einsum_sum_out(x, labels, keep):
    """Sums the labels of x that are not in `keep`."""
    drop = [i for i, c in enumerate(labels) if c not in keep]
    if drop:
        x = F.sum(x, drop)
        labels = "".join(c for i, c in enumerate(labels) if i not in drop)
    return x, labels


def _einsum_pair(a, la, b, lb, keep):
    """Contracts two operands; keep: labels needed later (the output's and other operands')."""
    a, la = _einsum_sum_out(a, la, set(lb) | keep)
    b, lb = _einsum_sum_out(b, lb, set(la) | keep)
    batch = [c for c in la if c in lb and c in keep]
    contract = [c for c in la if c in lb and c not in keep]
    a_only = [c for c in la if c not in lb]
    b_only = [c for c in lb if c not in la]
    size = {}
    for x, lx in ((a, la), (b, lb)):
        for c, n in zip(lx, x.shape, strict=True):
            if size.get(c, 1) == 1:
                size[c] = n
    pa = [la.index(c) for c in batch + a_only + contract]
    pb = [lb.index(c) for c in batch + contract + b_only]
    a2 = F.permute(a, pa) if pa != list(range(len(pa))) else a
    b2 = F.permute(b, pb) if pb != list(range(len(pb))) else b
    nb = [size[c] for c in batch]
    # Broadcast batch dims of size 1 up to the other's.
    want_a = tuple(nb + [size[c] for c in a_only + contract])
    want_b = tuple(nb + [size[c] for c in contract + b_only])
    a2 = a2 if a2.shape == want_a else F.expand(a2, want_a)
    b2 = b2 if b2.shape == want_b else F.expand(b2, want_b)
    m = math.prod(size[c] for c in a_only)
    k = math.prod(size[c] for c in contract)
    n = math.prod(size[c] for c in b_only)
    bt = math.prod(nb)
    out = F.matmul(a2.reshape(bt, m, k), b2.reshape(bt, k, n))
    out = out.reshape(tuple(nb + [size[c] for c in a_only] + [size[c] for c in b_only]))
    return out, "".join(batch + a_only + b_only)


def einsum(equation, *operands):
    """Einstein summation over the operands' labelled dims ('ij,jk->ik', '...', implicit output), contracted
    pairwise left to right with matmul."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    terms, out = _einsum_parse(equation, operands)
    xs = []
    for x, lx in zip(operands, terms, strict=True):
        xs.append(_einsum_diag(x, lx))
    x, lx = xs[0]
    for i in range(1, len(xs)):
        later = set(out).union(*(set(l_) for _, l_ in xs[i + 1 :]))
        x, lx = _einsum_pair(x, lx, xs[i][0], xs[i][1], later)
    x, lx = _einsum_sum_out(x, lx, set(out))
    if len(set(out)) != len(out) or builtins.any(c not in lx for c in out):
        raise ValueError(f"einsum: output labels {out!r} must be distinct labels of the inputs")
    order = [lx.index(c) for c in out]
    return F.permute(x, order) if order != list(range(len(order))) else x


# ---- types ---------------------------------------------------------------------------------------------------


def result_type(tensor1, tensor2):
    """The dtype an op on the two (tensors or Python numbers) computes in, by PyTorch's promotion rules."""
    if isinstance(tensor1, Tensor) and isinstance(tensor2, Tensor):
        return dtypes.of(dispatch.result_dtype(tensor1, tensor2))
    if isinstance(tensor1, Tensor):
        return dtypes.of(dispatch.scalar_dtype(tensor2, tensor1.dtype))
    if isinstance(tensor2, Tensor):
        return dtypes.of(dispatch.scalar_dtype(tensor1, tensor2.dtype))
    return dtypes.of(tensor(tensor1).dtype if not isinstance(tensor2, float) else "float32")


def promote_types(type1, type2):
    return dtypes.of(dispatch.promoted_dtype(str(type1), str(type2)))


def can_cast(from_, to):
    kinds = {"bool": 0, "uint8": 1, "int8": 1, "int32": 1, "int64": 1}
    return kinds.get(str(from_), 2) <= kinds.get(str(to), 2)


# ---- misc ----------------------------------------------------------------------------------------------------


def clone(input, *, memory_format=None):
    return F.clone(input)


def detach(input):
    return input.detach()


def numel(input):
    return input.numel()


def empty_strided(size, stride, *, dtype=None, device="cpu", requires_grad=False):
    return empty(*tuple(size), dtype=dtype or dtypes.get_default_dtype(), device=device, requires_grad=requires_grad)
