"""Differentiable ops: each runs its op through the dispatcher and, when a
gradient is needed, records how to map the output gradient back to inputs.
Fused ops (silu, rms_norm, attention, ...) are called like any other: the
dispatcher runs the device's kernel or the op's composite.

This is the per-op hot path: it does one dispatcher call, one Tensor
construction and, only when recording, one closure.
"""

import builtins
import math
from collections import namedtuple

import numpy as np

from infinitrain import amp, autograd, dispatch
from infinitrain import random as _random
from infinitrain.dispatch import needs_grad as _needs_grad
from infinitrain.dispatch import record as _record
from infinitrain.tensor import Tensor, from_numpy, host_rng, tensor, zeros

_call = dispatch.call
_FLOATS = frozenset(("float32", "bfloat16", "float16", "float64"))
_HALF = frozenset(("bfloat16", "float16"))
_FLOAT8 = frozenset(("float8_e4m3fn", "float8_e5m2"))


# Inside a compiled forward (autograd.fusion.on), the ops below that call `_fusion_rules` may return pending tensors
# that later ops fuse (infinitrain.fusion, the layer above, which sets the rules when it loads).
fusion = autograd.fusion
_fusion_rules = None


def set_fusion_rules(rules):
    """Called once by infinitrain.fusion, the layer above that holds the rules."""
    global _fusion_rules
    _fusion_rules = rules


def _run1(name, inputs, attrs=()):
    return Tensor(dispatch.op(name)([t._t for t in inputs], list(attrs))[0])


def _as_tensor(x, like):
    """A Python number as a tensor beside `like`, in the dtype PyTorch gives it (dispatch.scalar_dtype)."""
    if isinstance(x, Tensor):
        return x
    return tensor(x, dtype=dispatch.scalar_dtype(x, like.dtype), device=like.device)


def _exact(name, inputs, attrs=(), dtype=None):
    """Runs a float-only op on integer or bool tensors in float64 (exact for integers up to 2**53) and casts
    the result to `dtype` (default: the first input's), as PyTorch keeps integer arithmetic integer. float8
    tensors are refused: they hold FP8 GEMM operands, and arithmetic on them is not defined (as in PyTorch)."""
    for t in inputs:
        if t.dtype in _FLOAT8:
            raise TypeError(f"{name}: {t.dtype} tensors hold FP8 GEMM operands; cast to a wider float first (.float())")
    out = _run1(name, [cast(t, "float64") for t in inputs], attrs)
    return cast(out, dtype or inputs[0].dtype)


def _promote(a, b):
    """Two tensors cast to the dtype they meet at (PyTorch's result_type: dispatch.result_dtype)."""
    if a.dtype == b.dtype:
        return a, b
    d = dispatch.result_dtype(a, b)
    return (a if a.dtype == d else cast(a, d)), (b if b.dtype == d else cast(b, d))


