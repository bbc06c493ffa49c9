"""Conformance specs: for every op in the op table, an input generator and a float64 NumPy reference.

``make(gen, dtype)`` returns ``(inputs, attrs)``: inputs are ``(array, dtype)`` pairs in the op's input
order, float arrays as float64 at any precision (the report rounds each to its dtype, and both the kernel
and the reference see the rounded values). ``ref(xs, attrs, dtype)`` gets those rounded arrays and returns
one expected value per output, or, for in-place ops, per written input in input order (every tensor of a
written variadic input).
A float ndarray is expected in the case dtype; bool and integer arrays must match exactly; an
``(array, dtype)`` pair names another dtype (float32 statistics, cast targets).
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from infinitrain import _C

FLOATS = ("float32", "bfloat16", "float16", "float64")
SHAPE = (2, 3, 17)


class Spec(NamedTuple):
    make: Callable
    ref: Callable
    extra: tuple = ()  # non-float dtypes worth a case, when the table accepts them
    # 16-bit outputs may also err by this fraction of the largest reference value (see ATTENTION_16).
    rel16: dict = {}


# Fused attention kernels (cuDNN's, flash attention) round the softmax probabilities to the inputs' 16-bit
# dtype before multiplying by V, so a 16-bit output may err by about half an ulp of that dtype times the
# largest |value| (2^-8 for bfloat16, 2^-11 for float16); twice that is allowed.
ATTENTION_16 = {"bfloat16": 2.0**-7, "float16": 2.0**-10}

# linear_gelu_tanh and linear_dgelu_tanh built from other ops' kernels (CPU, portable GPU) round pre (or the product)
# to the 16-bit dtype before the GELU (or its gradient): one more rounding of a value up to the largest |value|,
# times |gelu_tanh'| <= 1.13, and dbias sums such rounded values; twice half an ulp is allowed.
GELU_GEMM_16 = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def stat(dtype):
    """Saved statistics (lse, mean, rstd, optimizer moments) are float32, float64 for float64 inputs."""
    return "float64" if dtype == "float64" else "float32"


# float8 formats: (mantissa bits, exponent bias, largest finite value).
FLOAT8 = {"float8_e4m3fn": (3, 7, 448.0), "float8_e5m2": (2, 15, 57344.0)}


def fp8_round(a, dtype):
    """`a` (float64) rounded to float8 `dtype` to nearest, ties to even, in float64 arithmetic: past the largest
    finite value NaN (e4m3fn) or infinity (e5m2), as a cast does."""
    mant, bias, top = FLOAT8[dtype]
    a = np.asarray(a, dtype=np.float64)
    mag = np.abs(a)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
        e = np.where(2.0**e > mag, e - 1, e)  # log2 may miss by one next to a power of two
        e = np.where(2.0 ** (e + 1) <= mag, e + 1, e)
        step = 2.0 ** (np.maximum(e, 1 - bias) - mant)  # subnormals share the smallest normal's step
        r = np.round(mag / step) * step  # np.round: halves to even
    over = np.isinf(mag) | (r > top)
    r = np.where(over, np.inf if dtype == "float8_e5m2" else np.nan, r)
    r = np.where(np.isnan(a), np.nan, r)
    return np.copysign(r, a)


def round_to(a, dtype):
    """`a` as the kernel sees it in `dtype`, held as float64 (or bool/int64)."""
    a = np.asarray(a)
    if dtype in FLOAT8:
        return fp8_round(a, dtype)
    if dtype == "bool":
        return a.astype(bool)
    if dtype.startswith("int") or dtype == "uint8":
        return a.astype(np.int64)
    if dtype == "bfloat16":  # the core's own float -> bfloat16 rounding (nearest even)
        return _C.from_numpy(np.array(a, dtype=np.float32, order="C"), "bfloat16", "cpu").numpy().astype(np.float64)
    return a.astype(dtype).astype(np.float64)


# ---- input helpers ----


def _randn(gen, shape=SHAPE, scale=1.0):
    return gen.standard_normal(shape) * scale


def _pos(gen, shape=SHAPE):
    return np.exp(gen.standard_normal(shape))


def _away(gen, shape=SHAPE):
    """|x| in [0.5, 2]: safe divisors."""
    return gen.uniform(0.5, 2.0, shape) * gen.choice([-1.0, 1.0], shape)


def _any(gen, dtype, shape=SHAPE):
    """Values for any dtype: random bools, small integers, or floats."""
    if dtype == "bool":
        return gen.random(shape) < 0.5
    if dtype.startswith("int"):
        return gen.integers(-100, 100, shape)
    return _randn(gen, shape, 3.0)


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # no overflow in the tails
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _silu_grad(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


_K0, _K1 = math.sqrt(2.0 / math.pi), 0.044715


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(_K0 * (x + _K1 * x**3)))


def _gelu_grad(x):
    t = np.tanh(_K0 * (x + _K1 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _K0 * (1.0 + 3.0 * _K1 * x * x)


_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _normal_cdf(x):
    return 0.5 * _erfc(-x / math.sqrt(2.0))


def _gelu_exact_grad(x):
    return _normal_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _remainder(a, b):
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _binary_with(fn, first, second):
    """A broadcasting binary op whose operands come from first(gen, shape) and second(gen, shape)."""

    def make(gen, d):
        return [(first(gen, SHAPE), d), (second(gen, (3, 1)), d)], []

    return Spec(make, lambda xs, at, d: [fn(xs[0], xs[1])])


def _cumsum_ref(x, dim, reverse):
    if reverse:
        return np.flip(np.cumsum(np.flip(x, dim), dim), dim)
    return np.cumsum(x, dim)


def _sort_ref(x, descending):
    """(values, int64 positions): a stable sort of the last dim (NaN largest), descending by reversing the keys."""
    keys = -x if descending else x
    order = np.argsort(keys, axis=-1, kind="stable")
    return np.take_along_axis(x, order, -1), (order.astype(np.int64), "int64")


def _axis(dims):
    return tuple(dims) if dims else None


def _slicer(ndim, dim, start, end, step):
    s = [slice(None)] * ndim
    s[dim] = slice(start, end, step)
    return tuple(s)


# ---- counter-based random numbers (the formula at the top of infinitrain/kernels/cpu/random.cc) ----

_G = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _u(seed, offset, n, bits53, stream=0):
    """U[0, 1) of counters offset .. offset + n - 1; uint64 array arithmetic wraps mod 2^64 like the kernel."""
    key = _mix64(np.array([(seed + (stream + 1) * int(_G)) % 2**64], dtype=np.uint64))
    b = _mix64(key + (np.uint64(offset) + np.arange(n, dtype=np.uint64)) * _G)
    return (b >> np.uint64(11)) * 2.0**-53 if bits53 else (b >> np.uint64(40)) * 2.0**-24


def _seed_offset(gen):
    return [int(gen.integers(0, 2**62)), int(gen.integers(0, 2**40))]


def _random_fill(draw):
    """An in-place generator: x starts as NaN so unwritten elements show; draw(attrs, dtype, n) is the formula."""

    def make(gen, d):
        return [(np.full(SHAPE, np.nan), d)], [0.25, 1.5] + _seed_offset(gen)

    def ref(xs, at, d):
        return [draw(at, d, xs[0].size).reshape(xs[0].shape)]

    return Spec(make, ref)


def _normal(at, d, n):
    mean, std, seed, offset = at
    a = 1.0 - _u(seed, offset, n, True, stream=1)
    t = _u(seed, offset, n, True, stream=2)
    return mean + std * (np.sqrt(-2.0 * np.log(a)) * np.cos(2.0 * np.pi * t))


def _uniform(at, d, n):
    low, high, seed, offset = at
    return low + (high - low) * _u(seed, offset, n, d == "float64")


def _dropout_ref(xs, at, d):
    p, seed, offset = at
    x = xs[0]
    mask = (_u(seed, offset, x.size, d == "float64") >= p).reshape(x.shape)
    return [x * np.where(mask, 1.0 / (1.0 - p), 0.0), mask]


# ---- families ----


def _unary(fn, domain="any"):
    def make(gen, d):
        return [(_pos(gen) if domain == "pos" else _randn(gen, scale=2.0), d)], []

    return Spec(make, lambda xs, at, d: [fn(xs[0])])


def _scalar_op(fn, attrs, domain="any"):
    def make(gen, d):
        return [(_pos(gen) if domain == "pos" else _randn(gen, scale=2.0), d)], list(attrs)

    return Spec(make, lambda xs, at, d: [fn(xs[0], *at)])


def _unary_backward(first, dfdx):
    """first(x) is the saved tensor the kernel takes (forward output or input); dfdx(first) the derivative."""

    def make(gen, d):
        x = _randn(gen, scale=2.0)
        return [(first(x), d), (_randn(gen), d)], []

    return Spec(make, lambda xs, at, d: [xs[1] * dfdx(xs[0])])


def _binary(fn):
    def make(gen, d):  # broadcasting [2, 3, 17] with [3, 1]
        return [(_randn(gen), d), (_away(gen, (3, 1)) if fn is np.divide else _randn(gen, (3, 1)), d)], []

    return Spec(make, lambda xs, at, d: [fn(xs[0], xs[1])])


def _compare(fn):
    def make(gen, d):
        if d.startswith("int"):
            return [(gen.integers(-3, 4, SHAPE), d), (gen.integers(-3, 4, (3, 1)), d)], []
        # A coarse grid: many ties, exact in every float dtype.
        return [(np.round(_randn(gen) * 2) / 2, d), (np.round(_randn(gen, (3, 1)) * 2) / 2, d)], []

    return Spec(make, lambda xs, at, d: [fn(xs[0], xs[1])], extra=("int64",))


def _reduce(fn, dims, keepdim):
    def make(gen, d):
        return [(_randn(gen), d)], [list(dims), keepdim]

    return Spec(make, lambda xs, at, d: [np.asarray(fn(xs[0], axis=_axis(at[0]), keepdims=bool(at[1])))])


def _tri(fn, k):
    return Spec(lambda gen, d: ([(_randn(gen, (2, 5, 7)), d)], [k]), lambda xs, at, d: [fn(xs[0], at[0])])


# ---- softmax, norms, attention, loss ----


def _softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _log_softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def _softmax_backward(log):
    def make(gen, d):
        x = _randn(gen, scale=2.0)
        return [((_log_softmax if log else _softmax)(x, -1), d), (_randn(gen), d)], [-1]

    def ref(xs, at, d):
        y, g = xs
        dim = at[0]
        if log:
            return [g - np.exp(y) * g.sum(axis=dim, keepdims=True)]
        return [y * (g - (g * y).sum(axis=dim, keepdims=True))]

    return Spec(make, ref)


def _layernorm(x, w, b, eps):
    mean = x.mean(-1)
    rstd = 1.0 / np.sqrt(((x - mean[..., None]) ** 2).mean(-1) + eps)
    return (x - mean[..., None]) * rstd[..., None] * w + b, mean, rstd


def _layernorm_ref(xs, at, d):
    out, mean, rstd = _layernorm(*xs, at[0])
    return [out, (mean, stat(d)), (rstd, stat(d))]


def _layernorm_backward_make(gen, d):
    x, w, g = _randn(gen, scale=2.0) + 0.5, _randn(gen, SHAPE[-1:]), _randn(gen)
    _, mean, rstd = _layernorm(x, w, 0.0, 1e-5)
    return [(g, d), (x, d), (w, d), (mean, stat(d)), (rstd, stat(d))], []


def _layernorm_backward_ref(xs, at, d):
    g, x, w, mean, rstd = xs
    xhat = (x - mean[..., None]) * rstd[..., None]
    dy = g * w
    dx = rstd[..., None] * (dy - dy.mean(-1, keepdims=True) - xhat * (dy * xhat).mean(-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return [dx, (g * xhat).sum(rows), g.sum(rows)]


def _rms_rstd(x, eps):
    return 1.0 / np.sqrt((x * x).mean(-1) + eps)


def _rmsnorm_ref(xs, at, d):
    x, w = xs
    rstd = _rms_rstd(x, at[0])
    return [x * rstd[..., None] * w, (rstd, stat(d))]


def _rmsnorm_backward_make(gen, d):
    x, w, g = _randn(gen, scale=2.0), _randn(gen, SHAPE[-1:]), _randn(gen)
    return [(g, d), (x, d), (w, d), (_rms_rstd(x, 1e-6), stat(d))], []


def _rmsnorm_backward_ref(xs, at, d):
    g, x, w, rstd = xs
    xhat = x * rstd[..., None]
    dy = g * w
    dx = rstd[..., None] * (dy - xhat * (dy * xhat).mean(-1, keepdims=True))
    return [dx, (g * xhat).sum(tuple(range(x.ndim - 1)))]


def _add_norm(rms):
    """add_layernorm / add_rmsnorm: the norm's spec on sum = x + y, rounded to the case dtype as the kernel keeps it."""
    norm_ref = _rmsnorm_ref if rms else _layernorm_ref

    def make(gen, d):
        params = [(_randn(gen, SHAPE[-1:]), d) for _ in range(1 if rms else 2)]
        return [(_randn(gen, scale=2.0) + 0.5, d), (_randn(gen), d)] + params, [1e-5, ""]

    def ref(xs, at, d):
        s = round_to(xs[0] + xs[1], d)
        return [s] + norm_ref([s, *xs[2:]], at, d)

    return Spec(make, ref)


