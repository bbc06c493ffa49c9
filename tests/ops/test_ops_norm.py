"""softmax, log_softmax, layernorm and rmsnorm kernels, and the norms with the residual add before them
(add_layernorm, add_rmsnorm), forward and backward, against float64 NumPy."""

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, stat_dtype, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")


# ---- softmax / log_softmax ---------------------------------------------------


def ref_softmax(x, dim):
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def ref_log_softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


SOFTMAX_CASES = [
    ((7,), 0),
    ((1,), -1),
    ((3, 17), -1),
    ((3, 17), 0),
    ((2, 33, 5), 1),
    ((4, 1, 65), -1),
    ((2, 3, 4, 5), -3),
    ((64, 65), 1),  # parallel rows
    ((65, 64), 0),  # parallel strided columns
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, dim", SOFTMAX_CASES, ids=str)
def test_softmax(shape, dim, log, dtype):
    x = round_to(randn(*shape, scale=3.0), dtype)
    op = "log_softmax" if log else "softmax"
    out = run(op, [to_device(x, dtype)], [dim])[0]
    ref = ref_log_softmax(x, dim) if log else ref_softmax(x, dim)
    assert_close(out, ref, dtype, what=f"{op} {shape} dim={dim}")


def ref_softmax_backward(y, g, dim, log):
    if log:
        return g - np.exp(y) * g.sum(axis=dim, keepdims=True)
    return y * (g - (g * y).sum(axis=dim, keepdims=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape, dim", SOFTMAX_CASES, ids=str)
def test_softmax_backward(shape, dim, log, dtype):
    gen = rng()
    x = randn(*shape, gen=gen, scale=2.0)
    y = round_to(ref_log_softmax(x, dim) if log else ref_softmax(x, dim), dtype)
    g = round_to(randn(*shape, gen=gen), dtype)
    op = "log_softmax_backward" if log else "softmax_backward"
    dx = run(op, [to_device(y, dtype), to_device(g, dtype)], [dim])[0]
    assert_close(dx, ref_softmax_backward(y, g, dim, log), dtype, what=f"{op} {shape} dim={dim}")


@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_finite_difference(log):
    """The analytic backward matches central differences of the forward (float64, small case)."""
    gen = rng()
    x, g, dim, h = randn(3, 5, gen=gen), randn(3, 5, gen=gen), 1, 1e-6
    fwd, bwd = ("log_softmax", "log_softmax_backward") if log else ("softmax", "softmax_backward")
    y = run(fwd, [to_device(x, "float64")], [dim])[0]
    dx = run(bwd, [y, to_device(g, "float64")], [dim])[0].numpy()
    ref = ref_log_softmax if log else ref_softmax
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        num[i] = ((ref(x + e, dim) - ref(x - e, dim)) * g).sum() / (2 * h)
    np.testing.assert_allclose(dx, num, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ref_softmax_backward(y.numpy(), g, dim, log), num, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("shape, dim", [((0, 5), 1), ((3, 0), -1), ((2, 0, 4), 0)])
def test_softmax_empty(op, shape, dim):
    inputs = [to_device(np.zeros(shape), "float32")] * (2 if op.endswith("backward") else 1)
    out = run(op, inputs, [dim])[0]
    assert out.shape == shape


def f32(*shape):
    return to_device(randn(*shape), "float32")


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("softmax", lambda: [f32(3, 4)], [2], "dim 2 out of range"),
        ("log_softmax", lambda: [f32(3, 4)], [-3], "dim -3 out of range"),
        (
            "softmax",
            lambda: [to_device(np.ones((3, 4)), "int64")],
            [0],
            "must be float32, bfloat16, float16 or float64",
        ),
        ("softmax_backward", lambda: [f32(3, 4), f32(3, 5)], [1], "out and grad"),
        ("log_softmax_backward", lambda: [f32(3, 4), to_device(randn(3, 4), "float64")], [1], "dtype mismatch"),
        ("softmax", lambda: [f32(3, 4)], [], "expected 1 attribute"),
    ],
)
def test_softmax_errors(op, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), attrs)


# ---- layernorm / rmsnorm -----------------------------------------------------


def ref_layernorm(x, w, b, eps):
    mean = x.mean(-1)
    var = ((x - mean[..., None]) ** 2).mean(-1)
    rstd = 1 / np.sqrt(var + eps)
    return (x - mean[..., None]) * rstd[..., None] * w + b, mean, rstd


def ref_layernorm_backward(g, x, w, mean, rstd):
    xhat = (x - mean[..., None]) * rstd[..., None]
    d = g * w
    dx = rstd[..., None] * (d - d.mean(-1, keepdims=True) - xhat * (d * xhat).mean(-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return dx, (g * xhat).sum(rows), g.sum(rows)


def ref_rmsnorm(x, w, eps):
    rstd = 1 / np.sqrt((x * x).mean(-1) + eps)
    return x * rstd[..., None] * w, rstd


def ref_rmsnorm_backward(g, x, w, rstd):
    xhat = x * rstd[..., None]
    d = g * w
    dx = rstd[..., None] * (d - xhat * (d * xhat).mean(-1, keepdims=True))
    return dx, (g * xhat).sum(tuple(range(x.ndim - 1)))


NORM_SHAPES = [(65,), (1, 1), (4, 1), (5, 17), (2, 3, 33), (64, 65), (3, 40, 33)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_layernorm(shape, dtype):
    gen, eps = rng(), 1e-5
    x = round_to(randn(*shape, gen=gen, scale=2.0) + 0.5, dtype)
    w = round_to(randn(shape[-1], gen=gen), dtype)
    b = round_to(randn(shape[-1], gen=gen), dtype)
    out, mean, rstd = run("layernorm", [to_device(x, dtype), to_device(w, dtype), to_device(b, dtype)], [eps])
    r_out, r_mean, r_rstd = ref_layernorm(x, w, b, eps)
    st = stat_dtype(dtype)
    assert mean.dtype == st and rstd.dtype == st
    assert_close(out, r_out, dtype, what="layernorm out")
    assert_close(mean, r_mean, st, what="layernorm mean")
    assert_close(rstd, r_rstd, st, what="layernorm rstd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_layernorm_backward(shape, dtype):
    gen, st = rng(), stat_dtype(dtype)
    x = round_to(randn(*shape, gen=gen, scale=2.0), dtype)
    w = round_to(randn(shape[-1], gen=gen), dtype)
    g = round_to(randn(*shape, gen=gen), dtype)
    _, mean, rstd = ref_layernorm(x, w, 0.0, 1e-5)
    mean, rstd = round_to(mean, st), round_to(rstd, st)
    ins = [to_device(g, dtype), to_device(x, dtype), to_device(w, dtype), to_device(mean, st), to_device(rstd, st)]
    dx, dw, db = run("layernorm_backward", ins)
    r_dx, r_dw, r_db = ref_layernorm_backward(g, x, w, mean, rstd)
    assert_close(dx, r_dx, dtype, what="layernorm dx")
    assert_close(dw, r_dw, dtype, what="layernorm dweight")
    assert_close(db, r_db, dtype, what="layernorm dbias")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_rmsnorm(shape, dtype):
    gen, eps = rng(), 1e-6
    x = round_to(randn(*shape, gen=gen, scale=2.0), dtype)
    w = round_to(randn(shape[-1], gen=gen), dtype)
    out, rstd = run("rmsnorm", [to_device(x, dtype), to_device(w, dtype)], [eps])
    r_out, r_rstd = ref_rmsnorm(x, w, eps)
    st = stat_dtype(dtype)
    assert rstd.dtype == st
    assert_close(out, r_out, dtype, what="rmsnorm out")
    assert_close(rstd, r_rstd, st, what="rmsnorm rstd")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
def test_rmsnorm_backward(shape, dtype):
    gen, st = rng(), stat_dtype(dtype)
    x = round_to(randn(*shape, gen=gen, scale=2.0), dtype)
    w = round_to(randn(shape[-1], gen=gen), dtype)
    g = round_to(randn(*shape, gen=gen), dtype)
    rstd = round_to(ref_rmsnorm(x, w, 1e-6)[1], st)
    dx, dw = run(
        "rmsnorm_backward", [to_device(g, dtype), to_device(x, dtype), to_device(w, dtype), to_device(rstd, st)]
    )
    r_dx, r_dw = ref_rmsnorm_backward(g, x, w, rstd)
    assert_close(dx, r_dx, dtype, what="rmsnorm dx")
    assert_close(dw, r_dw, dtype, what="rmsnorm dweight")


# ---- a residual add and the norm after it (add_layernorm, add_rmsnorm) --------------------------------------

# (x, y, out) dtypes: one throughout, or autocast's float32 residual stream with a 16-bit output (and y either).
ADD_NORM_DTYPES = [(d, d, d) for d in DTYPES] + [
    ("float32", "float32", "bfloat16"),
    ("float32", "bfloat16", "bfloat16"),
    ("float32", "float32", "float16"),
    ("float32", "float16", "float16"),
]
# 1030: rows longer than a 32-lane group holds (a block per row on GPUs).
ADD_NORM_SHAPES = [(65,), (4, 1), (5, 17), (3, 40, 33), (6, 1030)]


def _norm_refs(rms, s, w, b, eps):
    """The reference norm of s: (out, [mean,] rstd)."""
    if rms:
        return ref_rmsnorm(s, w, eps)
    return ref_layernorm(s, w, b, eps)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype, yd, od", ADD_NORM_DTYPES)
@pytest.mark.parametrize("shape", ADD_NORM_SHAPES, ids=str)
def test_add_norm(shape, dtype, yd, od, rms):
    """sum = x + y rounded once to x's dtype; out = the norm of that sum, rounded once to out's dtype."""
    xd = dtype
    gen, eps = rng(), 1e-5
    x = round_to(randn(*shape, gen=gen, scale=2.0) + 0.5, xd)
    y = round_to(randn(*shape, gen=gen), yd)
    w, b = round_to(randn(shape[-1], gen=gen), xd), round_to(randn(shape[-1], gen=gen), xd)
    params = [w] if rms else [w, b]
    ins = [to_device(x, xd), to_device(y, yd)] + [to_device(p, xd) for p in params]
    outs = run("add_rmsnorm" if rms else "add_layernorm", ins, [eps, "" if od == xd else od])
    assert [outs[0].dtype, outs[1].dtype] == [xd, od]
    s = round_to(x + y, xd)
    assert_close(outs[0], s, xd, what="sum")
    ref = _norm_refs(rms, s, w, b, eps)
    assert_close(outs[1], ref[0], od, what="out")
    for got, r in zip(outs[2:], ref[1:], strict=True):
        assert_close(got, r, stat_dtype(xd), what="statistics")


@pytest.mark.parametrize("residual", [False, True], ids=["alone", "residual"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype, gd", [(d, d) for d in DTYPES] + [("float32", "bfloat16"), ("float32", "float16")])
@pytest.mark.parametrize("shape", ADD_NORM_SHAPES, ids=str)
def test_add_norm_backward(shape, dtype, gd, rms, residual):
    """The norm's gradients from a grad in x's dtype or 16-bit, with the residual gradient added to dx."""
    gen, xd = rng(), dtype
    x = round_to(randn(*shape, gen=gen, scale=2.0) + 0.5, xd)
    w, g = round_to(randn(shape[-1], gen=gen), xd), round_to(randn(*shape, gen=gen), gd)
    res = round_to(randn(*shape, gen=gen), xd)
    st = stat_dtype(xd)
    stats = [round_to(t, st) for t in _norm_refs(rms, x, w, 0.0, 1e-5)[1:]]
    ins = [to_device(g, gd), to_device(x, xd), to_device(w, xd)] + [to_device(t, st) for t in stats]
    if residual:
        ins.append(to_device(res, xd))
    got = run("add_rmsnorm_backward" if rms else "add_layernorm_backward", ins)
    ref = list(ref_rmsnorm_backward(g, x, w, *stats) if rms else ref_layernorm_backward(g, x, w, *stats))
    if residual:
        ref[0] = ref[0] + res
    assert len(got) == len(ref)
    for k, (a, r) in enumerate(zip(got, ref, strict=True)):
        assert a.dtype == xd
        assert_close(a, r, xd, what=["dx", "dweight", "dbias"][k])


# Rows enough that each GPU group runs several (up to 384 blocks of 8 groups) at 10, 24 and 32 values a lane: the
# backward's running per-column sums (in shared memory at <= 24) across rows, and the register path at 32.
MANY_ROWS = [(3300, 300), (4000, 768), (3200, 1000)]


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype, gd", [("float32", "float32"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")])
@pytest.mark.parametrize("shape", MANY_ROWS, ids=str)
def test_add_norm_backward_many_rows(shape, dtype, gd, rms):
    test_add_norm_backward(shape, dtype, gd, rms, True)


@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype, yd, od", [("float32", "bfloat16", "bfloat16"), ("float16", "float16", "float16")])
@pytest.mark.parametrize("shape", MANY_ROWS, ids=str)
def test_add_norm_many_rows(shape, dtype, yd, od, rms):
    test_add_norm(shape, dtype, yd, od, rms)


def bf16(*shape):
    return to_device(randn(*shape), "bfloat16")


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("add_layernorm", lambda: [f32(3, 4), f32(3, 5), f32(4), f32(4)], [1e-5, ""], "x and y"),
        ("add_layernorm", lambda: [f32(3, 4), f64(3, 4), f32(4), f32(4)], [1e-5, ""], "y must be float32, got"),
        ("add_layernorm", lambda: [f32(3, 4), f64(3, 4), f32(4), f32(4)], [1e-5, "bfloat16"], "float32 or bfloat16"),
        ("add_layernorm", lambda: [f64(3, 4), f64(3, 4), f64(4), f64(4)], [1e-5, "bfloat16"], "dtype must be x's"),
        ("add_layernorm", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(4)], [1e-5, "int64"], "dtype must be x's"),
        ("add_layernorm", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(4)], [1e-5, "half"], "a dtype name .* 'half'"),
        ("add_layernorm", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(5)], [1e-5, ""], r"bias must have shape \[4\]"),
        ("add_layernorm", lambda: [f32(3, 4), f32(3, 4), f64(4), f32(4)], [1e-5, ""], "weight must be float32"),
        ("add_rmsnorm", lambda: [f32(3, 4), bf16(3, 4), f32(4)], [1e-5, ""], "y must be float32, got bfloat16"),
        ("add_rmsnorm", lambda: [f32(2), f32(2), f32(2)], [1e-5], r"expected 2 attribute\(s\) \(eps, dtype\)"),
        (
            "add_layernorm_backward",
            lambda: [f64(3, 4), f32(3, 4), f32(4), f32(3), f32(3)],
            [],
            "grad must be float32, bfloat16 or float16, got float64",
        ),
        (
            "add_layernorm_backward",
            lambda: [bf16(3, 4), f64(3, 4), f64(4), f64(3), f64(3)],
            [],
            "grad must be float64, got bfloat16",
        ),
        (
            "add_layernorm_backward",
            lambda: [f32(3, 4), f32(3, 4), f32(4), f32(3), f32(3), f32(3, 5)],
            [],
            "residual and x",
        ),
        ("add_rmsnorm_backward", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(3), f64(3, 4)], [], "residual must be"),
        ("add_rmsnorm_backward", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(4)], [], r"rstd must have shape \[3\]"),
    ],
)
def test_add_norm_errors(op, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), attrs)