def sum_to(g, shape):
    """Sums a broadcast gradient back to `shape`."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    r = Tensor(_call("sum", [g], [dims, 1])[0]) if dims else g
    return r.reshape(shape)


# ---- copy, cast, shape ----


def cast(x, dtype):
    out = _run1("cast", [x], [dtype])
    if _needs_grad(x):
        src = x.dtype
        _record(out, (x,), lambda g: (cast(g, src),), "cast")
    return out


cast_eager = cast


def clone(x):
    out = _run1("cast", [x], [x.dtype])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (g,), "clone")
    return out


def to_device(x, device, non_blocking=False):
    out = Tensor(x._t.to(device, non_blocking))
    if _needs_grad(x):
        src = x.device
        _record(out, (x,), lambda g: (to_device(g, src),), "to_device")
    return out


def reshape(x, shape):
    out = Tensor(x._t.reshape(list(shape)))
    if _needs_grad(x):
        src = x.shape
        _record(out, (x,), lambda g: (g.reshape(src),), "reshape")
    return out


def permute(x, dims):
    if fusion.on:
        r = _fusion_rules.permute(x, [int(d) for d in dims])
        if r is not None:
            return r
    return permute_eager(x, dims)


def permute_eager(x, dims):
    dims = [int(d) for d in dims]
    out = _run1("permute", [x], [dims])
    if _needs_grad(x):
        n = len(dims)
        inv = [0] * n
        for i, d in enumerate(dims):
            inv[d % n] = i
        _record(out, (x,), lambda g: (permute(g, inv),), "permute")
    return out


def transpose(x, a, b):
    return x.transpose(a, b)


def expand(x, shape):
    """Materialised broadcast of x to shape (-1 keeps a dimension)."""
    shape = tuple(x.shape[i - (len(shape) - x.ndim)] if s == -1 else s for i, s in enumerate(shape))
    return add(zeros(shape, dtype=x.dtype, device=x.device), x)


def slice(x, dim, start, end, step=1):
    out = _run1("slice", [x], [dim, start, end, step])
    if _needs_grad(x):
        shape = list(x.shape)
        _record(out, (x,), lambda g: (_run1("slice_backward", [g], [shape, dim, start, end, step]),), "slice")
    return out


def _is_advanced(i):
    """An index that selects by value: a tensor, a NumPy array or a list (PyTorch's advanced indexing)."""
    return isinstance(i, (Tensor, list, np.ndarray))


def _expand_ellipsis(x, index):
    if not isinstance(index, tuple):
        index = (index,)
    k = [n for n, i in enumerate(index) if i is Ellipsis]
    if len(k) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if k:
        used = builtins.sum(1 for i in index if i is not None and i is not Ellipsis and not _is_bool_mask(i))
        used += builtins.sum(_mask_ndim(i) for i in index if _is_bool_mask(i))
        index = index[: k[0]] + (builtins.slice(None),) * builtins.max(0, x.ndim - used) + index[k[0] + 1 :]
    return index


def _is_bool_mask(i):
    if isinstance(i, Tensor):
        return i.dtype == "bool"
    if isinstance(i, np.ndarray):
        return i.dtype == np.bool_
    return False


def _mask_ndim(i):
    return i.ndim if isinstance(i, (Tensor, np.ndarray)) else 1


def getitem(x, index):
    """Indexing as in PyTorch: ints, slices (step > 0), None, ..., one integer index (a list, array or integer
    tensor, any shape: its dims replace the indexed dim) and boolean masks (which read the mask to the host,
    since the result's size depends on it)."""
    if type(index) is tuple:  # noqa: E721 (exact type: the common cases skip the scans below)
        if any(i is Ellipsis for i in index):
            index = _expand_ellipsis(x, index)
        if any(_is_advanced(i) for i in index):
            return _advanced_getitem(x, index)
    elif type(index) in (int, builtins.slice):
        index = (index,)
    else:
        index = _expand_ellipsis(x, index)
        if _is_advanced(index[0]):
            return _advanced_getitem(x, index)
    out, dim, new_shape = x, 0, []
    for i in index:
        if i is None:
            new_shape.append(1)
            continue
        if dim >= x.ndim:
            raise IndexError(f"too many indices for a {x.ndim}-d tensor")
        n = x.shape[dim]
        if isinstance(i, bool):
            raise TypeError("boolean indices that are Python bools are not supported: use a bool tensor as a mask")
        if hasattr(i, "__index__") and not isinstance(i, builtins.slice):
            i = i.__index__()  # NumPy integers
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for dimension {dim} of size {n}")
            i %= n
            out = slice(out, dim, i, i + 1, 1)
        elif isinstance(i, builtins.slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise ValueError("negative slice steps are not supported (PyTorch has none either)")
            if (start, stop, step) != (0, n, 1):
                out = slice(out, dim, start, stop, step)
            new_shape.append(out.shape[dim])
        else:
            raise TypeError(f"unsupported index {i!r}: use ints, slices, None, ..., lists, or integer or bool tensors")
        dim += 1
    new_shape += list(out.shape[dim:])
    return out.reshape(new_shape) if tuple(new_shape) != out.shape else out


def _mask_to_ids(mask, shape, dim):
    """A bool mask over dims [dim, dim + mask.ndim) of `shape` as int64 ids into those dims flattened."""
    m = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    want = tuple(shape[dim : dim + m.ndim])
    if m.shape != want:
        raise IndexError(f"the boolean mask's shape {m.shape} does not match the indexed dims {want}")
    return np.flatnonzero(m.reshape(-1))


def _advanced_getitem(x, index):
    basic, adv, dim, out_dim = [], None, 0, 0
    for i in index:
        if _is_advanced(i):
            if adv is not None:
                raise NotImplementedError(
                    "indexing with more than one list, array or tensor index is not supported: index one dim at "
                    "a time"
                )
            if _is_bool_mask(i):
                nd = _mask_ndim(i)
                ids = _mask_to_ids(i, x.shape, dim)
                adv = (out_dim, nd, ids)
                basic.extend([builtins.slice(None)] * nd)
                dim += nd
                out_dim += nd
                continue
            adv = (out_dim, 1, i)
            basic.append(builtins.slice(None))
        else:
            basic.append(i)
            if i is None:
                out_dim += 1
                continue
            if not isinstance(i, builtins.slice):  # an int drops its dim
                dim += 1
                continue
        dim += 1
        out_dim += 1
    out = getitem(x, tuple(basic))
    at, nd, ids = adv
    if nd != 1:  # a mask over several dims: flatten them, then select
        out = out.reshape(out.shape[:at] + (-1,) + out.shape[at + nd :])
    return index_select(out, at, ids)


def _index_ids(index, n, device):
    """Integer ids (list, array or tensor) as an int64 tensor on `device`, negative ids counted from the end."""
    if isinstance(index, Tensor):
        if index.dtype in _FLOATS or index.dtype == "bool":
            raise IndexError(f"tensors used as indices must be integer or bool tensors, got {index.dtype}")
        ids = index if index.dtype == "int64" else cast(index, "int64")
        ids = ids if ids.device == device else to_device(ids, device)
        return add(ids, mul(cast(lt(ids, 0), "int64"), n))  # on the device: no host synchronisation
    arr = np.asarray(index)
    if arr.dtype == np.bool_ or (arr.size and arr.dtype.kind not in "iu"):
        raise IndexError(f"list and array indices must hold integers, got {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and (arr.min() < -n or arr.max() >= n):
        raise IndexError(f"index {int(arr.max() if arr.max() >= n else arr.min())} is out of range for size {n}")
    return from_numpy(np.where(arr < 0, arr + n, arr), device=device)


def index_select(x, dim, index):
    """x's slices along dim at the ids in `index` (any shape; its dims replace dim), differentiable in x."""
    dim %= x.ndim
    n = x.shape[dim]
    ids = _index_ids(index, n, x.device)
    moved = x if dim == 0 else permute(x, [dim] + [d for d in range(x.ndim) if d != dim])
    rest = moved.shape[1:]
    table = moved.reshape(n, -1)
    if table.dtype in _FLOATS:
        rows = embedding(ids.reshape(-1), table)
    else:
        rows = cast(embedding(ids.reshape(-1), cast(table, "float64")), x.dtype)
    out = rows.reshape(tuple(ids.shape) + tuple(rest))
    if dim:
        k = ids.ndim
        order = list(range(k, k + dim)) + list(range(k)) + list(range(k + dim, out.ndim))
        out = permute(out, order)
    return out


def _positions(x, index):
    """Float64 ids of the elements x[index] selects (exact below 2**53), in the selection's shape."""
    ids = from_numpy(np.arange(x.numel(), dtype=np.float64).reshape(x.shape), device=x.device)
    return getitem(ids, index)


def setitem(x, index, value):
    """x[index] = value: the elements selected as getitem selects them (duplicate ids: the last is not
    guaranteed to win, as in PyTorch). A bool mask of x's shape with a number is one masked_fill."""
    target, x = x, _before_write(x)
    if not isinstance(value, Tensor):
        if _is_bool_mask(index) and isinstance(index, Tensor) and tuple(index.shape) == x.shape:
            return _commit(target, masked_fill(x, index, value))
        value = tensor(value, dtype=x.dtype, device=x.device)
    if value.device != x.device:
        value = to_device(value, x.device)
    pos = _positions(x, index)
    n = x.numel()
    flat_ids = cast(pos, "int64").reshape(-1)
    work = x.dtype if x.dtype in _FLOATS else "float64"
    vals = cast(value, work) if value.dtype != work else value
    vals = expand(vals, pos.shape).reshape(-1) if tuple(vals.shape) != tuple(pos.shape) else vals.reshape(-1)
    zeros_n = zeros(n, dtype=work, device=x.device)
    hit = gt(scatter_add(zeros_n, 0, flat_ids, zeros(flat_ids.shape[0], dtype=work, device=x.device).fill_(1.0)), 0.0)
    placed = scatter_add(zeros_n, 0, flat_ids, vals)
    base = x.reshape(-1) if x.dtype == work else cast(x.reshape(-1), work)
    new = where(hit, placed, base).reshape(x.shape)
    return _commit(target, new if new.dtype == x.dtype else cast(new, x.dtype))


def _before_write(x):
    """What an in-place op on x computes from: x itself, or, when x is a graph node, another Tensor object in
    x's place in the graph, so that once x holds the result (_commit), the result's node reaches x's old value
    instead of itself. (Ops that used x before the write still lead to x, hence to the new value: clone x
    before an in-place write when earlier ops used it, as the docs say.)"""
    if x._node is None or not autograd.is_grad_enabled():
        return x
    alias = Tensor(x._t, requires_grad=True)
    alias._node = x._node
    return alias


def inplace(x, fn, *args, **kwargs):
    """x = fn(x, *args) in place (x += y and friends)."""
    return _commit(x, fn(_before_write(x), *args, **kwargs))


def _commit(x, new):
    """Makes x hold `new` (in-place semantics): a copy into x's storage when no graph is involved (views
    sharing the storage see it, and x's version moves on); otherwise x becomes new's graph node."""
    if x.requires_grad and x._node is None and autograd.is_grad_enabled():
        raise RuntimeError(
            "a leaf tensor that requires grad is used in an in-place operation; "
            "do it under it.no_grad() (as optimizers do) or on a copy"
        )
    if new.requires_grad:
        x._t, x._node, x.requires_grad = new._t, new._node, True
        return x
    if new.dtype != x.dtype:
        new = cast(new, x.dtype)
    _call("copy_", [x, new])
    return x


def masked_fill_(x, mask, value):
    return inplace(x, masked_fill, mask, value)


def _common(xs):
    """Tensors promoted to one dtype (PyTorch's cat and stack promote)."""
    dtypes = {t.dtype for t in xs}
    if len(dtypes) < 2:
        return xs
    d = xs[0].dtype
    for t in xs[1:]:
        d = dispatch.promoted_dtype(d, t.dtype)
    return [t if t.dtype == d else cast(t, d) for t in xs]


def cat(tensors, dim=0):
    if fusion.on:
        tensors = list(tensors)
        r = _fusion_rules.cat(tensors, dim)
        if r is not None:
            return r
    xs = _common(list(tensors))
    out = _run1("concat", xs, [dim])
    if _needs_grad(*xs):
        sizes = [t.shape[dim] for t in xs]
        _record(out, tuple(xs), lambda g: tuple(Tensor(t) for t in _call("split", [g], [dim, sizes])), "cat")
    return out


concat = cat


def stack(tensors, dim=0):
    xs = _common(list(tensors))
    out = _run1("stack", xs, [dim])
    if _needs_grad(*xs):
        n = len(xs)
        shape = xs[0].shape

        def backward(g):
            parts = _call("split", [g], [dim, [1] * n])
            return tuple(Tensor(p).reshape(shape) for p in parts)

        _record(out, tuple(xs), backward, "stack")
    return out


def split(x, split_size, dim=0):
    if fusion.on:
        r = _fusion_rules.split(x, split_size, dim)
        if r is not None:
            return r
    n = x.shape[dim]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise ValueError(f"split size must be positive, got {split_size}")
        sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    else:
        sizes = list(split_size)
    outs = [Tensor(t) for t in _call("split", [x], [dim, sizes])]
    if _needs_grad(x):
        # The pieces' gradients meet in one hidden node (the engine adds them, which _SplitGrads turns into
        # collecting), whose backward joins them with one concat: not a zero-padded copy of x per piece plus adds.
        d = dim + x.dim() if dim < 0 else dim
        joint = _record(Tensor(x._t), (x,), lambda parts: (parts.join(x, d, sizes),), "split")
        for i, o in enumerate(outs):
            _record(o, (joint,), lambda g, i=i: (_SplitGrads(x.dtype, {i: g}),), "split")
    return tuple(outs)


class _SplitGrads:
    """Gradients of some pieces of one split, by piece index; + merges two such sets."""

    __slots__ = ("dtype", "grads")

    def __init__(self, dtype, grads):
        self.dtype, self.grads = dtype, grads

    def __add__(self, other):
        for i, g in other.grads.items():
            self.grads[i] = self.grads[i] + g if i in self.grads else g
        return self

    def to(self, dtype):
        return _SplitGrads(dtype, {i: g.to(dtype) for i, g in self.grads.items()})

    def join(self, x, dim, sizes):
        """x's gradient: the pieces' gradients along dim, zeros for pieces that got none."""
        parts = []
        for i, n in enumerate(sizes):
            g = self.grads.get(i)
            if g is None:
                shape = list(x.shape)
                shape[dim] = n
                g = zeros(*shape, dtype=self.dtype, device=x.device)
            parts.append(g.to(self.dtype) if g.dtype != self.dtype else g)
        return _run1("concat", parts, [dim]) if len(parts) > 1 else parts[0]


# ---- elementwise ----


def _unary(name, x, backward=None, saves="x"):
    """saves: which value the backward reads ("x", "out" or None)."""
    try:
        out = _run1(name, [x])
    except ValueError:
        if x.dtype in _FLOATS:
            raise
        # Integer input: neg and abs stay integer, the rest compute in float32 (PyTorch's rule).
        return _exact(name, [x]) if name in ("neg", "abs") else _run1(name, [cast(x, "float32")])
    if backward is not None and _needs_grad(x):
        saved = (x,) if saves == "x" else (out,) if saves == "out" else ()
        _record(out, (x,), lambda g: (backward(g, out),), name, saved)
    return out


def neg(x):
    if fusion.on:
        r = _fusion_rules.unary(neg, x)
        if r is not None:
            return r
    return _unary("neg", x, lambda g, out: neg(g), saves=None)


def exp(x):
    return _unary("exp", x, lambda g, out: mul(g, out.detach()), saves="out")


def log(x):
    return _unary("log", x, lambda g, out: div(g, x.detach()))


def sqrt(x):
    return _unary("sqrt", x, lambda g, out: div(g, affine(out.detach(), 2.0, 0.0)), saves="out")


def rsqrt(x):
    # d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 out^3
    return _unary("rsqrt", x, lambda g, out: mul(g, affine(pow(out.detach(), 3.0), -0.5, 0.0)), saves="out")


def abs(x):
    return _unary(
        "abs", x, lambda g, out: mul(g, sub(cast(gt(x.detach(), 0.0), g.dtype), cast(lt(x.detach(), 0.0), g.dtype)))
    )


def sin(x):
    return _unary("sin", x, lambda g, out: mul(g, cos(x.detach())))


def cos(x):
    return _unary("cos", x, lambda g, out: mul(g, neg(sin(x.detach()))))


def tanh(x):
    return _unary("tanh", x, lambda g, out: _run1("tanh_backward", [out.detach(), g]), saves="out")


def sigmoid(x):
    return _unary("sigmoid", x, lambda g, out: _run1("sigmoid_backward", [out.detach(), g]), saves="out")


def relu(x):
    return _unary("relu", x, lambda g, out: _run1("relu_backward", [x.detach(), g]))


def silu(x):
    if fusion.on:
        r = _fusion_rules.silu(x)
        if r is not None:
            return r
    return silu_eager(x)


def silu_eager(x):
    return _unary("silu", x, lambda g, out: _run1("silu_backward", [x.detach(), g]))


def gelu(x, approximate="none"):
    """x * Phi(x), Phi the standard normal CDF (PyTorch's default), or with approximate="tanh" the tanh
    approximation (GPT-2's); each one op with its own backward kernel."""
    if fusion.on and approximate == "tanh":
        r = _fusion_rules.gelu_tanh(x)
        if r is not None:
            return r
    return gelu_eager(x, approximate)


def gelu_eager(x, approximate="none"):
    if approximate == "tanh":
        return _unary("gelu_tanh", x, lambda g, out: _run1("gelu_tanh_backward", [x.detach(), g]))
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu", x, lambda g, out: _run1("gelu_backward", [x.detach(), g]))


def erf(x):
    # d/dx erf(x) = 2 / sqrt(pi) e^(-x^2)
    return _unary("erf", x, lambda g, out: mul(g, affine(exp(neg(mul(x.detach(), x.detach()))), _TWO_RSQRT_PI, 0.0)))


_TWO_RSQRT_PI = 2.0 / math.sqrt(math.pi)


def erfc(x):
    return rsub(erf(x), 1.0)


def log1p(x):
    return _unary("log1p", x, lambda g, out: div(g, affine(x.detach(), 1.0, 1.0)))


def expm1(x):
    return _unary("expm1", x, lambda g, out: mul(g, affine(out.detach(), 1.0, 1.0)), saves="out")


def _zero_grad(g, out):
    return affine(g, 0.0, 0.0)


def _rounding(name, x):
    """floor, ceil, round, trunc: integer tensors come back as they are (PyTorch's); the gradient is zero."""
    if x.dtype not in _FLOATS:
        return clone(x)
    return _unary(name, x, _zero_grad, saves=None)


def floor(x):
    return _rounding("floor", x)


def ceil(x):
    return _rounding("ceil", x)


def round(x, decimals=0):
    if decimals:
        scale = 10.0**decimals
        return div(_rounding("round", mul(x, scale)), scale)
    return _rounding("round", x)


def trunc(x):
    return _rounding("trunc", x)


def sign(x):
    if x.dtype not in _FLOATS:
        return _exact("sign", [x])
    return _unary("sign", x, _zero_grad, saves=None)


def affine(x, scale, bias):
    """x * scale + bias for Python numbers scale and bias (x floating)."""
    out = _run1("affine", [x], [float(scale), float(bias)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (affine(g, scale, 0.0),), "affine")
    return out


def pow(x, exponent):
    p = exponent
    if not isinstance(x, Tensor):
        return _pow_tensor(_as_tensor(x, p), p)
    if isinstance(p, Tensor):
        return _pow_tensor(x, p)
    if x.dtype not in _FLOATS:
        if isinstance(p, float):
            x = cast(x, "float32")
        else:
            return _exact("pow_scalar", [x], [float(p)])
    p = float(p)
    out = _run1("pow_scalar", [x], [p])
    if _needs_grad(x):
        if p == 0.0:
            _record(out, (x,), lambda g: (affine(g, 0.0, 0.0),), "pow")
        else:
            _record(out, (x,), lambda g: (mul(g, affine(pow(x.detach(), p - 1.0), p, 0.0)),), "pow", (x,))
    return out


def _pow_tensor(a, b):
    """a ** b elementwise with broadcasting: d/da = b a^(b-1), d/db = a^b log(a)."""

    def backward(g, x, y):
        out_d = _run1("pow", [x, y])
        ga = mul(g, mul(y, _run1("pow", [x, affine(y, 1.0, -1.0)])))
        gb = mul(g, mul(out_d, log(x)))
        return sum_to(ga, x.shape), sum_to(gb, y.shape)

    return _binary("pow", a, b, backward)


def fmod(a, b):
    def backward(g, x, y):
        return sum_to(g, x.shape), sum_to(neg(mul(g, trunc(div(x, y)))), y.shape)

    return _binary("fmod", a, b, backward)


def remainder(a, b):
    def backward(g, x, y):
        return sum_to(g, x.shape), sum_to(neg(mul(g, floor(div(x, y)))), y.shape)

    return _binary("remainder", a, b, backward)


def atan2(a, b):
    # d/da atan2(a, b) = b / (a^2 + b^2), d/db = -a / (a^2 + b^2)
    def backward(g, x, y):
        r = div(g, add(mul(x, x), mul(y, y)))
        return sum_to(mul(r, y), x.shape), sum_to(neg(mul(r, x)), y.shape)

    return _binary("atan2", a, b, backward)


def clamp(x, min=None, max=None):  # noqa: A002 (PyTorch's names)
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_tensor(x, min, max)
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    out = _run1("clamp", [x], [lo, hi])
    if _needs_grad(x):

        def backward(g):
            xd = x.detach()
            inside = mul(cast(ge(xd, lo), g.dtype), cast(le(xd, hi), g.dtype))
            return (mul(g, inside),)

        _record(out, (x,), backward, "clamp", (x,))
    return out


def _clamp_tensor(x, low, high):
    """clamp with tensor bounds (broadcast): maximum and minimum, whose gradients go to x where it is inside."""
    out = x
    if low is not None:
        out = maximum(out, low if isinstance(low, Tensor) else _as_tensor(float(low), x))
    if high is not None:
        out = minimum(out, high if isinstance(high, Tensor) else _as_tensor(float(high), x))
    return out


def _binary(name, a, b, backward, saves=True):
    if not isinstance(b, Tensor):
        b = _as_tensor(b, a)
    if not isinstance(a, Tensor):
        a = _as_tensor(a, b)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    try:
        out = _run1(name, [a, b])
    except ValueError:
        if a.dtype in _FLOATS:
            raise
        # Integer and bool tensors: exact in float64; true division gives float32 as in PyTorch.
        return _exact(name, [a, b], dtype="float32" if name == "div" else None)
    if _needs_grad(a, b):
        if saves:
            _record(out, (a, b), lambda g: backward(g, a.detach(), b.detach()), name, (a, b))
        else:  # backward needs the shapes only: the inputs' memory is not held for it
            sa, sb = _Shape(a.shape), _Shape(b.shape)
            _record(out, (a, b), lambda g: backward(g, sa, sb), name)
    return out


class _Shape:
    """An input as a backward that reads only its shape sees it."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = shape


def _add_backward(g, x, y):
    return sum_to(g, x.shape), sum_to(g, y.shape)


def _sub_backward(g, x, y):
    return sum_to(g, x.shape), sum_to(neg(g), y.shape)


def _mul_backward(g, x, y):
    return sum_to(mul(g, y), x.shape), sum_to(mul(g, x), y.shape)


def _scalar_fast(a, b):
    """Whether `a op scalar b` may run as one affine op: a floating tensor and a real number. Integer and bool
    tensors take _binary's promoting path instead (checked only after affine refuses, off the hot path)."""
    return a.dtype in _FLOATS and not isinstance(b, bool)


def _fused_binary(fn, a, b):
    r = _fusion_rules.binary(fn, a, b)
    if r is None and fn is add:
        r = _fusion_rules.add(a, b)
    elif r is None and fn is mul:
        r = _fusion_rules.swiglu_product(a, b)
    return r


def add(a, b):
    if fusion.on:
        r = _fused_binary(add, a, b)
        if r is not None:
            return r
    if not isinstance(b, Tensor):
        try:
            return affine(a, 1.0, b)
        except (ValueError, TypeError):
            if _scalar_fast(a, b):
                raise
    return _binary("add", a, b, _add_backward, saves=False)


def sub(a, b):
    if fusion.on:
        r = _fused_binary(sub, a, b)
        if r is not None:
            return r
    if not isinstance(b, Tensor):
        try:
            return affine(a, 1.0, -b)
        except (ValueError, TypeError):
            if _scalar_fast(a, b):
                raise
    return _binary("sub", a, b, _sub_backward, saves=False)


def rsub(a, b):
    """b - a for a tensor a and a number (or tensor) b."""
    if not isinstance(b, Tensor):
        try:
            return affine(a, -1.0, b)
        except (ValueError, TypeError):
            if _scalar_fast(a, b):
                raise
        b = _as_tensor(b, a)
    return sub(b, a)


def mul(a, b):
    if fusion.on:
        r = _fused_binary(mul, a, b)
        if r is not None:
            return r
    if not isinstance(b, Tensor):
        try:
            return affine(a, b, 0.0)
        except (ValueError, TypeError):
            if _scalar_fast(a, b):
                raise
    return _binary("mul", a, b, _mul_backward)


def rdiv(a, b):
    """b / a for a tensor a and a number (or tensor) b."""
    if not isinstance(b, Tensor):
        if a.dtype in _FLOATS:
            return mul(pow(a, -1.0), b)
        b = _as_tensor(b, a)
    return div(b, a)


def div(a, b):
    if fusion.on:
        r = _fused_binary(div, a, b)
        if r is not None:
            return r
    if not isinstance(b, Tensor):
        try:
            return affine(a, 1.0 / b, 0.0)
        except (ValueError, TypeError):
            if _scalar_fast(a, b):
                raise
        b = _as_tensor(float(b), a)  # true division: integer tensors give float32

    def backward(g, x, y):
        gx = div(g, y)
        return sum_to(gx, x.shape), sum_to(neg(mul(gx, div(x, y))), y.shape)

    return _binary("div", a, b, backward)


def maximum(input, other):
    a, b = input, other

    def backward(g, x, y):
        take = cast(ge(x, y), g.dtype)
        return sum_to(mul(g, take), x.shape), sum_to(mul(g, affine(take, -1.0, 1.0)), y.shape)

    return _binary("maximum", a, b, backward)


def minimum(input, other):
    a, b = input, other

    def backward(g, x, y):
        take = cast(le(x, y), g.dtype)
        return sum_to(mul(g, take), x.shape), sum_to(mul(g, affine(take, -1.0, 1.0)), y.shape)

    return _binary("minimum", a, b, backward)


def compare(name, a, b):
    if not isinstance(b, Tensor):
        if isinstance(b, float) and not dispatch.is_float(a.dtype):
            a = cast(a, "float64")  # an int tensor against a float scalar compares as floats
        b = _as_tensor(b, a)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    try:
        return _run1(name, [a, b])
    except ValueError:
        if a.dtype in _FLOATS:
            raise
        return _run1(name, [cast(a, "float64"), cast(b, "float64")])  # bool, uint8, int8: exact as float64


def eq(input, other):
    return compare("eq", input, other)


def ne(input, other):
    return compare("ne", input, other)


def lt(input, other):
    return compare("lt", input, other)


def le(input, other):
    return compare("le", input, other)


def gt(input, other):
    return compare("gt", input, other)


def ge(input, other):
    return compare("ge", input, other)


def where(condition, input, other):
    cond, a, b = condition, input, other
    if not isinstance(a, Tensor):
        a = _as_tensor(a, b)
    if not isinstance(b, Tensor):
        b = _as_tensor(b, a)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    if cond.dtype != "bool":
        raise ValueError(f"where: the condition must be a bool tensor, got {cond.dtype}")
    if a.dtype not in _FLOATS:
        return cast(_run1("where", [cond, cast(a, "float64"), cast(b, "float64")]), a.dtype)
    out = _run1("where", [cond, a, b])
    if _needs_grad(a, b):

        def backward(g):
            zero = _as_tensor(0.0, g)
            return None, sum_to(where(cond, g, zero), a.shape), sum_to(where(cond, zero, g), b.shape)

        _record(out, (None, a, b), backward, "where", (cond,))
    return out


def masked_fill(x, mask, value):
    if isinstance(value, Tensor):
        value = value.item()  # PyTorch takes a 0-d tensor too
    if mask.dtype != "bool":
        raise ValueError(f"masked_fill: the mask must be a bool tensor, got {mask.dtype}")
    if x.dtype not in _FLOATS:
        return cast(_run1("masked_fill", [cast(x, "float64"), mask], [float(value)]), x.dtype)
    out = _run1("masked_fill", [x, mask], [float(value)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("masked_fill", [g, mask], [0.0]),), "masked_fill", (mask,))
    return out


def tril(input, diagonal=0):
    x, k = input, diagonal
    out = _run1("tril", [x], [k])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (tril(g, k),), "tril")
    return out


def triu(input, diagonal=0):
    x, k = input, diagonal
    out = _run1("triu", [x], [k])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (triu(g, k),), "triu")
    return out


# ---- reductions ----


def _dims(x, dim):
    if dim is None:
        return []
    if isinstance(dim, int):
        return [dim]
    return [int(d) for d in dim]


def _expand_back(g, x, dims, keepdim):
    """Reshapes a reduced gradient so it broadcasts against x."""
    if not keepdim and x.ndim:
        ds = sorted(d % x.ndim for d in dims) if dims else list(range(x.ndim))
        shape = list(g.shape)
        for d in ds:
            shape.insert(d, 1)
        g = g.reshape(shape)
    return g


def sum(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = cast(x, dtype)
    dims = _dims(x, dim)
    if x.dtype not in _FLOATS:  # integer and bool sums are int64, as in PyTorch
        return _exact("sum", [x], [dims, int(keepdim)], dtype="int64")
    out = _run1("sum", [x], [dims, int(keepdim)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (expand(_expand_back(g, x, dims, keepdim), x.shape),), "sum")
    return out


def mean(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = cast(x, dtype)
    if x.dtype not in _FLOATS:
        raise ValueError(f"mean: input dtype should be a floating point dtype, got {x.dtype} (pass dtype=)")
    dims = _dims(x, dim)
    out = _run1("mean", [x], [dims, int(keepdim)])
    if _needs_grad(x):
        n = x.numel() // max(out.numel(), 1) if x.numel() else 1
        _record(
            out, (x,), lambda g: (expand(affine(_expand_back(g, x, dims, keepdim), 1.0 / n, 0.0), x.shape),), "mean"
        )
    return out


def amax(x, dim=None, keepdim=False):
    dims = _dims(x, dim)
    if x.dtype not in _FLOATS:
        return _exact("amax", [x], [dims, int(keepdim)])
    out = _run1("amax", [x], [dims, int(keepdim)])
    if _needs_grad(x):

        def backward(g):
            # Ties share the gradient equally, as in PyTorch's amax.
            o = _expand_back(out.detach(), x, dims, keepdim)
            hit = cast(eq(x.detach(), o), g.dtype)
            count = _expand_back(Tensor(_call("sum", [hit], [dims, int(keepdim)])[0]), x, dims, keepdim)
            return (mul(hit, div(_expand_back(g, x, dims, keepdim), count)),)

        _record(out, (x,), backward, "amax", (x, out))
    return out


def argmax(x, dim=None, keepdim=False):
    """Index of the first maximum along dim; with dim=None, of the flattened tensor (PyTorch's default)."""
    if x.dtype not in _FLOATS:
        x = cast(x, "float64")
    if dim is None:
        out = _run1("argmax", [x.reshape(-1)], [0, 0])
        return out.reshape([1] * x.ndim) if keepdim else out
    return _run1("argmax", [x], [dim, int(keepdim)])


def amin(x, dim=None, keepdim=False):
    return neg(amax(neg(x), dim, keepdim))


def argmin(x, dim=None, keepdim=False):
    return argmax(neg(x) if x.dtype in _FLOATS else neg(cast(x, "float64")), dim, keepdim)


def var(x, dim=None, unbiased=True, keepdim=False, correction=None):
    """Variance with Bessel's correction by default (correction=1), as PyTorch."""
    dims = _dims(x, dim)
    n = x.numel() // max(1, mean(x, dims or None, keepdim=True).numel())
    c = (1 if unbiased else 0) if correction is None else correction
    d = sub(x, mean(x, dims or None, keepdim=True))
    return affine(sum(mul(d, d), dims or None, keepdim), 1.0 / max(n - c, 0) if n > c else math.nan, 0.0)


def std(x, dim=None, unbiased=True, keepdim=False, correction=None):
    return sqrt(var(x, dim, unbiased, keepdim, correction))


# (values, indices) pairs as PyTorch's torch.return_types: a tuple with named fields.
ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def cumsum(x, dim, dtype=None):
    """Inclusive prefix sums along dim (float32 sums accumulate in float64); integer and bool tensors sum to int64,
    exactly below 2**53, as PyTorch's."""
    if dtype is not None:
        x = cast(x, dtype)
    if x.ndim == 0:
        return cumsum(x.reshape(1), dim).reshape(())
    if x.dtype not in _FLOATS:
        return cast(_run1("cumsum", [cast(x, "float64")], [dim, 0]), "int64")
    out = _run1("cumsum", [x], [dim, 0])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("cumsum", [g], [dim, 1]),), "cumsum")
    return out


def _to_last(x, dim):
    """x with dim moved last (or x itself), and the permutation that moves it back."""
    dim %= x.ndim
    if dim == x.ndim - 1:
        return x, None
    order = [d for d in range(x.ndim) if d != dim] + [dim]
    back = [0] * x.ndim
    for i, d in enumerate(order):
        back[d] = i
    return permute(x, order), back


def sort(x, dim=-1, descending=False, stable=False):
    """(values, indices) of x sorted along dim; NaN sorts as the largest value, and equal values keep their order
    whatever `stable` says (a stable sort is a valid unstable one). Differentiable in values."""
    if x.ndim == 0:
        v, i = sort(x.reshape(1), 0, descending)
        return ValuesIndices(v.reshape(()), i.reshape(()))
    work = x if x.dtype in _FLOATS else cast(x, "float64")
    moved, back = _to_last(work, dim)
    values, ids = (Tensor(t) for t in _call("sort", [moved.detach()], [int(bool(descending))]))
    if _needs_grad(x):
        src, idx, shape, n = moved, ids, moved.shape, moved.ndim

        def backward(g):
            z = zeros(shape, dtype=g.dtype, device=g.device)
            return (_run1("scatter_add", [z, idx, g], [n - 1]),)

        _record(values, (src,), backward, "sort", (ids,))
    if back is not None:
        values, ids = permute(values, back), permute(ids, back)
    if values.dtype != x.dtype:
        values = cast(values, x.dtype)
    return ValuesIndices(values, ids)


def argsort(x, dim=-1, descending=False, stable=False):
    return sort(x, dim, descending, stable).indices


def topk(x, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (or smallest) elements along dim, in descending (ascending) order;
    ties go to the lower index. Runs on the device (the router's moe_topk op), differentiable in values."""
    dim %= x.ndim
    n = x.shape[dim]
    if not 0 < k <= n:
        raise ValueError(f"topk: k must be in [1, {n}] for dim {dim} of shape {x.shape}, got {k}")
    work = x if x.dtype in _FLOATS else cast(x, "float64")
    moved = work if dim == x.ndim - 1 else transpose(work, dim, -1)
    keys = moved if largest else neg(moved)
    _, ids = _call("moe_topk", [keys.detach().reshape(-1, n)], [int(k), 0])
    ids = Tensor(ids).reshape(moved.shape[:-1] + (k,))
    values = gather(moved, moved.ndim - 1, ids)
    if dim != x.ndim - 1:
        values, ids = transpose(values, dim, -1), transpose(ids, dim, -1)
    return (values if values.dtype == x.dtype else cast(values, x.dtype)), ids


def multinomial(input, num_samples, replacement=False, generator=None):
    """Samples num_samples category ids per row of non-negative weights [C] or [N, C] (need not sum to 1), on
    the host from the generator's counter stream (seedable, the same on every device)."""
    p = input.numpy().astype(np.float64)
    rows = p.reshape(-1, p.shape[-1]) if p.ndim else None
    if rows is None or p.ndim > 2:
        raise ValueError(f"multinomial: input must be 1-d or 2-d, got shape {input.shape}")
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise ValueError("multinomial: probabilities must be finite and non-negative")
    totals = rows.sum(-1)
    if (totals <= 0).any():
        raise ValueError("multinomial: every row needs a positive total probability")
    if not replacement and num_samples > (rows > 0).sum(-1).min():
        raise ValueError("multinomial: cannot draw more samples than non-zero categories without replacement")
    rng = host_rng(generator, rows.shape[0] * max(int(num_samples), 1))
    draws = [rng.choice(rows.shape[1], num_samples, replacement, r / t) for r, t in zip(rows, totals, strict=True)]
    out = np.stack(draws)
    return from_numpy(out.reshape(p.shape[:-1] + (num_samples,)).astype(np.int64), device=input.device)


def one_hot(tensor, num_classes=-1):
    x = tensor
    ids = x.numpy().astype(np.int64)
    n = int(ids.max()) + 1 if num_classes < 0 else num_classes
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"one_hot: class ids must be in [0, {n})")
    return from_numpy(np.eye(n, dtype=np.int64)[ids], device=x.device)


# ---- linear algebra ----


def _autocast(op, *ts):
    """ts as autocast's policy (amp.POLICY) has `op` take them: cast to the 16-bit dtype for a `low` op."""
    dtype = amp.autocast_dtype()
    if dtype is None or not amp.lowers(op):
        return ts
    return tuple(cast(t, dtype) if t is not None and t.dtype == "float32" else t for t in ts)


def _autocast_fp32(op, x):
    if amp.autocast_dtype() is not None and amp.POLICY[op] == "float32" and x.dtype not in ("float32", "float64"):
        return cast(x, "float32")
    return x


def matmul(input, other, trans_a=False, trans_b=False):
    a, b = _autocast("matmul", input, other)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    out = _run1("matmul", [a, b], [int(trans_a), int(trans_b)])
    if _needs_grad(a, b):
        ad, bd = a.detach(), b.detach()

        def backward(g):
            # C = op(A) op(B): dop(A) = g op(B)^T, dop(B) = op(A)^T g.
            ga = matmul(bd, g, trans_b, True) if trans_a else matmul(g, bd, False, not trans_b)
            gb = matmul(g, ad, True, trans_a) if trans_b else matmul(ad, g, not trans_a, False)
            return sum_to(ga, a.shape), sum_to(gb, b.shape)

        _record(out, (a, b), backward, "matmul", (a, b))
    return out


def _linear_param_grads(g, xd, weight, bias):
    """(dweight, dbias) of linear for grad g and the saved input xd: one op, so a provider can take the bias
    gradient in the GEMM's epilogue."""
    want_b = bias is not None and bias.requires_grad
    gw = gb = None
    if weight.requires_grad:
        gw, gb = (Tensor(t) for t in dispatch.op("linear_weight_grad")([g._t, xd._t], [int(want_b)]))
        gb = gb if want_b else None
    elif want_b:
        gb = sum(g.reshape(-1, g.shape[-1]), 0)
    return gw, gb


def _input_grad(g, wd, x):
    """grad @ weight over the flattened rows, in x's shape (x may be 1-d)."""
    return matmul(g.reshape(-1, g.shape[-1]), wd).reshape(x.shape)


def linear(x, weight, bias=None):
    if fusion.on:
        r = _fusion_rules.linear(x, weight, bias)
        if r is not None:
            return r
    return linear_eager(x, weight, bias)


def linear_eager(x, weight, bias=None):
    if fusion.on:
        x = _fusion_rules.linear_input(x)
    x, weight, bias = _autocast("linear", x, weight, bias)
    inputs = [x, weight] if bias is None else [x, weight, bias]
    out = _run1("linear", inputs)
    if _needs_grad(x, weight, bias):
        xd, wd = x.detach(), weight.detach()

        def backward(g):
            gx = _input_grad(g, wd, x) if x.requires_grad else None
            return (gx, *_linear_param_grads(g, xd, weight, bias))

        _record(out, (x, weight, bias), backward, "linear", (x, weight))
    return out


def linear_gelu_linear(x, fc_weight, fc_bias, proj_weight, proj_bias):
    """linear(gelu(linear(x, fc_weight, fc_bias), approximate="tanh"), proj_weight, proj_bias), GPT-2's MLP, as one
    autograd node, so a provider can take the GELU into the first GEMM's epilogue (linear_gelu_tanh, which keeps the
    GELU's input) and the GELU's gradient into the GEMM that brings the gradient back through proj_weight
    (linear_dgelu_tanh). Only the GELU's input is saved: backward recomputes its output with gelu_tanh, as
    linear_gelu_tanh's kernels make it, for proj_weight's gradient."""
    x, fc_weight, fc_bias, proj_weight, proj_bias = _autocast(
        "linear_gelu_linear", x, fc_weight, fc_bias, proj_weight, proj_bias
    )
    fc_in = [x, fc_weight] if fc_bias is None else [x, fc_weight, fc_bias]
    h, pre = (Tensor(t) for t in dispatch.op("linear_gelu_tanh")([t._t for t in fc_in], []))
    out = _run1("linear", [h, proj_weight] if proj_bias is None else [h, proj_weight, proj_bias])
    del h  # backward recomputes it from pre: one elementwise pass instead of keeping [..., 4C] until backward
    if _needs_grad(x, fc_weight, fc_bias, proj_weight, proj_bias):
        xd, w1d, w2d = x.detach(), fc_weight.detach(), proj_weight.detach()

        def backward(g):
            h = _run1("gelu_tanh", [pre]) if proj_weight.requires_grad else None
            gw2, gb2 = _linear_param_grads(g, h, proj_weight, proj_bias)
            del h
            gx = gw1 = gb1 = None
            if x.requires_grad or fc_weight.requires_grad or (fc_bias is not None and fc_bias.requires_grad):
                # fc_bias's gradient from the dweight GEMM (its epilogue on cuda), not from linear_dgelu_tanh's sums.
                gpre = Tensor(dispatch.op("linear_dgelu_tanh")([g._t, w2d._t, pre._t], [0])[0])
                gw1, gb1 = _linear_param_grads(gpre, xd, fc_weight, fc_bias)
                if x.requires_grad:
                    gx = _input_grad(gpre, w1d, x)
            return gx, gw1, gb1, gw2, gb2

        _record(
            out,
            (x, fc_weight, fc_bias, proj_weight, proj_bias),
            backward,
            "linear_gelu_linear",
            (x, fc_weight, proj_weight),
        )
    return out


# ---- indexing ----


def embedding(index, weight):
    if index.dtype != "int64":
        if index.dtype in _FLOATS or index.dtype == "bool":
            raise ValueError(f"embedding: indices must be an integer tensor, got {index.dtype}")
        index = cast(index, "int64")  # int32 ids, as PyTorch takes them
    out = _run1("embedding", [weight, index])
    if _needs_grad(weight):
        v = weight.shape[0]
        _record(
            out, (None, weight), lambda g: (None, _run1("embedding_backward", [g, index], [v])), "embedding", (index,)
        )
    return out


def gather(x, dim, index):
    out = _run1("gather", [x, index], [dim])
    if _needs_grad(x):

        def backward(g):
            z = zeros(x.shape, dtype=g.dtype, device=g.device)
            return (_run1("scatter_add", [z, index, g], [dim]),)

        _record(out, (x,), backward, "gather", (index,))
    return out


def scatter_add(x, dim, index, src):
    out = _run1("scatter_add", [x, index, src], [dim])
    if _needs_grad(x, src):
        _record(out, (x, src), lambda g: (g, gather(g, dim, index)), "scatter_add", (index,))
    return out


# ---- softmax, normalisation, activations ----


def softmax(x, dim=-1, dtype=None):
    x = _autocast_fp32("softmax", x) if dtype is None else cast(x, dtype)
    out = _run1("softmax", [x], [dim])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("softmax_backward", [out.detach(), g], [dim]),), "softmax", (out,))
    return out


def log_softmax(x, dim=-1, dtype=None):
    x = _autocast_fp32("log_softmax", x) if dtype is None else cast(x, dtype)
    out = _run1("log_softmax", [x], [dim])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("log_softmax_backward", [out.detach(), g], [dim]),), "log_softmax", (out,))
    return out