def _add_norm_backward(rms):
    """add_layernorm_backward / add_rmsnorm_backward with a residual gradient: the norm's backward, dx + residual."""
    base_make = _rmsnorm_backward_make if rms else _layernorm_backward_make
    base_ref = _rmsnorm_backward_ref if rms else _layernorm_backward_ref

    def make(gen, d):
        ins, at = base_make(gen, d)
        return ins + [(_randn(gen), d)], at

    def ref(xs, at, d):
        out = base_ref(xs[:-1], at, d)
        return [out[0] + xs[-1], *out[1:]]

    return Spec(make, ref)


def _rope_make(gen, d):
    b, t, h, dh = 2, 5, 3, 8
    freq = 10000.0 ** (-np.arange(dh // 2) / (dh // 2)) * (1 + 0.1 * gen.random(dh // 2))
    angle = np.arange(t)[:, None] * freq
    return [(_randn(gen, (b, t, h, dh)), d), (np.cos(angle), stat(d)), (np.sin(angle), stat(d))], [0]


def _rope_ref(xs, at, d):
    x, cos, sin = xs
    c, s = cos[None, :, None, :], (-sin if at[0] else sin)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]  # pairs (x[2i], x[2i+1])
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return [out]


# Grouped-query attention: 4 query heads over 2 kv heads, causal, T == S.
_SDPA = dict(b=2, hq=4, hkv=2, t=7, dh=8)


def _sdpa_qkv(gen):
    b, hq, hkv, t, dh = (_SDPA[k] for k in ("b", "hq", "hkv", "t", "dh"))
    return _randn(gen, (b, hq, t, dh)), _randn(gen, (b, hkv, t, dh)), _randn(gen, (b, hkv, t, dh))


def _expand_kv(k, hq):
    return np.repeat(k, hq // k.shape[1], axis=1)  # query head h reads kv head h // (Hq / Hkv)


def _scores(q, k, causal, scale):
    s = q @ np.swapaxes(_expand_kv(k, q.shape[1]), -1, -2) * scale
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], dtype=bool), 1), -np.inf, s)
    return s


