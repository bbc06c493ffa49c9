"""Composite definitions of the fused ops in terms of required ops (foreach_adamw_'s in terms of adamw_, whose
kernel, or composite, runs on each set).

Each is registered with the dispatcher when the package loads: a device
without its own kernel for a fused op runs its composite (native tensors and
attributes in, native tensors out). Backward ops without an explicit
definition are derived by autograd of the forward composite.
"""

import math

import numpy as np

from infinitrain import amp, autograd, dispatch
from infinitrain import functional as F
from infinitrain import tensor_ops as T
from infinitrain.tensor import Tensor, from_numpy, zeros


# Like the kernels, composites compute bfloat16 in float32 and round once at the end.
def _up(t):
    return F.cast(t, "float32") if t.dtype in ("bfloat16", "float16") else t


def _down(t, dtype):
    return F.cast(t, dtype) if t.dtype != dtype else t


def silu(x):
    xf = _up(x)
    return _down(F.mul(xf, F.sigmoid(xf)), x.dtype)


def gelu_tanh(x):
    xf = _up(x)
    inner = F.affine(F.add(xf, F.affine(F.pow(xf, 3.0), 0.044715, 0.0)), math.sqrt(2.0 / math.pi), 0.0)
    return _down(F.mul(F.affine(xf, 0.5, 0.0), F.affine(F.tanh(inner), 1.0, 1.0)), x.dtype)


def gelu(x):
    """x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 from erf on the tail side (erfc(|z|) = 1 - erf(|z|) loses
    the left tail's relative accuracy only where x Phi(x) is below float32's absolute tolerance)."""
    xf = _up(x)
    return _down(F.mul(xf, F.affine(F.erf(F.affine(xf, 1.0 / math.sqrt(2.0), 0.0)), 0.5, 0.5)), x.dtype)


def rmsnorm(x, weight, eps):
    """Returns (out, rstd); rstd has x's shape without the last dim."""
    xf = _up(x)
    rstd = F.rsqrt(F.affine(F.mean(F.mul(xf, xf), -1, keepdim=True), 1.0, eps))
    out = F.mul(F.mul(xf, rstd), _up(weight))
    return _down(out, x.dtype), rstd.reshape(x.shape[:-1])


def add_layernorm(x, y, weight, bias, eps, dtype):
    """(sum, out, mean, rstd): layernorm of sum = x + y in x's dtype, out cast to dtype ('' for x's)."""
    s = F.add(x, _down(y, x.dtype))
    out, mean, rstd = _wrap(dispatch.call("layernorm", [s, weight, bias], [eps]))
    return s, _down(out, dtype or x.dtype), mean, rstd


def add_rmsnorm(x, y, weight, eps, dtype):
    """(sum, out, rstd), as add_layernorm's."""
    s = F.add(x, _down(y, x.dtype))
    out, rstd = _wrap(dispatch.call("rmsnorm", [s, weight], [eps]))
    return s, _down(out, dtype or x.dtype), rstd


def add_layernorm_backward(grad, x, weight, mean, rstd, residual=None):
    """layernorm_backward in float32 for 16-bit x (grad widened), residual added to dx before its one rounding."""
    ins = [_up(grad), _up(x), _up(weight), mean, rstd]
    dx, dw, db = _wrap(dispatch.call("layernorm_backward", ins))
    if residual is not None:
        dx = F.add(dx, _up(residual))
    return [_down(t, x.dtype) for t in (dx, dw, db)]


def add_rmsnorm_backward(grad, x, weight, rstd, residual=None):
    dx, dw = _wrap(dispatch.call("rmsnorm_backward", [_up(grad), _up(x), _up(weight), rstd]))
    if residual is not None:
        dx = F.add(dx, _up(residual))
    return [_down(dx, x.dtype), _down(dw, x.dtype)]


def swiglu(gate, up):
    g = _up(gate)
    return _down(F.mul(F.mul(g, F.sigmoid(g)), _up(up)), gate.dtype)