def layer_norm(x, weight, bias, eps=1e-5, low_output=True):
    """low_output: under it.compile's fusion and autocast, the output may be written in the 16-bit dtype for the
    linear that reads it (amp.POLICY); False keeps it float32 (a norm several linears read)."""
    if fusion.on:
        r = _fusion_rules.norm("layernorm", x, (weight, bias), eps, low_output)
        if r is not None:
            return r
    return layer_norm_eager(x, weight, bias, eps)


def layer_norm_eager(x, weight, bias, eps=1e-5):
    if weight.dtype != x.dtype:
        weight, bias = cast(weight, x.dtype), cast(bias, x.dtype)
    out, mean_, rstd = _call("layernorm", [x, weight, bias], [float(eps)])
    out = Tensor(out)
    if _needs_grad(x, weight, bias):

        def backward(g):
            dx, dw, db = _call("layernorm_backward", [g, x, weight, Tensor(mean_), Tensor(rstd)])
            return Tensor(dx), Tensor(dw), Tensor(db)

        _record(out, (x, weight, bias), backward, "layer_norm", (x, weight))
    return out


def rms_norm(x, weight, eps=1e-5, low_output=True):
    """low_output: as layer_norm's."""
    if fusion.on:
        r = _fusion_rules.norm("rmsnorm", x, (weight,), eps, low_output)
        if r is not None:
            return r
    return rms_norm_eager(x, weight, eps)