def _sdpa(q, k, v, causal, scale):
    s = _scores(q, k, causal, scale)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    return (e / total) @ _expand_kv(v, q.shape[1]), (m + np.log(total))[..., 0]


def _sdpa_make(gen, d):
    q, k, v = _sdpa_qkv(gen)
    return [(q, d), (k, d), (v, d)], [1, 1.0 / math.sqrt(_SDPA["dh"])]


def _sdpa_ref(xs, at, d):
    out, lse = _sdpa(*xs, *at)
    return [out, (lse, stat(d))]


def _sdpa_backward_make(gen, d):
    q, k, v = _sdpa_qkv(gen)
    attrs = [1, 1.0 / math.sqrt(_SDPA["dh"])]
    out, lse = _sdpa(q, k, v, *attrs)  # the saved forward outputs
    return [(_randn(gen, q.shape), d), (q, d), (k, d), (v, d), (out, d), (lse, stat(d))], attrs


def _sdpa_backward_ref(xs, at, d):
    g, q, k, v, out, lse = xs
    causal, scale = at
    b, hq, t, dh = q.shape
    hkv, s = k.shape[1], k.shape[2]
    kk, vv = _expand_kv(k, hq), _expand_kv(v, hq)
    p = np.exp(_scores(q, k, causal, scale) - lse[..., None])  # exp(-inf) = 0 on masked keys
    dp = g @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (g * out).sum(-1, keepdims=True))
    fold = (b, hkv, hq // hkv, s, dh)  # kv-head gradients sum over their query-head group
    dk = (np.swapaxes(ds, -1, -2) @ q * scale).reshape(fold).sum(2)
    dv = (np.swapaxes(p, -1, -2) @ g).reshape(fold).sum(2)
    return [ds @ kk * scale, dk, dv]


def _bthd(a):
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))  # [B, H, T, D] <-> [B, T, H, D]


def _sdpa_bthd_make(gen, d):
    ins, attrs = _sdpa_make(gen, d)
    return [(_bthd(a), dt) for a, dt in ins], attrs


