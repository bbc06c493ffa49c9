"""rope, sdpa, sdpa_bthd and their backward kernels against explicit float64 NumPy attention (grouped-query heads)."""

import math

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, TOL, assert_close, randn, rng, round_to, run, stat_dtype, to_device
from infinitrain import functional as F
from infinitrain.tools.conformance_specs import ATTENTION_16

DTYPES = ("float32", "bfloat16", "float16", "float64")


# ---- rope --------------------------------------------------------------------


def ref_rope(x, cos, sin, inverse):
    s = -sin if inverse else sin
    c, s = cos[None, :, None, :], s[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_tables(t, d, dtype):
    pos = np.arange(t)[:, None]
    freq = 10000.0 ** (-np.arange(d // 2) / (d // 2)) * (1 + 0.1 * rng().random(d // 2))
    angle = pos * freq
    st = stat_dtype(dtype)
    return round_to(np.cos(angle), st), round_to(np.sin(angle), st)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 7, 3, 8), (1, 33, 2, 16), (2, 17, 4, 64)], ids=str)
def test_rope(shape, inverse, dtype):
    x = round_to(randn(*shape), dtype)
    cos, sin = rope_tables(shape[1], shape[3], dtype)
    st = stat_dtype(dtype)
    out = run("rope", [to_device(x, dtype), to_device(cos, st), to_device(sin, st)], [inverse])[0]
    assert_close(out, ref_rope(x, cos, sin, inverse), dtype, what=f"rope {shape} inverse={inverse}")


def test_rope_inverse_undoes_rope():
    x = randn(2, 9, 3, 16)
    cos, sin = rope_tables(9, 16, "float64")
    tabs = [to_device(cos, "float64"), to_device(sin, "float64")]
    y = run("rope", [to_device(x, "float64")] + tabs, [0])[0]
    back = run("rope", [y] + tabs, [1])[0]
    assert_close(back, x, "float64", what="rope inverse")


def test_rope_empty():
    out = run("rope", [to_device(np.zeros((0, 3, 2, 4)), "float32"), *[to_device(randn(3, 2), "float32")] * 2], [0])
    assert out[0].shape == (0, 3, 2, 4)


# ---- sdpa --------------------------------------------------------------------