def rms_norm_eager(x, weight, eps=1e-5):
    if weight.dtype != x.dtype:
        weight = cast(weight, x.dtype)
    out, rstd = _call("rmsnorm", [x, weight], [float(eps)])
    out = Tensor(out)
    if _needs_grad(x, weight):

        def backward(g):
            dx, dw = _call("rmsnorm_backward", [g, x, weight, Tensor(rstd)])
            return Tensor(dx), Tensor(dw)

        _record(out, (x, weight), backward, "rms_norm", (x, weight))
    return out


def _add_norm(op, x, y, params, eps, dtype):
    """add_layernorm / add_rmsnorm with autograd: (sum, out). sum = x + y at the dtype they meet at, out the norm
    of sum in dtype (None: sum's). sum's node passes its gradient to x and y; out's folds the gradient sum has
    from its other uses (the residual stream's) into the norm's backward kernel."""
    if not isinstance(y, Tensor):
        raise TypeError(f"{op}: y must be a tensor of x's shape, got {type(y).__name__}")
    if any(p is None for p in params):
        what = "weight and bias must be tensors" if len(params) == 2 else "weight must be a tensor"
        raise ValueError(f"{op}: {what}, got None")
    if y.shape != x.shape:
        s = add(x, y)  # broadcasting: the add, then the norm on its own
        norm = layer_norm if op == "add_layernorm" else rms_norm
        out = norm(s, *params, eps)
        return s, (out if dtype is None or out.dtype == dtype else cast(out, dtype))
    st = dispatch.result_dtype(x, y)
    if x.dtype != st:
        x = cast(x, st)
    out_dtype = dtype or st
    # The op writes out in the sum's dtype or, for float32 sums, a 16-bit one; anything else is cast after.
    fused_dtype = out_dtype if out_dtype == st or (st == "float32" and out_dtype in _HALF) else st
    if y.dtype not in (st, fused_dtype):
        y = cast(y, st)
    params = [p if p.dtype == st else cast(p, st) for p in params]
    outs = _call(op, [x, y, *params], [float(eps), "" if fused_dtype == st else fused_dtype])
    s, out, stats = Tensor(outs[0]), Tensor(outs[1]), [Tensor(t) for t in outs[2:]]
    if _needs_grad(x, y):
        _record(s, (x, y), lambda g: (g, g), op, ())
    if _needs_grad(x, y, *params):
        sd = s.detach()

        def backward(g, pending):
            ins = [g, sd, params[0], *stats] + ([] if pending is None else [pending])
            return tuple(Tensor(t) for t in _call(op + "_backward", ins))

        _record(out, (s, *params), backward, op, (s, params[0]), fold=0)
    if out.dtype != out_dtype:
        out = cast(out, out_dtype)
    return s, out