def numeric_grads(f, arrays, g, h=1e-6):
    """Central differences of sum(f(*arrays) * g) with respect to each array."""
    grads = []
    for k, a in enumerate(arrays):
        num = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k][i] += h
            minus[k][i] -= h
            num[i] = ((f(*plus) - f(*minus)) * g).sum() / (2 * h)
        grads.append(num)
    return grads


@pytest.mark.parametrize("rms", [False, True])
def test_norm_backward_finite_difference(rms):
    """The analytic backward (kernel and NumPy reference) matches central differences in float64."""
    gen, eps, d = rng(), 1e-5, "float64"
    x, w, b, g = randn(3, 6, gen=gen), randn(6, gen=gen), randn(6, gen=gen), randn(3, 6, gen=gen)
    if rms:
        _, rstd = run("rmsnorm", [to_device(x, d), to_device(w, d)], [eps])
        got = run("rmsnorm_backward", [to_device(g, d), to_device(x, d), to_device(w, d), rstd])
        num = numeric_grads(lambda x, w: ref_rmsnorm(x, w, eps)[0], [x, w], g)
        ref = ref_rmsnorm_backward(g, x, w, rstd.numpy())
    else:
        _, mean, rstd = run("layernorm", [to_device(x, d), to_device(w, d), to_device(b, d)], [eps])
        got = run("layernorm_backward", [to_device(g, d), to_device(x, d), to_device(w, d), mean, rstd])
        num = numeric_grads(lambda x, w, b: ref_layernorm(x, w, b, eps)[0], [x, w, b], g)
        ref = ref_layernorm_backward(g, x, w, mean.numpy(), rstd.numpy())
    for k in range(len(num)):
        np.testing.assert_allclose(got[k].numpy(), num[k], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ref[k], num[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_empty_rows(dtype):
    """No rows: empty outputs, and the weight/bias gradients are zero sums."""
    x, w = np.zeros((0, 5)), randn(5)
    out, mean, rstd = run("layernorm", [to_device(x, dtype), to_device(w, dtype), to_device(w, dtype)], [1e-5])
    assert out.shape == (0, 5) and mean.shape == (0,) and rstd.shape == (0,)
    st = stat_dtype(dtype)
    stats = to_device(np.zeros(0), st)
    dx, dw, db = run(
        "layernorm_backward", [to_device(x, dtype), to_device(x, dtype), to_device(w, dtype), stats, stats]
    )
    assert dx.shape == (0, 5)
    assert_close(dw, np.zeros(5), dtype, what="dweight")
    assert_close(db, np.zeros(5), dtype, what="dbias")
    dx, dw = run("rmsnorm_backward", [to_device(x, dtype), to_device(x, dtype), to_device(w, dtype), stats])
    assert_close(dw, np.zeros(5), dtype, what="rms dweight")


def f64(*shape):
    return to_device(randn(*shape), "float64")


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("layernorm", lambda: [f32(3, 4), f32(5), f32(4)], [1e-5], r"weight and bias must have shape \[4\]"),
        ("layernorm", lambda: [f32(3, 4), f32(4), f64(4)], [1e-5], "dtype mismatch"),
        ("layernorm", lambda: [to_device(np.ones((3, 4)), "int64")] * 3, [1e-5], "must be float32"),
        ("layernorm", lambda: [f32(3, 4), f32(4), f32(4)], [], "expected 1 attribute"),
        ("layernorm_backward", lambda: [f32(3, 4), f32(3, 5), f32(4), f32(3), f32(3)], [], "grad and x"),
        (
            "layernorm_backward",
            lambda: [f32(3, 4), f32(3, 4), f32(5), f32(3), f32(3)],
            [],
            "weight must have shape|dtype mismatch",
        ),
        (
            "layernorm_backward",
            lambda: [f32(3, 4), f32(3, 4), f64(4), f32(3), f32(3)],
            [],
            "weight must have shape|dtype mismatch",
        ),
        ("layernorm_backward", lambda: [f32(3, 4), f32(3, 4), f32(4), f64(3), f32(3)], [], "mean must be float32"),
        (
            "layernorm_backward",
            lambda: [f32(3, 4), f32(3, 4), f32(4), f32(3), f32(4)],
            [],
            r"rstd must have shape \[3\]",
        ),
        ("rmsnorm", lambda: [f32(3, 4), f32(3)], [1e-5], r"weight must have shape \[4\]"),
        (
            "rmsnorm_backward",
            lambda: [f32(3, 4), f32(3, 4), f32(7), f32(3)],
            [],
            "weight must have shape|dtype mismatch",
        ),
        ("rmsnorm_backward", lambda: [f32(3, 4), f32(3, 4), f32(4), f32(2)], [], "rstd must have shape"),
        ("rmsnorm_backward", lambda: [f32(3, 4), f32(3, 4), f32(4), f64(3)], [], "rstd must be float32"),
    ],
)
def test_norm_errors(op, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), attrs)