def expand_kv(k, hq):
    """Query head h reads kv head h // (Hq / Hkv)."""
    return np.repeat(k, hq // k.shape[1], axis=1)


def causal_mask(t, s):
    return np.triu(np.ones((t, s), dtype=bool), 1)  # key s > query t


def ref_sdpa(q, k, v, causal, scale):
    hq = q.shape[1]
    kk, vv = expand_kv(k, hq), expand_kv(v, hq)
    s = q @ np.swapaxes(kk, -1, -2) * scale
    if causal:
        s = np.where(causal_mask(q.shape[2], k.shape[2]), -np.inf, s)
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    total = e.sum(-1, keepdims=True)
    return (e / total) @ vv, (m + np.log(total))[..., 0]


def ref_sdpa_backward(g, q, k, v, out, lse, causal, scale):
    """Analytic gradients of out = softmax(q k^T * scale + mask) v, from the saved out and lse."""
    b, hq, t, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    kk, vv = expand_kv(k, hq), expand_kv(v, hq)
    p = np.exp(q @ np.swapaxes(kk, -1, -2) * scale - lse[..., None])
    if causal:
        p = np.where(causal_mask(t, s), 0.0, p)
    dvv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (g * out).sum(-1, keepdims=True))
    dq = ds @ kk * scale
    dkk = np.swapaxes(ds, -1, -2) @ q * scale
    fold = (b, hkv, hq // hkv, s, d)
    return dq, dkk.reshape(fold).sum(2), dvv.reshape(fold).sum(2)


# (B, Hq, Hkv, T, S, D)
SDPA_DIMS = [
    (1, 1, 1, 1, 1, 8),
    (2, 4, 2, 7, 7, 16),
    (1, 4, 4, 33, 33, 8),
    (2, 4, 1, 33, 33, 64),
    (1, 2, 2, 7, 33, 16),  # more keys than queries (non-causal only)
    (3, 4, 2, 17, 1, 8),
    (2, 6, 2, 64, 64, 64),  # enough (b, h) work for the thread-parallel path
    (4, 4, 2, 33, 33, 16),  # 8 (b, kv head) pairs: the backward splits over heads at 8 threads too
    # Head dims the GPU flash kernels take (32, 64, 128), with partial tiles.
    (1, 6, 2, 77, 77, 32),
    (1, 2, 1, 65, 65, 128),
    (1, 3, 3, 5, 131, 64),  # a 5-query tile over three key tiles (non-causal only)
    # The GPU GEMM path's causal query blocks (256 queries): two whole blocks; two with a tail, 3 heads a kv head.
    (1, 2, 2, 512, 512, 8),
    (2, 3, 1, 300, 300, 16),
]


def atol16(ref, dtype):
    """Fused attention kernels (cuDNN's, flash attention) round the probabilities to the 16-bit input dtype
    before P @ V, so 16-bit results may err by about half an ulp times the largest |value|; measured on an
    H200 with cuDNN: 0.002 at values near 0.3 in bfloat16. Other dtypes keep the default."""
    scale = ATTENTION_16.get(dtype)
    if scale is None or not np.size(ref):
        return None
    return max(TOL[dtype][1], scale * float(np.abs(ref).max()))


# Causal attention needs T == S.
SDPA_CASES = [(d, c) for d in SDPA_DIMS for c in (0, 1) if not (c and d[3] != d[4])]


def sdpa_inputs(dims, dtype, gen):
    b, hq, hkv, t, s, d = dims
    q = round_to(randn(b, hq, t, d, gen=gen), dtype)
    k = round_to(randn(b, hkv, s, d, gen=gen), dtype)
    v = round_to(randn(b, hkv, s, d, gen=gen), dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,causal", SDPA_CASES, ids=str)
def test_sdpa(dims, causal, dtype):
    q, k, v = sdpa_inputs(dims, dtype, rng())
    scale = 1 / math.sqrt(dims[5]) if dims[0] != 3 else 0.7
    out, lse = run("sdpa", [to_device(q, dtype), to_device(k, dtype), to_device(v, dtype)], [causal, scale])
    r_out, r_lse = ref_sdpa(q, k, v, causal, scale)
    st = stat_dtype(dtype)
    assert lse.dtype == st
    assert_close(out, r_out, dtype, atol=atol16(r_out, dtype), what=f"sdpa out {dims} causal={causal}")
    assert_close(lse, r_lse, st, what=f"sdpa lse {dims} causal={causal}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,causal", SDPA_CASES, ids=str)
def test_sdpa_backward(dims, causal, dtype):
    gen = rng()
    q, k, v = sdpa_inputs(dims, dtype, gen)
    scale = 1 / math.sqrt(dims[5])
    st = stat_dtype(dtype)
    out, lse = ref_sdpa(q, k, v, causal, scale)
    # The saved forward outputs, as the kernel would have stored them.
    out, lse = round_to(out, dtype), round_to(lse, st)
    g = round_to(randn(*q.shape, gen=gen), dtype)
    ins = [to_device(a, dtype) for a in (g, q, k, v, out)] + [to_device(lse, st)]
    dq, dk, dv = run("sdpa_backward", ins, [causal, scale])
    r_dq, r_dk, r_dv = ref_sdpa_backward(g, q, k, v, out, lse, causal, scale)
    for got, ref, name in ((dq, r_dq, "dq"), (dk, r_dk, "dk"), (dv, r_dv, "dv")):
        assert_close(got, ref, dtype, atol=atol16(ref, dtype), what=f"sdpa {name} {dims} causal={causal}")


def bthd(a):
    return np.ascontiguousarray(np.swapaxes(a, 1, 2))  # [B, H, T, D] <-> [B, T, H, D]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,causal", SDPA_CASES, ids=str)
def test_sdpa_bthd(dims, causal, dtype):
    """sdpa_bthd on [B, T, H, D] tensors is sdpa of their [B, H, T, D] transposes, transposed back."""
    q, k, v = sdpa_inputs(dims, dtype, rng())
    scale = 1 / math.sqrt(dims[5])
    out, lse = run("sdpa_bthd", [to_device(bthd(a), dtype) for a in (q, k, v)], [causal, scale])
    r_out, r_lse = ref_sdpa(q, k, v, causal, scale)
    assert out.shape == bthd(r_out).shape and lse.shape == r_lse.shape
    assert_close(out, bthd(r_out), dtype, atol=atol16(r_out, dtype), what=f"sdpa_bthd out {dims} causal={causal}")
    assert_close(lse, r_lse, stat_dtype(dtype), what=f"sdpa_bthd lse {dims} causal={causal}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,causal", SDPA_CASES, ids=str)
def test_sdpa_bthd_backward(dims, causal, dtype):
    gen = rng()
    q, k, v = sdpa_inputs(dims, dtype, gen)
    scale = 1 / math.sqrt(dims[5])
    st = stat_dtype(dtype)
    out, lse = ref_sdpa(q, k, v, causal, scale)
    out, lse = round_to(out, dtype), round_to(lse, st)
    g = round_to(randn(*q.shape, gen=gen), dtype)
    ins = [to_device(bthd(a), dtype) for a in (g, q, k, v, out)] + [to_device(lse, st)]
    grads = run("sdpa_bthd_backward", ins, [causal, scale])
    refs = ref_sdpa_backward(g, q, k, v, out, lse, causal, scale)
    for got, ref, name in zip(grads, refs, ("dq", "dk", "dv"), strict=True):
        assert_close(got, bthd(ref), dtype, atol=atol16(ref, dtype), what=f"sdpa_bthd {name} {dims} causal={causal}")


def test_attention_bthd_equals_sdpa_through_autograd():
    """F.attention_bthd gives scaled_dot_product_attention's output and gradients, in the other layout."""
    gen, d = rng(), "float32"
    q, k, v = sdpa_inputs((2, 6, 2, 9, 9, 8), d, gen)
    g = randn(2, 9, 6, 8, gen=gen)
    a = [it.tensor(bthd(x), device=DEVICE, requires_grad=True) for x in (q, k, v)]
    b = [it.tensor(x, device=DEVICE, requires_grad=True) for x in (q, k, v)]
    out_a = F.attention_bthd(*a, is_causal=True)
    out_b = F.scaled_dot_product_attention(*b, is_causal=True)
    (out_a * it.tensor(g, device=DEVICE)).sum().backward()
    (out_b * it.tensor(bthd(g), device=DEVICE)).sum().backward()
    np.testing.assert_allclose(out_a.numpy(), bthd(out_b.numpy()), rtol=1e-6, atol=1e-6)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x.grad.numpy(), bthd(y.grad.numpy()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [0, 1])
def test_sdpa_backward_finite_difference(causal):
    """Kernel backward and the NumPy analytic gradient both match central differences (float64, GQA)."""
    gen, h, d = rng(), 1e-6, "float64"
    q, k, v = sdpa_inputs((1, 4, 2, 3, 3, 4), d, gen)
    g, scale = randn(*q.shape, gen=gen), 0.6
    out, lse = run("sdpa", [to_device(q, d), to_device(k, d), to_device(v, d)], [causal, scale])
    got = run(
        "sdpa_backward", [to_device(g, d), to_device(q, d), to_device(k, d), to_device(v, d), out, lse], [causal, scale]
    )
    ana = ref_sdpa_backward(g, q, k, v, out.numpy(), lse.numpy(), causal, scale)
    arrays = [q, k, v]
    for n, a in enumerate(arrays):
        num = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
            plus[n][i] += h
            minus[n][i] -= h
            num[i] = ((ref_sdpa(*plus, causal, scale)[0] - ref_sdpa(*minus, causal, scale)[0]) * g).sum() / (2 * h)
        np.testing.assert_allclose(got[n].numpy(), num, rtol=1e-6, atol=1e-8, err_msg=f"input {n}")
        np.testing.assert_allclose(ana[n], num, rtol=1e-6, atol=1e-8, err_msg=f"input {n}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 64])  # 64: a head dim the GPU flash kernels take
def test_sdpa_empty(dtype, d):
    """No queries: empty outputs, zero dk and dv."""
    q, k = np.zeros((1, 2, 0, d)), round_to(randn(1, 1, 5, d), dtype)
    out, lse = run("sdpa", [to_device(q, dtype), to_device(k, dtype), to_device(k, dtype)], [0, 0.5])
    assert out.shape == (1, 2, 0, d) and lse.shape == (1, 2, 0)
    ins = [to_device(a, dtype) for a in (q, q, k, k, q)] + [to_device(np.zeros((1, 2, 0)), stat_dtype(dtype))]
    dq, dk, dv = run("sdpa_backward", ins, [0, 0.5])
    assert dq.shape == (1, 2, 0, d)
    assert_close(dk, np.zeros(k.shape), dtype, what="dk")
    assert_close(dv, np.zeros(k.shape), dtype, what="dv")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 64])
def test_sdpa_no_keys(dtype, d):
    """No keys (non-causal): out 0, lse -inf, and zero gradients for q."""
    q, k = round_to(randn(1, 2, 3, d), dtype), np.zeros((1, 1, 0, d))
    out, lse = run("sdpa", [to_device(q, dtype), to_device(k, dtype), to_device(k, dtype)], [0, 0.5])
    assert_close(out, np.zeros(q.shape), dtype, what="out")
    assert (lse.numpy() == -np.inf).all(), lse.numpy()
    g = round_to(randn(*q.shape), dtype)
    ins = [to_device(a, dtype) for a in (g, q, k, k, np.zeros(q.shape))] + [lse]
    dq, dk, dv = run("sdpa_backward", ins, [0, 0.5])
    assert_close(dq, np.zeros(q.shape), dtype, what="dq")
    assert dk.shape == k.shape and dv.shape == k.shape


def f32(*shape):
    return to_device(randn(*shape), "float32")


def f64(*shape):
    return to_device(randn(*shape), "float64")


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("rope", lambda: [f32(1, 3, 2, 5), f32(3, 2), f32(3, 2)], [0], "head dim must be even"),
        ("rope", lambda: [f32(1, 3, 2, 4), f64(3, 2), f64(3, 2)], [0], "cos/sin must be float32"),
        ("rope", lambda: [f32(1, 3, 2, 4), f32(4, 2), f32(4, 2)], [0], r"cos/sin must have shape \[3, 2\]"),
        ("rope", lambda: [f32(3, 2, 4), f32(3, 2), f32(3, 2)], [0], "x must be 4-d"),
        ("sdpa", lambda: [f32(1, 3, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8)], [0, 1.0], "multiple of k heads"),
        ("sdpa", lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 6), f32(1, 2, 4, 6)], [0, 1.0], "share batch and head dim"),
        ("sdpa", lambda: [f32(1, 2, 4, 8), f32(1, 2, 5, 8), f32(1, 2, 5, 8)], [1, 1.0], "equal query and key"),
        ("sdpa", lambda: [f32(1, 2, 4, 8), f32(1, 2, 5, 8), f32(1, 2, 4, 8)], [0, 1.0], "k and v"),
        ("sdpa", lambda: [f32(1, 2, 4, 8), f64(1, 2, 4, 8), f64(1, 2, 4, 8)], [0, 1.0], "dtype mismatch"),
        ("sdpa", lambda: [f32(2, 4, 8), f32(2, 4, 8), f32(2, 4, 8)], [0, 1.0], "must be 4-d"),
        ("sdpa", lambda: [f32(1, 2, 4, 8)] * 3, [0], "expected 2 attribute"),
        # sdpa_bthd: heads are dim 2, the sequence dim 1.
        ("sdpa_bthd", lambda: [f32(1, 4, 3, 8), f32(1, 4, 2, 8), f32(1, 4, 2, 8)], [0, 1.0], r"layout \[B, T, H, D\]"),
        ("sdpa_bthd", lambda: [f32(1, 4, 2, 8), f32(1, 5, 2, 8), f32(1, 5, 2, 8)], [1, 1.0], "equal query and key"),
        (
            "sdpa_bthd_backward",
            lambda: [f32(1, 4, 2, 8)] * 5 + [f32(1, 4, 2)],
            [0, 1.0],
            r"lse must have shape \[1, 2, 4\]",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f64(1, 2, 4)],
            [0, 1.0],
            "lse must be float32",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 5)],
            [0, 1.0],
            r"lse must have shape \[1, 2, 4\]",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 3, 8), f32(1, 2, 4)],
            [0, 1.0],
            "out and q: shapes",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 3, 8), f32(1, 2, 4, 8), f32(1, 2, 4)],
            [0, 1.0],
            "k and v: shapes",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f64(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4)],
            [0, 1.0],
            "dtype mismatch",
        ),
        (
            "sdpa_backward",
            lambda: [f64(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4)],
            [0, 1.0],
            "dtype mismatch",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 5, 8), f32(1, 2, 5, 8), f32(1, 2, 4, 8), f32(1, 2, 4)],
            [1, 1.0],
            "equal query and key",
        ),
        (
            "sdpa_backward",
            lambda: [f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8), f32(1, 2, 4, 8)],
            [0, 1.0],
            "expected inputs",
        ),
    ],
)
def test_attention_errors(op, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), attrs)


@pytest.mark.parametrize(
    "attrs, match", [([1.0, 0.5], "'causal' must be an int"), ([0, "x"], "'scale' must be a float")]
)
def test_sdpa_backward_attr_types(attrs, match):
    ins = [f32(1, 2, 4, 8)] * 5 + [f32(1, 2, 4)]
    with pytest.raises(ValueError, match=match):
        run("sdpa_backward", ins, attrs)