def rope(x, cos, sin, inverse=False):
    B, T, H, D = x.shape
    pairs = _up(x).reshape(B, T, H, D // 2, 2)
    x0, x1 = F.slice(pairs, 4, 0, 1), F.slice(pairs, 4, 1, 2)
    c = _down(cos, pairs.dtype).reshape(T, 1, D // 2, 1)
    s = _down(sin, pairs.dtype).reshape(T, 1, D // 2, 1)
    if inverse:
        s = F.neg(s)
    o0 = F.sub(F.mul(x0, c), F.mul(x1, s))
    o1 = F.add(F.mul(x0, s), F.mul(x1, c))
    return _down(F.cat([o0, o1], dim=4).reshape(B, T, H, D), x.dtype)


def _causal_mask(t, s, device):
    return from_numpy(np.triu(np.ones((t, s), dtype=bool), 1), device=device)


def sdpa(q, k, v, causal, scale):
    """Returns (out, lse) for q [B, Hq, T, D], k, v [B, Hkv, S, D]."""
    dtype = q.dtype
    q, k, v = _up(q), _up(k), _up(v)
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if causal and T != S:
        raise ValueError(f"sdpa: causal attention needs equal query and key lengths, got {T} and {S}")
    if Hq != Hkv:  # grouped-query heads: repeat each kv head for its group
        g = Hq // Hkv
        k = k.reshape(B, Hkv, 1, S, D).expand(B, Hkv, g, S, D).reshape(B, Hq, S, D)
        v = v.reshape(B, Hkv, 1, S, D).expand(B, Hkv, g, S, D).reshape(B, Hq, S, D)
    scores = F.affine(F.matmul(q, k, False, True), scale, 0.0)
    if causal:
        scores = F.masked_fill(scores, _causal_mask(T, S, q.device), -math.inf)
    m = F.amax(scores, -1, keepdim=True)
    lse = F.add(F.log(F.sum(F.exp(F.sub(scores, m)), -1, keepdim=True)), m)
    p = F.exp(F.sub(scores, lse))
    return _down(F.matmul(p, v), dtype), lse.reshape(B, Hq, T)


def _bhtd(t):
    return F.permute(t, [0, 2, 1, 3])  # [B, T, H, D] <-> [B, H, T, D]


def sdpa_bthd(q, k, v, causal, scale):
    """sdpa's composite on [B, T, H, D] tensors, between transposes."""
    out, lse = sdpa(_bhtd(q), _bhtd(k), _bhtd(v), causal, scale)
    return _bhtd(out), lse


def sdpa_bthd_backward(grad, q, k, v, out, lse, causal, scale):
    return [_bhtd(t) for t in sdpa_backward(*(_bhtd(t) for t in (grad, q, k, v, out)), lse, causal, scale)]


def sdpa_backward(grad, q, k, v, out, lse, causal, scale):
    """(dq, dk, dv) from the saved out and lse, as the kernels compute them: with P = exp(S * scale - lse),
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K * scale, dK = dS^T Q * scale;
    grouped kv heads sum the gradients of their query heads."""
    dtype = q.dtype
    g, q, k, v, out = (_up(t) for t in (grad, q, k, v, out))
    B, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if group > 1:
        k = k.reshape(B, Hkv, 1, S, D).expand(B, Hkv, group, S, D).reshape(B, Hq, S, D)
        v = v.reshape(B, Hkv, 1, S, D).expand(B, Hkv, group, S, D).reshape(B, Hq, S, D)
    scores = F.affine(F.matmul(q, k, False, True), scale, 0.0)
    p = F.exp(F.sub(scores, _down(lse, scores.dtype).reshape(B, Hq, T, 1)))
    if causal:
        p = F.masked_fill(p, _causal_mask(T, S, q.device), 0.0)
    dv = F.matmul(p, g, True, False)
    dp = F.matmul(g, v, False, True)
    ds = F.mul(p, F.sub(dp, F.sum(F.mul(g, out), -1, keepdim=True)))
    dq = F.affine(F.matmul(ds, k), scale, 0.0)
    dk = F.affine(F.matmul(ds, q, True, False), scale, 0.0)
    if group > 1:
        dk = F.sum(dk.reshape(B, Hkv, group, S, D), 2)
        dv = F.sum(dv.reshape(B, Hkv, group, S, D), 2)
    return [_down(dq, dtype), _down(dk, dtype), _down(dv, dtype)]


def cross_entropy(logits, target, ignore_index):
    """Returns (mean loss over rows whose target != ignore_index, lse [N])."""
    N, V = logits.shape
    x = _up(logits)
    stat = x.dtype
    m = F.amax(x, -1, keepdim=True)
    lse = F.add(F.log(F.sum(F.exp(F.sub(x, m)), -1, keepdim=True)), m)
    onehot = F.eq(from_numpy(np.arange(V, dtype=np.int64), device=logits.device).reshape(1, V), target.reshape(N, 1))
    picked = F.sum(F.where(onehot, x, 0.0), -1, keepdim=True)  # not x * 0: logits may be -inf
    keep = F.ne(target, from_numpy(np.array(ignore_index, np.int64), device=logits.device))
    count = F.clamp(F.sum(F.cast(keep, stat)), 1.0, None)
    # Selected, not multiplied by 0: an ignored row may be fully masked (-inf), its lse NaN.
    loss = F.div(F.sum(F.where(keep, F.sub(lse, picked).reshape(N), 0.0)), count)
    return loss, lse.reshape(N)


_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def fp8_quantize(x, scale, dtype):
    """x * scale in float32, clamped to dtype's finite range and cast (which rounds to nearest even); max |x|."""
    xf = F.cast(x, "float32") if x.dtype != "float32" else x
    top = _FLOAT8_MAX[dtype]
    out = F.cast(F.clamp(F.mul(xf, scale), -top, top), dtype)
    return out, F.amax(F.abs(xf))


def fp8_matmul(a, b, a_scale_inv, b_scale_inv, bias, trans_a, trans_b, dtype):
    """The float8 operands widened to float32, multiplied, scaled by one float32 factor, bias added, rounded once."""
    acc = F.matmul(F.cast(a, "float32"), F.cast(b, "float32"), trans_a, trans_b)
    out = F.mul(acc, F.mul(a_scale_inv, b_scale_inv))
    if bias is not None:
        out = F.add(out, _up(bias))
    return _down(out, dtype)


@autograd.no_grad()
def fp8_amax_push_(history, scale, amax, row, fmax, margin):
    """Row `row` of history shifted right with amax in front; scale[row] from the row's max where that is > 0 and
    finite (NaN anywhere in the row: unchanged)."""
    h = history.shape[1]
    rows = [history[r].reshape(1, h) for r in range(history.shape[0])]
    rows[row] = F.cat([amax.reshape(1), history[row][: h - 1]]).reshape(1, h)
    history.copy_(F.cat(rows))
    m = F.amax(rows[row]).reshape(1)
    ok = T.logical_and(F.gt(m, 0.0), T.isfinite(m))
    top = from_numpy(np.array([fmax / 2.0**margin], dtype=np.float32), device=m.device)
    fresh = F.where(ok, F.div(top, F.where(ok, m, 1.0)), scale[row].reshape(1))
    parts = [fresh if r == row else scale[r].reshape(1) for r in range(scale.shape[0])]
    scale.copy_(F.cat(parts))


def fp8_quantize_delayed_(x, history, scale, row, margin, dtype, transpose, colsum, update):
    """fp8_quantize with scale[row], the transposed codes, 1 / scale, the column sums, then fp8_amax_push_."""
    s = scale[row].reshape(())
    out, amax = fp8_quantize(x, s, dtype)
    none = zeros([0], dtype="float32", device=x.device)
    # float8 codes move through float32 (every one is exact there): permute takes no float8.
    out_t = F.cast(F.permute(F.cast(out, "float32"), [1, 0]), dtype) if transpose else F.cast(none, dtype)
    inv = F.div(from_numpy(np.array(1.0, dtype=np.float32), device=s.device), s)
    sums = F.sum(F.cast(x, "float32"), [0]) if colsum else none
    if update:
        fp8_amax_push_(history, scale, amax, row, _FLOAT8_MAX[dtype], margin)
    return [out, out_t, inv, sums]


def _fp8_amax_push(ins, attrs):
    with amp.autocast(enabled=False):
        fp8_amax_push_(*_wrap(ins), *attrs)
    return []


def linear_weight_grad(grad, x, bias):
    """(dweight, dbias) of linear as matmul and sum over the flattened rows; dbias is [0] when bias is 0."""
    rows = math.prod(grad.shape[:-1])
    g2, x2 = grad.reshape(rows, grad.shape[-1]), x.reshape(rows, x.shape[-1])
    dw = F.matmul(g2, x2, True, False)
    db = F.sum(g2, 0) if bias else zeros(0, dtype=grad.dtype, device=grad.device)
    return dw, db


def _gelu_tanh_vjp(x, grad):
    """grad * gelu_tanh'(x) by autograd of the gelu_tanh composite (as gelu_tanh_backward's composite)."""
    x = x.detach().requires_grad_()
    with autograd.enable_grad():
        gelu_tanh(x).backward(grad)
    return x.grad


def linear_gelu_tanh(x, weight, bias=None):
    """(gelu_tanh(pre), pre) with pre = linear(x, weight, bias), in float32 for 16-bit inputs (each output rounded
    once, as an epilogue rounds)."""
    pre = F.linear(_up(x), _up(weight), None if bias is None else _up(bias))
    return _down(gelu_tanh(pre), x.dtype), _down(pre, x.dtype)


def linear_dgelu_tanh(grad, weight, pre, bias):
    """(dpre, dbias): dpre = gelu_tanh'(pre) * (grad @ weight) over the flattened rows, in float32 for 16-bit
    inputs; dbias = dpre's column sums, or [0] when bias is 0."""
    rows = math.prod(grad.shape[:-1])
    prod = F.matmul(_up(grad.reshape(rows, grad.shape[-1])), _up(weight))
    dpre = _gelu_tanh_vjp(_up(pre.reshape(rows, weight.shape[1])), prod)
    db = _down(F.sum(dpre, 0), grad.dtype) if bias else zeros(0, dtype=grad.dtype, device=grad.device)
    return _down(dpre, grad.dtype).reshape(*pre.shape), db


def rmsnorm_backward(grad, x, weight, rstd):
    """(dx, dweight) from the saved rstd: with xhat = x * rstd and dxhat = grad * weight,
    dx = rstd * (dxhat - xhat * mean(dxhat * xhat)) and dweight = sum over rows of grad * xhat."""
    stat = rstd.dtype
    g, xf, w = (_down(t, stat) for t in (grad, x, weight))
    r = rstd.reshape(*rstd.shape, 1)
    xhat = F.mul(xf, r)
    dxhat = F.mul(g, w)
    dx = F.mul(r, F.sub(dxhat, F.mul(xhat, F.mean(F.mul(dxhat, xhat), -1, keepdim=True))))
    dw = F.sum(F.mul(g, xhat).reshape(-1, x.shape[-1]), 0)
    return [_down(dx, x.dtype), _down(dw, x.dtype)]


def cross_entropy_backward(logits, target, lse, grad, ignore_index):
    """grad * (softmax(logits) - onehot(target)) / count on rows whose target is not ignored, from the saved lse."""
    N, V = logits.shape
    x = _up(logits)
    onehot = F.eq(from_numpy(np.arange(V, dtype=np.int64), device=logits.device).reshape(1, V), target.reshape(N, 1))
    valid = F.cast(F.ne(target, from_numpy(np.array(ignore_index, np.int64), device=logits.device)), x.dtype)
    count = F.clamp(F.sum(valid), 1.0, None)
    p = F.exp(F.sub(x, _down(lse, x.dtype).reshape(N, 1)))
    d = F.sub(p, F.cast(onehot, x.dtype))
    scale = F.div(_down(grad, x.dtype), count)
    # Ignored rows are selected out, not multiplied by 0: a fully masked one has NaN probabilities.
    keep = F.ne(target, from_numpy(np.array(ignore_index, np.int64), device=logits.device)).reshape(N, 1)
    return [_down(F.where(keep, F.mul(d, scale), 0.0), logits.dtype)]


def moe_topk(logits, k, normalize):
    """(weights, experts): k rounds of argmax (the first maximum, so ties go to the lower expert), each
    masking its pick; weights from the chosen logits (a softmax over them) or over the whole row."""
    x = _up(logits)
    N, E = x.shape
    cols = from_numpy(np.arange(E, dtype=np.int64), device=x.device).reshape(1, E)
    masked, picks = x, []
    for _ in range(k):
        idx = F.argmax(masked, -1, keepdim=True)
        picks.append(idx)
        masked = F.masked_fill(masked, F.eq(cols, idx), -math.inf)
    experts = F.cat(picks, 1)
    chosen = F.gather(x, 1, experts)
    if normalize:
        return F.softmax(chosen, -1), experts
    m = F.amax(x, -1, keepdim=True)
    lse = F.add(F.log(F.sum(F.exp(F.sub(x, m)), -1, keepdim=True)), m)
    return F.exp(F.sub(chosen, lse)), experts


def moe_topk_backward(logits, experts, grad, normalize):
    """dlogits: through a softmax over the chosen logits (normalize) or over the whole row."""
    x = _up(logits)
    g = _down(grad, x.dtype)
    zero = zeros(x.shape, dtype=x.dtype, device=x.device)
    if normalize:
        w = F.softmax(F.gather(x, 1, experts), -1)
        dchosen = F.mul(w, F.sub(g, F.sum(F.mul(g, w), -1, keepdim=True)))
        return [_down(F.scatter_add(zero, 1, experts, dchosen), logits.dtype)]
    p = F.softmax(x, -1)
    dp = F.scatter_add(zero, 1, experts, g)
    return [_down(F.mul(p, F.sub(dp, F.sum(F.mul(dp, p), -1, keepdim=True))), logits.dtype)]


def moe_permute(x, experts, num_experts):
    """(rows, source, counts). The order is a stable sort of the slots by expert, computed on the host from a
    copy of experts (a small int64 array); the rows themselves move on the device (an embedding lookup)."""
    N, k = experts.shape
    e = experts.numpy().reshape(-1)
    bad = (e < 0) | (e >= num_experts)
    if bad.any():
        s = int(np.argmax(bad))
        raise IndexError(f"moe_permute: expert {e[s]} at slot {s} out of range (expected 0 <= expert < {num_experts})")
    source = np.argsort(e, kind="stable").astype(np.int64)
    counts = np.bincount(e, minlength=num_experts).astype(np.int64)
    rows = F.embedding(from_numpy(source // k, device=x.device), x)
    return rows, from_numpy(source, device=x.device), from_numpy(counts, device=x.device)


def _check_permutation(op, src):
    """Raises at the first row whose entry is out of [0, n) or repeats an earlier one."""
    n = src.shape[0]
    rows = np.arange(n)
    ok = (src >= 0) & (src < n)
    first = np.full(n, n)
    np.minimum.at(first, src[ok], rows[ok])
    ok[ok] = first[src[ok]] == rows[ok]
    if not ok.all():
        r = int(np.argmin(ok))
        raise ValueError(f"{op}: source must be a permutation of [0, {n}), got {src[r]} at row {r}")


def moe_unpermute(y, source, weights):
    """out[n] = sum_j weights[n, j] * y[pos[n*k + j]]; pos, the inverse of source, by a scatter of row numbers
    (float64, exact for any realistic row count). source is checked on the host, as the fused kernels do: a
    repeated or out-of-range entry would silently drop or mix rows."""
    N, k = weights.shape
    M = y.shape[0]
    _check_permutation("moe_unpermute", source.numpy().reshape(-1))
    rows = from_numpy(np.arange(M, dtype=np.float64), device=y.device)
    pos = F.scatter_add(zeros(M, dtype="float64", device=y.device), 0, source, rows)
    picked = F.embedding(F.cast(pos, "int64"), _up(y)).reshape(N, k, y.shape[1])
    out = F.sum(F.mul(picked, _down(weights, picked.dtype).reshape(N, k, 1)), 1)
    return _down(out, y.dtype)


@autograd.no_grad()
def adamw_(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """The adamw_ update in place, from required ops."""
    g = _down(grad, m.dtype)
    m.copy_(F.add(F.affine(m, beta1, 0.0), F.affine(g, 1.0 - beta1, 0.0)))
    v.copy_(F.add(F.affine(v, beta2, 0.0), F.affine(F.mul(g, g), 1.0 - beta2, 0.0)))
    mhat = F.affine(m, 1.0 / (1.0 - beta1**step), 0.0)
    denom = F.affine(F.sqrt(F.affine(v, 1.0 / (1.0 - beta2**step), 0.0)), 1.0, eps)
    p = _down(param, m.dtype)
    p = F.sub(F.affine(p, 1.0 - lr * weight_decay, 0.0), F.affine(F.div(mhat, denom), lr, 0.0))
    param.copy_(p)


def foreach_sum_squares(xs):
    """Each x's sum_squares (accumulated in float64) widened to float64 and summed; rounded once at the end."""
    total = None
    for x in xs:
        s = F.cast(Tensor(dispatch.call("sum_squares", [x])[0]), "float64")
        total = s if total is None else F.add(total, s)
    return _down(total, "float64" if xs[0].dtype == "float64" else "float32")


@autograd.no_grad()
def foreach_mul_(scale, xs):
    """Each x *= scale in place: the product in float32 (float64 for float64 x), rounded once to x's dtype."""
    for x in xs:
        xf = _up(x)
        x.copy_(F.mul(xf, _down(scale, xf.dtype)))


# ---- dispatcher-level composites: (native inputs, attrs) -> native outputs ----

_FORWARD = {
    "silu": lambda ins, a: [silu(ins[0])],
    "gelu_tanh": lambda ins, a: [gelu_tanh(ins[0])],
    "gelu": lambda ins, a: [gelu(ins[0])],
    "rmsnorm": lambda ins, a: list(rmsnorm(ins[0], ins[1], a[0])),
    "add_layernorm": lambda ins, a: list(add_layernorm(*ins, *a)),
    "add_rmsnorm": lambda ins, a: list(add_rmsnorm(*ins, *a)),
    "swiglu": lambda ins, a: [swiglu(ins[0], ins[1])],
    "rope": lambda ins, a: [rope(ins[0], ins[1], ins[2], bool(a[0]))],
    "sdpa": lambda ins, a: list(sdpa(ins[0], ins[1], ins[2], bool(a[0]), a[1])),
    "sdpa_bthd": lambda ins, a: list(sdpa_bthd(ins[0], ins[1], ins[2], a[0], a[1])),
    "cross_entropy": lambda ins, a: list(cross_entropy(ins[0], ins[1], a[0])),
    "moe_topk": lambda ins, a: list(moe_topk(ins[0], a[0], a[1])),
    "moe_permute": lambda ins, a: list(moe_permute(ins[0], ins[1], a[0])),
    "moe_unpermute": lambda ins, a: [moe_unpermute(ins[0], ins[1], ins[2])],
    "linear_gelu_tanh": lambda ins, a: list(linear_gelu_tanh(*ins)),
    "fp8_quantize": lambda ins, a: list(fp8_quantize(ins[0], ins[1], a[0])),
    "fp8_matmul": lambda ins, a: [fp8_matmul(*ins[:4], ins[4] if len(ins) == 5 else None, *a)],
}


def _wrap(ts):
    return [Tensor(t) for t in ts]


# Composites run as the kernels do: without autocast (they choose their own precision) and without
# recording a graph (the dispatcher's caller records one for the op).


def _forward(fn):
    def run(ins, attrs):
        with autograd.no_grad(), amp.autocast(enabled=False):
            return [t._t for t in fn(_wrap(ins), attrs)]

    return run


def _explicit(fn):
    def run(ins, attrs):
        with autograd.no_grad(), amp.autocast(enabled=False):
            return [t._t for t in fn(*_wrap(ins), *attrs)]

    return run


def _derived(forward, positions, grad_pos, wrt):
    """A backward op from autograd of the forward composite: positions of the forward's inputs in the
    backward's inputs, the position of the incoming gradient, the forward inputs that get gradients."""
    fn = _FORWARD[forward]

    def run(ins, attrs):
        ins = _wrap(ins)
        fwd_in = [ins[p] for p in positions]
        fwd_in = [t.detach().requires_grad_() if i in wrt else t for i, t in enumerate(fwd_in)]
        with autograd.enable_grad(), amp.autocast(enabled=False):
            outs = fn(fwd_in, attrs)
            outs[0].backward(ins[grad_pos])
        return [fwd_in[i].grad._t for i in wrt]

    return run


def _adamw(ins, attrs):
    with amp.autocast(enabled=False):
        adamw_(*_wrap(ins), *attrs)
    return []


def _foreach_sum_squares(ins, attrs):
    with autograd.no_grad(), amp.autocast(enabled=False):
        return [foreach_sum_squares(_wrap(ins))._t]


def _foreach_mul(ins, attrs):
    with amp.autocast(enabled=False):
        foreach_mul_(Tensor(ins[0]), _wrap(ins[1:]))
    return []


def _foreach_adamw(ins, attrs):
    """adamw_ on each set: its kernel where the device has one (so the bits are adamw_'s), else its composite."""
    n = len(ins) // 4
    op = dispatch.op("adamw_")
    for k in range(n):
        op([ins[k], ins[n + k], ins[2 * n + k], ins[3 * n + k]], list(attrs))
    return []


COMPOSITES = {name: _forward(fn) for name, fn in _FORWARD.items()}
COMPOSITES.update(
    {
        "silu_backward": _derived("silu", [0], 1, [0]),
        "gelu_tanh_backward": _derived("gelu_tanh", [0], 1, [0]),
        "gelu_backward": _derived("gelu", [0], 1, [0]),
        "swiglu_backward": _derived("swiglu", [0, 1], 2, [0, 1]),
        "linear_weight_grad": _explicit(linear_weight_grad),
        "linear_dgelu_tanh": _explicit(linear_dgelu_tanh),
        "rmsnorm_backward": _explicit(rmsnorm_backward),
        "add_layernorm_backward": _explicit(add_layernorm_backward),
        "add_rmsnorm_backward": _explicit(add_rmsnorm_backward),
        "sdpa_backward": _explicit(sdpa_backward),
        "sdpa_bthd_backward": _explicit(sdpa_bthd_backward),
        "cross_entropy_backward": _explicit(cross_entropy_backward),
        "moe_topk_backward": _explicit(moe_topk_backward),
        "moe_unpermute_backward": _derived("moe_unpermute", [1, 2, 3], 0, [0, 2]),
        "adamw_": _adamw,
        "fp8_amax_push_": _fp8_amax_push,
        "fp8_quantize_delayed_": _explicit(fp8_quantize_delayed_),
        "foreach_sum_squares": _foreach_sum_squares,
        "foreach_mul_": _foreach_mul,
        "foreach_adamw_": _foreach_adamw,
    }
)

for _name, _fn in COMPOSITES.items():
    dispatch.set_composite(_name, _fn)