def _sdpa_bthd_ref(xs, at, d):
    out, lse = _sdpa_ref([_bthd(a) for a in xs], at, d)
    return [_bthd(out), lse]


def _sdpa_bthd_backward_make(gen, d):
    ins, attrs = _sdpa_backward_make(gen, d)
    return [(_bthd(a), dt) for a, dt in ins[:5]] + [ins[5]], attrs


def _sdpa_bthd_backward_ref(xs, at, d):
    return [_bthd(r) for r in _sdpa_backward_ref([_bthd(a) for a in xs[:5]] + [xs[5]], at, d)]


_IGNORE = -100


def _lse(x):
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]


def _ce_logits_target(gen):
    n, v = 13, 17
    target = gen.integers(0, v, n)
    target[1:][gen.random(n - 1) < 0.25] = _IGNORE  # row 0 always counts
    return _randn(gen, (n, v), 3.0), target


def _ce_make(gen, d):
    x, target = _ce_logits_target(gen)
    return [(x, d), (target, "int64")], [_IGNORE]


def _ce_ref(xs, at, d):
    x, target = xs
    lse = _lse(x)
    rows = np.nonzero(target != at[0])[0]
    loss = (lse[rows] - x[rows, target[rows]]).sum() / len(rows)
    return [(np.asarray(loss), stat(d)), (lse, stat(d))]


def _ce_backward_make(gen, d):
    x, target = _ce_logits_target(gen)
    grad = np.asarray(gen.uniform(0.5, 2.0))
    return [(x, d), (target, "int64"), (_lse(x), stat(d)), (grad, stat(d))], [_IGNORE]


def _ce_backward_ref(xs, at, d):
    x, target, lse, grad = xs
    keep = target != at[0]
    dx = np.exp(x - lse[:, None])
    dx[np.arange(len(target)), np.where(keep, target, 0)] -= 1.0
    return [np.where(keep[:, None], dx, 0.0) * grad / keep.sum()]


# Mixture of experts: N tokens, E experts, top-k, C channels. normalize is drawn per case.
_MOE = dict(n=9, e=6, k=2, c=5)


def _moe_routes(gen, n, e, k):
    """k distinct experts per token, in random order."""
    return np.stack([gen.permutation(e)[:k] for _ in range(n)]).astype(np.int64)