def add_layer_norm(x, y, weight, bias, eps=1e-5, dtype=None):
    """(x + y, layer_norm(x + y, weight, bias, eps)) as one op (add_layernorm): a pre-norm model's residual add
    and the next norm, with the norm's output in dtype (None: the sum's; autocast's dtype when its consumers cast
    to it anyway, which then costs no pass of its own)."""
    return _add_norm("add_layernorm", x, y, [weight, bias], eps, dtype)


def add_rms_norm(x, y, weight, eps=1e-5, dtype=None):
    """(x + y, rms_norm(x + y, weight, eps)) as one op (add_rmsnorm), as add_layer_norm."""
    return _add_norm("add_rmsnorm", x, y, [weight], eps, dtype)


def swiglu(gate, up):
    """silu(gate) * up."""
    if gate.dtype != up.dtype:
        gate, up = _promote(gate, up)
    out = _run1("swiglu", [gate, up])
    if _needs_grad(gate, up):

        def backward(g):
            dg, du = _call("swiglu_backward", [gate, up, g])
            return Tensor(dg), Tensor(du)

        _record(out, (gate, up), backward, "swiglu", (gate, up))
    return out


def dropout(x, p=0.5, training=True, generator=None):
    if not training or p == 0.0:
        return x
    seed, offset = (generator or _random.default_generator).advance(x.numel())
    out, mask = _call("dropout", [x], [float(p), seed, offset])
    out = Tensor(out)
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("dropout_backward", [g, Tensor(mask)], [float(p)]),), "dropout")
    return out


