"""Differentiable ops: each runs its op through the dispatcher and, when a
gradient is needed, records how to map the output gradient back to inputs.
Fused ops (silu, rms_norm, attention, ...) are called like any other: the
dispatcher runs the device's kernel or the op's composite.

This is the per-op hot path: it does one dispatcher call, one Tensor
construction and, only when recording, one closure.
"""

import builtins
import math

from infinitrain import amp, dispatch
from infinitrain import random as _random
from infinitrain.dispatch import needs_grad as _needs_grad
from infinitrain.dispatch import record as _record
from infinitrain.tensor import Tensor, tensor, zeros

_call = dispatch.call


def _run1(name, inputs, attrs=()):
    return Tensor(dispatch.op(name)([t._t for t in inputs], list(attrs))[0])


def _as_tensor(x, like):
    if isinstance(x, Tensor):
        return x
    return tensor(x, dtype=like.dtype, device=like.device)


def _promote(a, b):
    """Mixed float dtypes meet at the wider one (autocast produces such pairs)."""
    if a.dtype == b.dtype:
        return a, b
    d = dispatch.promoted_dtype(a.dtype, b.dtype)
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


def getitem(x, index):
    """Basic indexing: ints, slices (step > 0), None and Ellipsis."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        fill = x.ndim - (len(index) - 1 - builtins.sum(1 for i in index if i is None))
        index = index[:k] + (builtins.slice(None),) * fill + index[k + 1 :]
    out, dim, new_shape = x, 0, []
    for i in index:
        if i is None:
            new_shape.append(1)
            continue
        if dim >= x.ndim:
            raise IndexError(f"too many indices for a {x.ndim}-d tensor")
        n = x.shape[dim]
        if isinstance(i, bool):
            raise TypeError("boolean indices are not supported: use masked_fill or where")
        if hasattr(i, "__index__") and not isinstance(i, builtins.slice):
            i = i.__index__()  # NumPy integers
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of range for dimension {dim} of size {n}")
            i %= n
            out = slice(out, dim, i, i + 1, 1)
        elif isinstance(i, builtins.slice):
            start, stop, step = i.indices(n)
            if step <= 0:
                raise ValueError("negative slice steps are not supported")
            if (start, stop, step) != (0, n, 1):
                out = slice(out, dim, start, stop, step)
            new_shape.append(out.shape[dim])
        else:
            raise TypeError(f"unsupported index {i!r}: use ints, slices, None or ...")
        dim += 1
    new_shape += list(out.shape[dim:])
    return out.reshape(new_shape) if tuple(new_shape) != out.shape else out


def cat(xs, dim=0):
    xs = list(xs)
    out = _run1("concat", xs, [dim])
    if _needs_grad(*xs):
        sizes = [t.shape[dim] for t in xs]
        _record(out, tuple(xs), lambda g: tuple(Tensor(t) for t in _call("split", [g], [dim, sizes])), "cat")
    return out


concat = cat


def stack(xs, dim=0):
    xs = list(xs)
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
    n = x.shape[dim]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise ValueError(f"split size must be positive, got {split_size}")
        sizes = [split_size] * (n // split_size) + ([n % split_size] if n % split_size else [])
    else:
        sizes = list(split_size)
    outs = [Tensor(t) for t in _call("split", [x], [dim, sizes])]
    if _needs_grad(x):
        start, shape = 0, list(x.shape)
        for o, s in zip(outs, sizes, strict=True):
            b, e = start, start + s
            _record(o, (x,), lambda g, b=b, e=e: (_run1("slice_backward", [g], [shape, dim, b, e, 1]),), "split")
            start = e
    return tuple(outs)


# ---- elementwise ----


def _unary(name, x, backward=None, saves="x"):
    """saves: which value the backward reads ("x", "out" or None)."""
    out = _run1(name, [x])
    if backward is not None and _needs_grad(x):
        saved = (x,) if saves == "x" else (out,) if saves == "out" else ()
        _record(out, (x,), lambda g: (backward(g, out),), name, saved)
    return out


def neg(x):
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
    return _unary("silu", x, lambda g, out: _run1("silu_backward", [x.detach(), g]))


def gelu(x, approximate="tanh"):
    if approximate != "tanh":
        raise ValueError(f"gelu: only approximate='tanh' is implemented, got {approximate!r}")
    return _unary("gelu_tanh", x, lambda g, out: _run1("gelu_tanh_backward", [x.detach(), g]))


def affine(x, scale, bias):
    """x * scale + bias for Python numbers scale and bias."""
    out = _run1("affine", [x], [float(scale), float(bias)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (affine(g, scale, 0.0),), "affine")
    return out


def pow(x, p):
    if isinstance(p, Tensor):
        raise TypeError("pow: tensor exponents are not supported, pass a Python number")
    p = float(p)
    out = _run1("pow_scalar", [x], [p])
    if _needs_grad(x):
        if p == 0.0:
            _record(out, (x,), lambda g: (affine(g, 0.0, 0.0),), "pow")
        else:
            _record(out, (x,), lambda g: (mul(g, affine(pow(x.detach(), p - 1.0), p, 0.0)),), "pow", (x,))
    return out


def clamp(x, low=None, high=None):
    lo = -math.inf if low is None else float(low)
    hi = math.inf if high is None else float(high)
    out = _run1("clamp", [x], [lo, hi])
    if _needs_grad(x):

        def backward(g):
            xd = x.detach()
            inside = mul(cast(ge(xd, lo), g.dtype), cast(le(xd, hi), g.dtype))
            return (mul(g, inside),)

        _record(out, (x,), backward, "clamp", (x,))
    return out


def _binary(name, a, b, backward, saves=True):
    if not isinstance(b, Tensor):
        b = _as_tensor(b, a)
    if not isinstance(a, Tensor):
        a = _as_tensor(a, b)
    if a.dtype != b.dtype:
        a, b = _promote(a, b)
    out = _run1(name, [a, b])
    if _needs_grad(a, b):
        _record(out, (a, b), lambda g: backward(g, a.detach(), b.detach()), name, (a, b) if saves else ())
    return out


def add(a, b):
    if not isinstance(b, Tensor):
        return affine(a, 1.0, b)
    return _binary("add", a, b, lambda g, x, y: (sum_to(g, x.shape), sum_to(g, y.shape)), saves=False)


def sub(a, b):
    if not isinstance(b, Tensor):
        return affine(a, 1.0, -b)
    return _binary("sub", a, b, lambda g, x, y: (sum_to(g, x.shape), sum_to(neg(g), y.shape)), saves=False)


def mul(a, b):
    if not isinstance(b, Tensor):
        return affine(a, b, 0.0)
    return _binary("mul", a, b, lambda g, x, y: (sum_to(mul(g, y), x.shape), sum_to(mul(g, x), y.shape)))


def div(a, b):
    if not isinstance(b, Tensor):
        return affine(a, 1.0 / b, 0.0)

    def backward(g, x, y):
        gx = div(g, y)
        return sum_to(gx, x.shape), sum_to(neg(mul(gx, div(x, y))), y.shape)

    return _binary("div", a, b, backward)


def maximum(a, b):
    def backward(g, x, y):
        take = cast(ge(x, y), g.dtype)
        return sum_to(mul(g, take), x.shape), sum_to(mul(g, affine(take, -1.0, 1.0)), y.shape)

    return _binary("maximum", a, b, backward)


def minimum(a, b):
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
    return _run1(name, [a, b])


def eq(a, b):
    return compare("eq", a, b)


def ne(a, b):
    return compare("ne", a, b)


def lt(a, b):
    return compare("lt", a, b)


def le(a, b):
    return compare("le", a, b)


def gt(a, b):
    return compare("gt", a, b)


def ge(a, b):
    return compare("ge", a, b)


def where(cond, a, b):
    if not isinstance(a, Tensor):
        a = _as_tensor(a, b)
    if not isinstance(b, Tensor):
        b = _as_tensor(b, a)
    out = _run1("where", [cond, a, b])
    if _needs_grad(a, b):

        def backward(g):
            zero = _as_tensor(0.0, g)
            return None, sum_to(where(cond, g, zero), a.shape), sum_to(where(cond, zero, g), b.shape)

        _record(out, (None, a, b), backward, "where", (cond,))
    return out


def masked_fill(x, mask, value):
    out = _run1("masked_fill", [x, mask], [float(value)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("masked_fill", [g, mask], [0.0]),), "masked_fill", (mask,))
    return out


def tril(x, k=0):
    out = _run1("tril", [x], [k])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (tril(g, k),), "tril")
    return out


def triu(x, k=0):
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


def sum(x, dim=None, keepdim=False):
    dims = _dims(x, dim)
    out = _run1("sum", [x], [dims, int(keepdim)])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (expand(_expand_back(g, x, dims, keepdim), x.shape),), "sum")
    return out


def mean(x, dim=None, keepdim=False):
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


def argmax(x, dim=-1, keepdim=False):
    return _run1("argmax", [x], [dim, int(keepdim)])


# ---- linear algebra ----


def _autocast(*ts):
    dtype = amp.autocast_dtype()
    if dtype is None:
        return ts
    return tuple(cast(t, dtype) if t is not None and t.dtype == "float32" else t for t in ts)


def _autocast_fp32(x):
    if amp.autocast_dtype() is not None and x.dtype != "float32" and x.dtype != "float64":
        return cast(x, "float32")
    return x


def matmul(a, b, trans_a=False, trans_b=False):
    a, b = _autocast(a, b)
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


def linear(x, weight, bias=None):
    x, weight, bias = _autocast(x, weight, bias)
    inputs = [x, weight] if bias is None else [x, weight, bias]
    out = _run1("linear", inputs)
    if _needs_grad(x, weight, bias):
        xd, wd = x.detach(), weight.detach()

        def backward(g):
            gx = matmul(g, wd) if x.requires_grad else None
            g2, x2 = g.reshape(-1, g.shape[-1]), xd.reshape(-1, xd.shape[-1])
            gw = matmul(g2, x2, True, False) if weight.requires_grad else None
            gb = sum(g2, 0) if bias is not None and bias.requires_grad else None
            return gx, gw, gb

        _record(out, (x, weight, bias), backward, "linear", (x, weight))
    return out


# ---- indexing ----


def embedding(index, weight):
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


def softmax(x, dim=-1):
    x = _autocast_fp32(x)
    out = _run1("softmax", [x], [dim])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("softmax_backward", [out.detach(), g], [dim]),), "softmax", (out,))
    return out


def log_softmax(x, dim=-1):
    x = _autocast_fp32(x)
    out = _run1("log_softmax", [x], [dim])
    if _needs_grad(x):
        _record(out, (x,), lambda g: (_run1("log_softmax_backward", [out.detach(), g], [dim]),), "log_softmax", (out,))
    return out


def layer_norm(x, weight, bias, eps=1e-5):
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


def rms_norm(x, weight, eps=1e-5):
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


def scaled_dot_product_attention(q, k, v, is_causal=True, scale=None):
    """q [B, Hq, T, D], k, v [B, Hkv, S, D] with Hq a multiple of Hkv (grouped-query heads)."""
    q, k, v = _autocast(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, lse = _call("sdpa", [q, k, v], [int(is_causal), scale])
    out = Tensor(out)
    if _needs_grad(q, k, v):

        def backward(g):
            dq, dk, dv = _call("sdpa_backward", [g, q, k, v, out, Tensor(lse)], [int(is_causal), scale])
            return Tensor(dq), Tensor(dk), Tensor(dv)

        _record(out, (q, k, v), backward, "sdpa", (q, k, v, out))
    return out


def cross_entropy(logits, target, ignore_index=-100):
    """Mean cross-entropy of logits [N, V] (or [..., V]) against int64 targets [N] (or [...])."""
    # No cast under autocast: the kernels compute in float32 from 16-bit logits (exact widening), and a float32
    # copy of [N, vocab] logits would cost more than the loss itself.
    if logits.ndim != 2:
        logits = logits.reshape(-1, logits.shape[-1])
        target = target.reshape(-1)
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