def _moe_softmax_rows(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _moe_topk_make(gen, d):
    return [(_randn(gen, (_MOE["n"], _MOE["e"]), 2.0), d)], [_MOE["k"], int(gen.integers(0, 2))]


def _moe_topk_ref(xs, at, d):
    (x,), (k, normalize) = xs, at
    experts = np.argsort(-x, axis=-1, kind="stable")[:, :k]  # descending, ties to the lower expert
    chosen = np.take_along_axis(x, experts, -1)
    w = _moe_softmax_rows(chosen) if normalize else np.take_along_axis(_moe_softmax_rows(x), experts, -1)
    return [(w, stat(d)), experts]


def _moe_topk_backward_make(gen, d):
    n, e, k = _MOE["n"], _MOE["e"], _MOE["k"]
    x = _randn(gen, (n, e), 2.0)
    return [(x, d), (_moe_routes(gen, n, e, k), "int64"), (_randn(gen, (n, k)), stat(d))], [int(gen.integers(0, 2))]


def _moe_topk_backward_ref(xs, at, d):
    x, experts, g = xs
    rows = np.arange(x.shape[0])[:, None]
    dl = np.zeros_like(x)
    if at[0]:
        w = _moe_softmax_rows(np.take_along_axis(x, experts, -1))
        np.add.at(dl, (rows, experts), w * (g - (g * w).sum(-1, keepdims=True)))
        return [dl]
    p = _moe_softmax_rows(x)
    np.add.at(dl, (rows, experts), g)
    return [p * (dl - (dl * p).sum(-1, keepdims=True))]


def _moe_permute_make(gen, d):
    n, k, c = _MOE["n"], _MOE["k"], _MOE["c"]
    return [(_randn(gen, (n, c)), d), (_moe_routes(gen, n, 4, k), "int64")], [5]  # expert 4 never chosen


def _moe_permute_ref(xs, at, d):
    x, experts = xs
    flat = experts.reshape(-1)
    source = np.argsort(flat, kind="stable")
    return [x[source // experts.shape[1]], source.astype(np.int64), np.bincount(flat, minlength=at[0])]


def _moe_combine(gen, d):
    n, k, c = _MOE["n"], _MOE["k"], _MOE["c"]
    source = gen.permutation(n * k).astype(np.int64)
    return [(_randn(gen, (n * k, c)), d), (source, "int64"), (gen.uniform(0.0, 1.0, (n, k)), stat(d))]


def _moe_unpermute_ref(xs, at, d):
    y, source, w = xs
    n, k = w.shape
    pos = np.argsort(source)
    return [(y[pos].reshape(n, k, -1) * w[..., None]).sum(1)]


def _moe_unpermute_backward_ref(xs, at, d):
    g, y, source, w = xs
    k = w.shape[1]
    rows = g[source // k]
    dw = np.zeros(w.size)
    dw[source] = (rows * y).sum(-1)
    return [w.reshape(-1)[source][:, None] * rows, (dw.reshape(w.shape), stat(d))]


_ADAMW = [1e-2, 0.9, 0.999, 1e-8, 0.1, 3]  # lr, beta1, beta2, eps, weight_decay, step


def _adamw_make(gen, d):
    # Moments as after a few steps: m of either sign, v > 0.
    m, v = _randn(gen, scale=0.1), gen.uniform(0.01, 0.1, SHAPE)
    return [(_randn(gen), d), (_randn(gen, scale=0.5), d), (m, stat(d)), (v, stat(d))], list(_ADAMW)


def _adamw_ref(xs, at, d):
    p, g, m, v = xs
    lr, b1, b2, eps, wd, step = at
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p * (1 - lr * wd) - lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)
    return [p, (m, stat(d)), (v, stat(d))]


# ---- multi-tensor (foreach) ops: mixed sizes, an empty tensor, one longer than a GPU block's chunk ----

_FOREACH_SHAPES = [SHAPE, (5,), (0,), (1,), (3, 7), (20000,)]


def _foreach_sum_squares_make(gen, d):
    return [(_randn(gen, s), d) for s in _FOREACH_SHAPES], []


def _foreach_mul_make(gen, d):
    return [(np.array(gen.uniform(0.25, 2.0)), d)] + [(_randn(gen, s), d) for s in _FOREACH_SHAPES], []


def _foreach_adamw_make(gen, d):
    params, grads, ms, vs = [], [], [], []
    for s in _FOREACH_SHAPES:
        params.append((_randn(gen, s), d))
        grads.append((_randn(gen, s, 0.5), d))
        ms.append((_randn(gen, s, 0.1), stat(d)))
        vs.append((gen.uniform(0.01, 0.1, s), stat(d)))
    return params + grads + ms + vs, list(_ADAMW)


def _foreach_adamw_ref(xs, at, d):
    """Every written tensor in input order: the params, the grads (unchanged), then m and v."""
    n = len(xs) // 4
    sets = [_adamw_ref([xs[k], xs[n + k], xs[2 * n + k], xs[3 * n + k]], at, d) for k in range(n)]
    return [s[0] for s in sets] + list(xs[n : 2 * n]) + [s[1] for s in sets] + [s[2] for s in sets]


# ---- copy, cast, index, shape ----

# cast: each source dtype to a target that makes it convert (rounding, widening, truncating).
CAST_TO = {
    "float32": "bfloat16",
    "bfloat16": "float16",
    "float16": "float32",
    "float64": "float32",
    "int64": "float64",
    "bool": "int64",
    "float8_e4m3fn": "bfloat16",
    "float8_e5m2": "float32",
}
_ALL = ("int64", "bool")


def _converted(x, dst):
    if dst == "bool":
        return x != 0
    if dst.startswith("int"):
        return np.trunc(x.astype(np.float64)).astype(np.int64)
    return (round_to(x, dst), dst)


def _copy_make(gen, d):
    # float64 sources; integer-valued (zeros included) for integer and bool destinations.
    src = _randn(gen, scale=3.0) if d in FLOATS else gen.integers(-3, 4, SHAPE).astype(np.float64)
    return [(_any(gen, d), d), (src, "float64")], []


def _fill_make(gen, d):
    value = 1.0 if d == "bool" else float(gen.integers(-50, 50)) if d.startswith("int") else float(_randn(gen, ()))
    return [(_any(gen, d), d)], [value]


def _fill_ref(xs, at, d):
    x = xs[0]
    return [np.full(x.shape, at[0], dtype=x.dtype if d in _ALL else np.float64)]


def _index_make(gen, dim=1, m=5):
    x = _randn(gen)
    shape = list(SHAPE)
    shape[dim] = m
    return x, gen.integers(0, SHAPE[dim], shape)


def _gather_make(gen, d):
    x, idx = _index_make(gen)
    return [(x, d), (idx, "int64")], [1]


def _scatter_add_make(gen, d):
    x, idx = _index_make(gen)  # repeated targets accumulate
    return [(x, d), (idx, "int64"), (_randn(gen, idx.shape), d)], [1]


def _scatter_add_ref(xs, at, d):
    x, idx, src = xs
    out = x.copy()
    ix = list(np.indices(idx.shape, sparse=True))
    ix[at[0]] = idx
    np.add.at(out, tuple(ix), src)
    return [out]


def _embedding_backward_ref(xs, at, d):
    g, idx = xs
    dw = np.zeros((at[0], g.shape[-1]))
    np.add.at(dw, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
    return [dw]


_SLICE = [2, 1, -2, 3]  # dim, start, end, step


def _slice_backward_make(gen, d):
    g = _any(gen, d, np.zeros(SHAPE)[_slicer(3, *_SLICE)].shape)
    return [(g, d)], [list(SHAPE)] + _SLICE


def _slice_backward_ref(xs, at, d):
    shape, sl = at[0], _slicer(len(at[0]), *at[1:])
    dx = np.zeros(shape, dtype=xs[0].dtype)
    dx[sl] = xs[0]
    return [dx]


def _split_ref(xs, at, d):
    return np.split(xs[0], np.cumsum(at[1])[:-1], axis=at[0])


def _fp8_quantize_make(gen, d):
    """x spread over the float8 range and past it (saturation), scale a power of two or not."""
    x = _randn(gen) * gen.choice([1.0, 100.0, 1000.0])
    scale = float(gen.choice([1.0, 0.5, 3.7, 2.0**-4]))
    return [(x, d), (np.array(scale), "float32")], [str(gen.choice(list(FLOAT8)))]


def _fp8_quantize_ref(xs, at, d):
    top = FLOAT8[at[0]][2]
    scaled = round_to(round_to(xs[0], "float32") * xs[1], "float32")  # the product in float32
    return [(fp8_round(np.clip(scaled, -top, top), at[0]), at[0]), (np.array(np.max(np.abs(xs[0]))), "float32")]


def _fp8_matmul_make(gen, d):
    """a [5, 17] (stored [17, 5] when trans_a), b [9, 17] (stored [17, 9] unless trans_b), on the float8 grid of
    the case dtype (e4m3fn a with an e5m2 b for the e5m2 case), scale_invs, a bias, bfloat16 or float32 output.
    Integer values, so that the float32 accumulation is exact and only the scaling and the bias round."""
    ta, tb = int(gen.integers(2)), int(gen.integers(2))
    a = np.round(_randn(gen, (17, 5) if ta else (5, 17)) * 8)
    b = np.round(_randn(gen, (9, 17) if tb else (17, 9)) * 8)
    out = str(gen.choice(["float32", "bfloat16"]))
    scales = [(np.array(float(gen.choice([1.0, 0.25, 1 / 3]))), "float32") for _ in range(2)]
    ins = [(a, "float8_e4m3fn" if d == "float8_e5m2" else d), (b, d), *scales, (_randn(gen, (9,)), out)]
    return ins, [ta, tb, out]


def _fp8_quantize_delayed_make(gen, d):
    """x [R, C] of quarter-integers times a power of two (column sums exact in float32; past the float8 range at
    the larger powers), sizes on and off the kernels' 8- and 64-element tiles; a [3, H] history with zero rows,
    scales, a row, a margin, a float8 dtype and the three switches."""
    r, c = int(gen.choice([1, 3, 64, 67, 128])), int(gen.choice([5, 8, 16, 64, 72, 130]))
    x = np.round(_randn(gen, (r, c)) * 8) / 4 * float(gen.choice([1.0, 64.0, 512.0]))
    hist = np.abs(_randn(gen, (3, int(gen.integers(1, 20))), 4.0)) * (gen.random((3, 1)) < 0.7)
    scales = gen.choice([1.0, 0.5, 3.7, 2.0**-4, 0.3], 3)
    flags = [int(gen.integers(2)) for _ in range(3)]
    attrs = [int(gen.integers(3)), int(gen.integers(0, 3)), str(gen.choice(list(FLOAT8))), *flags]
    return [(x, d), (hist, "float32"), (scales, "float32")], attrs


def _fp8_quantize_delayed_ref(xs, at, d):
    x, hist, scale = xs[0], xs[1].copy(), xs[2].copy()
    row, margin, dtype, transpose, colsum, update = at
    s = np.float32(scale[row])
    out = _fp8_quantize_ref([x, s], [dtype], d)[0][0]
    out_t = out.T if transpose else np.zeros(0)
    sums = x.astype(np.float64).sum(axis=0) if colsum else np.zeros(0)
    if update:
        hist, scale = _fp8_amax_push_ref([hist, scale, np.max(np.abs(x))], [row, FLOAT8[dtype][2], margin], d)
    inv = np.float64(np.float32(1.0) / s)
    return [(out, dtype), (out_t, dtype), (np.array(inv), "float32"), (sums, "float32"), (hist, "float32"),
            (scale, "float32")]  # fmt: skip


def _fp8_amax_push_make(gen, d):
    """A [3, 5] history (some rows all zero: their scale must stay), scales, a fresh amax, a row, fmax, margin."""
    hist = np.abs(_randn(gen, (3, 5), 4.0)) * (gen.random((3, 1)) < 0.7)
    row = int(gen.integers(3))
    amax = np.array(0.0 if gen.random() < 0.2 else abs(float(gen.standard_normal())) * 3)
    ins = [(hist, d), (gen.uniform(1, 100, 3), d), (amax, d)]
    return ins, [row, float(gen.choice([448.0, 57344.0])), int(gen.integers(0, 3))]


def _fp8_amax_push_ref(xs, at, d):
    hist, scale, amax = xs[0].copy(), xs[1].copy(), xs[2]
    row, fmax, margin = at
    hist[row] = np.concatenate([[amax], hist[row][:-1]])
    m = hist[row].max()
    if m > 0 and np.isfinite(m):
        top = np.float32(fmax / 2.0**margin)
        scale[row] = np.float64(np.float32(top / np.float32(m)))
    return [hist, scale]


def _fp8_matmul_ref(xs, at, d):
    a = xs[0].T if at[0] else xs[0]
    b = xs[1].T if at[1] else xs[1]
    out = (a @ b) * (xs[2] * xs[3]) + xs[4]
    return [(out, at[2])]


SPECS = {
    # copy, cast, fill
    "cast": Spec(
        lambda gen, d: ([(_any(gen, d), d)], [CAST_TO[d]]),
        lambda xs, at, d: [_converted(xs[0], at[0])],
        _ALL + tuple(FLOAT8),
    ),
    "copy_": Spec(_copy_make, lambda xs, at, d: [_converted(xs[1], d)], _ALL),
    "fill_": Spec(_fill_make, _fill_ref, _ALL),
    # random
    "normal_": _random_fill(_normal),
    "uniform_": _random_fill(_uniform),
    "dropout": Spec(lambda gen, d: ([(_randn(gen), d)], [0.3] + _seed_offset(gen)), _dropout_ref),
    "dropout_backward": Spec(
        lambda gen, d: ([(_randn(gen), d), (gen.random(SHAPE) < 0.6, "bool")], [0.3]),
        lambda xs, at, d: [xs[0] * xs[1] / (1.0 - at[0])],
    ),
    # unary
    "neg": _unary(np.negative),
    "exp": _unary(np.exp),
    "log": _unary(np.log, "pos"),
    "sqrt": _unary(np.sqrt, "pos"),
    "rsqrt": _unary(lambda x: 1.0 / np.sqrt(x), "pos"),
    "abs": _unary(np.abs),
    "sin": _unary(np.sin),
    "cos": _unary(np.cos),
    "tanh": _unary(np.tanh),
    "sigmoid": _unary(_sigmoid),
    "relu": _unary(lambda x: np.maximum(x, 0.0)),
    "silu": _unary(lambda x: x * _sigmoid(x)),
    "gelu_tanh": _unary(_gelu),
    "gelu": _unary(lambda x: x * _normal_cdf(x)),
    "erf": _unary(_erf),
    "log1p": Spec(lambda gen, d: ([(gen.uniform(-0.9, 3.0, SHAPE), d)], []), lambda xs, at, d: [np.log1p(xs[0])]),
    "expm1": _unary(np.expm1),
    "floor": _unary(np.floor),
    "ceil": _unary(np.ceil),
    "round": _unary(np.round),  # halves to even, as NumPy's
    "trunc": _unary(np.trunc),
    "sign": _unary(np.sign),
    "affine": _scalar_op(lambda x, scale, bias: x * scale + bias, [0.75, -1.25]),
    "pow_scalar": _scalar_op(lambda x, e: np.power(x, e), [1.5], "pos"),
    "clamp": _scalar_op(lambda x, lo, hi: np.clip(x, lo, hi), [-0.5, 0.8]),
    # unary backward: tanh and sigmoid take the saved output, the others the input
    "tanh_backward": _unary_backward(np.tanh, lambda y: 1.0 - y * y),
    "sigmoid_backward": _unary_backward(_sigmoid, lambda y: y * (1.0 - y)),
    "relu_backward": _unary_backward(lambda x: x, lambda x: (x > 0).astype(np.float64)),
    "silu_backward": _unary_backward(lambda x: x, _silu_grad),
    "gelu_tanh_backward": _unary_backward(lambda x: x, _gelu_grad),
    "gelu_backward": _unary_backward(lambda x: x, _gelu_exact_grad),
    # binary with broadcasting, comparisons, selects
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "div": _binary(np.divide),
    "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "pow": _binary_with(np.power, _pos, _randn),
    "fmod": _binary_with(np.fmod, lambda gen, shape: _randn(gen, shape, 3.0), _away),
    "remainder": _binary_with(_remainder, lambda gen, shape: _randn(gen, shape, 3.0), _away),
    "atan2": _binary_with(np.arctan2, _randn, _randn),
    "eq": _compare(np.equal),
    "ne": _compare(np.not_equal),
    "lt": _compare(np.less),
    "le": _compare(np.less_equal),
    "gt": _compare(np.greater),
    "ge": _compare(np.greater_equal),
    "where": Spec(
        lambda gen, d: ([(gen.random((3, 1)) < 0.5, "bool"), (_randn(gen), d), (_randn(gen, (17,)), d)], []),
        lambda xs, at, d: [np.where(*xs)],
    ),
    "masked_fill": Spec(
        lambda gen, d: ([(_randn(gen), d), (gen.random((3, 1)) < 0.5, "bool")], [-2.5]),
        lambda xs, at, d: [np.where(xs[1], at[0], xs[0])],
    ),
    "axpy_": Spec(
        lambda gen, d: ([(_randn(gen), d), (_randn(gen), d)], [0.75]), lambda xs, at, d: [xs[0] + at[0] * xs[1]]
    ),
    "foreach_mul_": Spec(_foreach_mul_make, lambda xs, at, d: [x * xs[0] for x in xs[1:]]),
    # reductions
    "sum": _reduce(np.sum, [0, 2], 0),
    "mean": _reduce(np.mean, [-1], 1),
    "amax": _reduce(np.max, [], 0),
    "argmax": Spec(
        lambda gen, d: ([(_randn(gen), d)], [1, 0]), lambda xs, at, d: [np.argmax(xs[0], axis=at[0]).astype(np.int64)]
    ),
    "cumsum": Spec(
        lambda gen, d: ([(_randn(gen), d)], [int(gen.integers(-3, 3)), int(gen.integers(0, 2))]),
        lambda xs, at, d: [_cumsum_ref(xs[0], at[0], at[1])],
    ),
    "sort": Spec(
        # A coarse grid: ties, which must keep their positions' order.
        lambda gen, d: ([(np.round(_randn(gen) * 2) / 2, d)], [int(gen.integers(0, 2))]),
        lambda xs, at, d: list(_sort_ref(xs[0], at[0])),
    ),
    "sum_squares": Spec(lambda gen, d: ([(_randn(gen), d)], []), lambda xs, at, d: [(np.sum(xs[0] ** 2), stat(d))]),
    "foreach_sum_squares": Spec(
        _foreach_sum_squares_make, lambda xs, at, d: [(sum(np.sum(x**2) for x in xs), stat(d))]
    ),
    # products
    "matmul": Spec(  # batch [2] broadcast against a shared b, stored transposed
        lambda gen, d: ([(_randn(gen, (2, 5, 17)), d), (_randn(gen, (9, 17)), d)], [0, 1]),
        lambda xs, at, d: [xs[0] @ xs[1].T],
    ),
    "linear": Spec(
        lambda gen, d: ([(_randn(gen), d), (_randn(gen, (9, 17)), d), (_randn(gen, (9,)), d)], []),
        lambda xs, at, d: [xs[0] @ xs[1].T + xs[2]],
    ),
    "fp8_quantize": Spec(_fp8_quantize_make, _fp8_quantize_ref),
    "fp8_amax_push_": Spec(_fp8_amax_push_make, _fp8_amax_push_ref),
    "fp8_quantize_delayed_": Spec(_fp8_quantize_delayed_make, _fp8_quantize_delayed_ref),
    # float8 inputs: the case dtype is b's format; the output's dtype comes from the attributes.
    "fp8_matmul": Spec(_fp8_matmul_make, _fp8_matmul_ref, tuple(FLOAT8)),
    "linear_weight_grad": Spec(  # grad [2, 3, 9] and x [2, 3, 17]: six rows
        lambda gen, d: ([(_randn(gen, (2, 3, 9)), d), (_randn(gen, (2, 3, 17)), d)], [1]),
        lambda xs, at, d: [xs[0].reshape(6, 9).T @ xs[1].reshape(6, 17), xs[0].reshape(6, 9).sum(0)],
    ),
    "linear_gelu_tanh": Spec(  # x [2, 3, 17], weight [16, 17]
        lambda gen, d: ([(_randn(gen, (2, 3, 17)), d), (_randn(gen, (16, 17)), d), (_randn(gen, (16,)), d)], []),
        lambda xs, at, d: [_gelu(xs[0] @ xs[1].T + xs[2]), xs[0] @ xs[1].T + xs[2]],
        rel16=GELU_GEMM_16,
    ),
    "linear_dgelu_tanh": Spec(  # grad [2, 3, 9], weight [9, 16], pre [2, 3, 16]
        lambda gen, d: ([(_randn(gen, (2, 3, 9)), d), (_randn(gen, (9, 16)), d), (_randn(gen, (2, 3, 16)), d)], [1]),
        lambda xs, at, d: [
            (xs[0] @ xs[1]) * _gelu_grad(xs[2]),
            ((xs[0] @ xs[1]) * _gelu_grad(xs[2])).reshape(6, 16).sum(0),
        ],
        rel16=GELU_GEMM_16,
    ),
    # indexing
    "embedding": Spec(
        lambda gen, d: ([(_randn(gen, (11, 17)), d), (gen.integers(0, 11, (2, 3)), "int64")], []),
        lambda xs, at, d: [xs[0][xs[1]]],
    ),
    "embedding_backward": Spec(  # two weight rows never used: they must come out zero
        lambda gen, d: ([(_randn(gen), d), (gen.integers(0, 11, (2, 3)), "int64")], [13]), _embedding_backward_ref
    ),
    "gather": Spec(_gather_make, lambda xs, at, d: [np.take_along_axis(xs[0], xs[1], axis=at[0])]),
    "scatter_add": Spec(_scatter_add_make, _scatter_add_ref),
    # shape
    "permute": Spec(
        lambda gen, d: ([(_any(gen, d), d)], [[2, 0, 1]]), lambda xs, at, d: [np.transpose(xs[0], at[0])], _ALL
    ),
    "slice": Spec(lambda gen, d: ([(_any(gen, d), d)], list(_SLICE)), lambda xs, at, d: [xs[0][_slicer(3, *at)]], _ALL),
    "slice_backward": Spec(_slice_backward_make, _slice_backward_ref, _ALL),
    "concat": Spec(
        lambda gen, d: ([(_any(gen, d, (2, n, 5)), d) for n in (3, 1, 4)], [1]),
        lambda xs, at, d: [np.concatenate(xs, axis=at[0])],
        _ALL,
    ),
    "stack": Spec(
        lambda gen, d: ([(_any(gen, d, (3, 17)), d) for _ in range(3)], [1]),
        lambda xs, at, d: [np.stack(xs, axis=at[0])],
        _ALL,
    ),
    "split": Spec(lambda gen, d: ([(_any(gen, d, (2, 9, 5)), d)], [1, [2, 0, 7]]), _split_ref, _ALL),
    "tril": _tri(np.tril, 1),
    "triu": _tri(np.triu, -1),
    # softmax, norms
    "softmax": Spec(lambda gen, d: ([(_randn(gen, scale=3.0), d)], [-1]), lambda xs, at, d: [_softmax(xs[0], at[0])]),
    "softmax_backward": _softmax_backward(False),
    "log_softmax": Spec(
        lambda gen, d: ([(_randn(gen, scale=3.0), d)], [1]), lambda xs, at, d: [_log_softmax(xs[0], at[0])]
    ),
    "log_softmax_backward": _softmax_backward(True),
    "layernorm": Spec(
        lambda gen, d: ([(_randn(gen, scale=2.0) + 0.5, d), (_randn(gen, (17,)), d), (_randn(gen, (17,)), d)], [1e-5]),
        _layernorm_ref,
    ),
    "layernorm_backward": Spec(_layernorm_backward_make, _layernorm_backward_ref),
    "rmsnorm": Spec(lambda gen, d: ([(_randn(gen, scale=2.0), d), (_randn(gen, (17,)), d)], [1e-6]), _rmsnorm_ref),
    "rmsnorm_backward": Spec(_rmsnorm_backward_make, _rmsnorm_backward_ref),
    "add_layernorm": _add_norm(False),
    "add_layernorm_backward": _add_norm_backward(False),
    "add_rmsnorm": _add_norm(True),
    "add_rmsnorm_backward": _add_norm_backward(True),
    # fused
    "swiglu": Spec(
        lambda gen, d: ([(_randn(gen, scale=2.0), d), (_randn(gen), d)], []),
        lambda xs, at, d: [xs[0] * _sigmoid(xs[0]) * xs[1]],
    ),
    "swiglu_backward": Spec(
        lambda gen, d: ([(_randn(gen, scale=2.0), d), (_randn(gen), d), (_randn(gen), d)], []),
        lambda xs, at, d: [xs[2] * xs[1] * _silu_grad(xs[0]), xs[2] * xs[0] * _sigmoid(xs[0])],
    ),
    "rope": Spec(_rope_make, _rope_ref),
    "sdpa": Spec(_sdpa_make, _sdpa_ref, rel16=ATTENTION_16),
    "sdpa_backward": Spec(_sdpa_backward_make, _sdpa_backward_ref, rel16=ATTENTION_16),
    "sdpa_bthd": Spec(_sdpa_bthd_make, _sdpa_bthd_ref, rel16=ATTENTION_16),
    "sdpa_bthd_backward": Spec(_sdpa_bthd_backward_make, _sdpa_bthd_backward_ref, rel16=ATTENTION_16),
    "cross_entropy": Spec(_ce_make, _ce_ref),
    "cross_entropy_backward": Spec(_ce_backward_make, _ce_backward_ref),
    "adamw_": Spec(_adamw_make, _adamw_ref),
    "foreach_adamw_": Spec(_foreach_adamw_make, _foreach_adamw_ref),
    # mixture of experts
    "moe_topk": Spec(_moe_topk_make, _moe_topk_ref),
    "moe_topk_backward": Spec(_moe_topk_backward_make, _moe_topk_backward_ref),
    "moe_permute": Spec(_moe_permute_make, _moe_permute_ref),
    "moe_unpermute": Spec(lambda gen, d: (_moe_combine(gen, d), []), _moe_unpermute_ref),
    "moe_unpermute_backward": Spec(
        lambda gen, d: ([(_randn(gen, (_MOE["n"], _MOE["c"])), d)] + _moe_combine(gen, d), []),
        _moe_unpermute_backward_ref,
    ),
}