def rope(x, cos, sin):
    """Rotates interleaved pairs of x [B, T, H, D] by the angles whose cos/sin [T, D/2] are given."""
    out = _run1("rope", [x, cos, sin], [0])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("rope", [g, cos, sin], [1]),), "rope")
    return out


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, generator=None
):
    """PyTorch's attention: softmax(q k^T * scale + mask) v over the last two dims, q [..., Hq, T, D], k, v
    [..., Hkv, S, D] with Hq a multiple of Hkv (grouped-query heads, with or without enable_gqa). attn_mask: bool
    (True takes part) or float (added to the scores), broadcast to [..., T, S]; is_causal masks above the
    diagonal (top-left aligned when T != S). Without a mask or dropout on 4-d inputs this is the fused sdpa op;
    otherwise it is composed of matmul, softmax and dropout."""
    if fusion.on:
        r = _fusion_rules.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
        if r is not None:
            return r
    q, k, v = _autocast("sdpa", query, key, value)
    if isinstance(attn_mask, bool):
        raise TypeError(
            "scaled_dot_product_attention: attn_mask (the 4th argument, as in PyTorch) must be a tensor; "
            "for causal attention pass is_causal=True"
        )
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    causal = bool(is_causal)
    if attn_mask is None and dropout_p == 0.0 and q.ndim == 4 and (not causal or q.shape[2] == k.shape[2]):
        return _sdpa(q, k, v, causal, scale)
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"scaled_dot_product_attention: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"scaled_dot_product_attention: q, k, v need equal ranks >= 2, got {q.shape}, {k.shape}")
    if q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        hq, hkv = q.shape[-3], k.shape[-3]
        if hq % hkv:
            raise ValueError(f"scaled_dot_product_attention: {hq} query heads is not a multiple of {hkv} kv heads")
        k, v = (repeat_interleave(t, hq // hkv, q.ndim - 3) for t in (k, v))
    T, S = q.shape[-2], k.shape[-2]
    scores = affine(matmul(q, k, False, True), scale, 0.0)
    if causal:
        attn_mask = from_numpy(np.tril(np.ones((T, S), dtype=bool)), device=q.device)
    if attn_mask is not None:
        if attn_mask.dtype == "bool":
            scores = masked_fill(scores, logical_not(attn_mask), -math.inf)
        else:
            scores = add(scores, attn_mask)
    p = softmax(scores, -1)
    if dropout_p > 0.0:
        p = dropout(p, dropout_p, True, generator)
    return matmul(p if p.dtype == v.dtype else cast(p, v.dtype), v)


def attention_bthd(query, key, value, is_causal=False, scale=None):
    """Fused attention in the layout the projections produce: q [B, T, Hq, D], k, v [B, S, Hkv, D] -> out
    [B, T, Hq, D], Hq a multiple of Hkv; causal needs T == S. The result of transposing q, k, v to [B, H, T, D],
    calling scaled_dot_product_attention and transposing back, without those copies (not a PyTorch name)."""
    q, k, v = _autocast("sdpa_bthd", query, key, value)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _sdpa(q, k, v, bool(is_causal), scale, "sdpa_bthd")


def _sdpa(q, k, v, causal, scale, op="sdpa"):
    out, lse = _call(op, [q, k, v], [int(causal), scale])
    out = Tensor(out)
    if _needs_grad(q, k, v):

        def backward(g):
            dq, dk, dv = _call(op + "_backward", [g, q, k, v, out, Tensor(lse)], [int(causal), scale])
            return Tensor(dq), Tensor(dk), Tensor(dv)

        _record(out, (q, k, v), backward, op, (q, k, v, out))
    return out


def repeat_interleave(x, repeats, dim):
    """Each slice of x along dim repeated `repeats` times in place (an int repeats)."""
    dim %= x.ndim
    shape = x.shape
    y = x.reshape(shape[: dim + 1] + (1,) + shape[dim + 1 :])
    y = expand(y, shape[: dim + 1] + (repeats,) + shape[dim + 1 :])
    return y.reshape(shape[:dim] + (shape[dim] * repeats,) + shape[dim + 1 :])


def logical_not(x):
    if x.dtype == "bool":
        return _run1("eq", [cast(x, "float32"), tensor(0.0, device=x.device)])
    return eq(x, 0)


def _target_ids(target, what):
    if target.dtype == "int64":
        return target
    if target.dtype in _FLOATS or target.dtype == "bool":
        raise NotImplementedError(f"{what}: targets must be class indices (an integer tensor), got {target.dtype}")
    return cast(target, "int64")


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's cross_entropy on logits [N, C] (or [C], or [N, C, d1, ...] with the classes in dim 1) and
    integer class targets: reduction 'mean' (over targets != ignore_index; NaN when there are none), 'sum' or
    'none'; label_smoothing mixes in the uniform distribution. The mean without smoothing is one fused op."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    target = _target_ids(target, "cross_entropy")
    logits, out_shape = input, target.shape
    if logits.ndim == 1:
        logits, target = logits.reshape(1, -1), target.reshape(1)
    elif logits.ndim > 2:  # [N, C, d...] -> [N * d..., C]
        dims = [0] + list(range(2, logits.ndim)) + [1]
        logits = permute(logits, dims).reshape(-1, logits.shape[1])
        target = target.reshape(-1)
    if logits.shape[0] != target.shape[0]:
        raise ValueError(f"cross_entropy: {input.shape} logits do not match {out_shape} targets")
    if reduction != "none" and label_smoothing == 0.0 and weight is None:
        loss = _cross_entropy_mean(logits, target, ignore_index)
        valid = cast(ne(target, ignore_index), "float32")
        count = sum(valid)
        if reduction == "sum":
            return mul(loss, count if count.dtype == loss.dtype else cast(count, loss.dtype))
        # The fused op gives 0 when every target is ignored; PyTorch's mean over nothing is NaN: + 0 * (1 / count).
        nan_if_empty = affine(pow(count, -1.0), 0.0, 0.0)
        return add(loss, nan_if_empty if nan_if_empty.dtype == loss.dtype else cast(nan_if_empty, loss.dtype))
    keep = ne(target, ignore_index)
    safe = where(keep, target, 0)
    lp = log_softmax(logits if logits.dtype in ("float32", "float64") else cast(logits, "float32"), -1)
    rows = neg(gather(lp, 1, safe.reshape(-1, 1)).reshape(-1))
    w_rows = None
    if weight is not None:  # each row weighted by its target's class weight (PyTorch's; the mean divides by their sum)
        wf = cast(weight, lp.dtype) if weight.dtype != lp.dtype else weight
        w_rows = embedding(safe, wf.reshape(-1, 1)).reshape(-1)
        rows = mul(rows, w_rows)
    if label_smoothing > 0.0:
        spread = mean(lp, -1) if weight is None else affine(sum(mul(lp, wf), -1), 1.0 / lp.shape[-1], 0.0)
        rows = add(affine(rows, 1.0 - label_smoothing, 0.0), affine(spread, -label_smoothing, 0.0))
    rows = masked_fill(rows, logical_not(keep), 0.0)
    if reduction == "none":
        return rows.reshape(out_shape)
    total = sum(rows)
    if reduction == "sum":
        return total
    denom = cast(keep, total.dtype) if w_rows is None else masked_fill(w_rows, logical_not(keep), 0.0)
    return div(total, sum(denom))


def _cross_entropy_mean(logits, target, ignore_index):
    # No cast under autocast: the kernels compute in float32 from 16-bit logits (exact widening), and a float32
    # copy of [N, vocab] logits would cost more than the loss itself.
    loss, lse = _call("cross_entropy", [logits, target], [ignore_index])
    loss = Tensor(loss)
    if _needs_grad(logits):
        lse = Tensor(lse)
        _record(
            loss,
            (logits, None),
            lambda g: (_run1("cross_entropy_backward", [logits, target, lse, g], [ignore_index]), None),
            "cross_entropy",
            (logits, target),
        )
    return loss


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """Negative log-likelihood of log-probabilities [N, C] at integer targets [N], each row weighted by its target's
    class weight when `weight` is given (the mean then divides by the weights' sum)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    target = _target_ids(target, "nll_loss")
    keep = ne(target, ignore_index)
    safe = where(keep, target, 0)
    rows = neg(gather(input, 1, safe.reshape(-1, 1)).reshape(-1))
    denom = cast(keep, rows.dtype)
    if weight is not None:
        w_rows = embedding(safe, (weight if weight.dtype == rows.dtype else cast(weight, rows.dtype)).reshape(-1, 1))
        rows = mul(rows, w_rows.reshape(-1))
        denom = mul(denom, w_rows.reshape(-1))
    rows = masked_fill(rows, logical_not(keep), 0.0)
    if reduction == "none":
        return rows
    total = sum(rows)
    return total if reduction == "sum" else div(total, sum(denom))


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    d = sub(input, target)
    sq = mul(d, d)
    if reduction == "none":
        return sq
    if reduction == "sum":
        return sum(sq)
    if reduction == "mean":
        return mean(sq)
    raise ValueError(f"mse_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


# ---- mixture of experts ----


def _stat_dtype(dtype):
    return "float64" if dtype == "float64" else "float32"


def moe_topk(logits, k, normalize=True):
    """Router top-k of logits [N, E]: (weights [N, k] float32, experts [N, k] int64), experts in descending
    logit order; weights are softmax probabilities, renormalised over the chosen k when `normalize`."""
    k, normalize = int(k), int(bool(normalize))
    w, experts = _call("moe_topk", [logits], [k, normalize])
    w, experts = Tensor(w), Tensor(experts)
    if _needs_grad(logits):

        def backward(g):
            if g.dtype != w.dtype:
                g = cast(g, w.dtype)
            return (_run1("moe_topk_backward", [logits, experts, g], [normalize]),)

        _record(w, (logits,), backward, "moe_topk", (logits,))
    return w, experts


def moe_permute(x, experts, num_experts):
    """Dropless dispatch of the rows of x [N, C] to experts [N, k]: (rows [N*k, C] grouped by expert,
    source [N*k] int64 slot n*k+j of each row, counts [num_experts] int64)."""
    out, source, counts = _call("moe_permute", [x, experts], [int(num_experts)])
    out, source, counts = Tensor(out), Tensor(source), Tensor(counts)
    if _needs_grad(x):
        shape = experts.shape

        def backward(g):
            ones = zeros(shape, dtype=_stat_dtype(g.dtype), device=g.device).fill_(1.0)
            return (_run1("moe_unpermute", [g, source, ones]),)

        _record(out, (x,), backward, "moe_permute")
    return out, source, counts


def moe_unpermute(y, source, weights):
    """Combine of expert outputs y [N*k, C] (moe_permute's order) into [N, C], each row weighted by weights [N, k]."""
    want = _stat_dtype(y.dtype)
    if weights.dtype != want:
        weights = cast(weights, want)
    out = _run1("moe_unpermute", [y, source, weights])
    if _needs_grad(y, weights):

        def backward(g):
            if g.dtype != y.dtype:
                g = cast(g, y.dtype)
            dy, dw = _call("moe_unpermute_backward", [g, y, source, weights])
            return Tensor(dy), None, Tensor(dw)

        _record(out, (y, None, weights), backward, "moe_unpermute", (y, weights))
    return out
