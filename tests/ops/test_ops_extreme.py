"""Reductions and normalisations at extreme inputs, against float64 NumPy: logits up to |x| = 1e4 (exp overflows
float32 above 88, so a kernel without max-subtraction fails), tiny and huge norms, sums past float32's range,
all-masked rows, and -inf / NaN propagation where the result is defined."""

import math

import numpy as np
import pytest

from harness import DEVICE, TOL, assert_close, rng, round_to, run, to_device
from infinitrain import _C

DTYPES = ("float32", "bfloat16", "float16", "float64")


def stat(dtype):
    return "float64" if dtype == "float64" else "float32"


def big_logits(shape, dtype, gen, scale=1e4):
    """Uniform in [-scale, scale]; each row's top two are close, so the result is not one-hot."""
    x = gen.uniform(-scale, scale, shape)
    top = x.argmax(-1)
    rows = np.arange(x.shape[0])
    x[rows, (top + 1) % x.shape[-1]] = x[rows, top] - gen.uniform(0.5, 2.0, x.shape[0])
    return round_to(x, dtype).reshape(shape)


def ref_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis, keepdims=True)


def ref_log_softmax(x, axis=-1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def ref_lse(x):
    m = x.max(-1)
    return m + np.log(np.exp(x - m[:, None]).sum(-1))


# ---- softmax / log_softmax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((5, 33), -1), ((33, 5), 0), ((70, 600), 1)], ids=str)
def test_softmax_large_logits(op, shape, dim, dtype):
    gen = rng()
    x = big_logits(shape if dim != 0 else shape[::-1], dtype, gen)
    x = x.T.copy() if dim == 0 else x
    out = run(op, [to_device(x, dtype)], [dim])[0]
    want = ref_softmax(x, dim) if op == "softmax" else ref_log_softmax(x, dim)
    assert_close(out, want, dtype, what=f"{op} |x| <= 1e4")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_masked_and_nan_rows(dtype):
    """-inf entries get probability 0 (log: -inf); an all -inf row is 0/0 = NaN, as is a row with NaN or +inf;
    other rows are unaffected."""
    gen = rng()
    x = gen.standard_normal((5, 9)) * 3
    x[0, [1, 4]] = -np.inf
    x[1, :] = -np.inf
    x[2, 3] = np.nan
    x[3, 7] = np.inf
    with np.errstate(invalid="ignore"):
        want = {"softmax": ref_softmax(x), "log_softmax": ref_log_softmax(x)}
    for op, w in want.items():
        got = run(op, [to_device(x, dtype)], [1])[0].numpy().astype(np.float64)
        assert np.isnan(got[1:4]).all(), (op, got[1:4])
        assert_close(got[[0, 4]], w[[0, 4]], dtype, what=op)  # the -inf entries compare exactly
    grad = gen.standard_normal((5, 9))
    y = run("softmax", [to_device(x, dtype)], [1])[0]
    dx = run("softmax_backward", [y, to_device(grad, dtype)], [1])[0].numpy()
    p = want["softmax"][0]
    assert_close(dx[0], p * (grad[0] - (grad[0] * p).sum()), dtype, what="softmax_backward on a masked row")
    assert dx[0, 1] == 0 and dx[0, 4] == 0


# ---- cross_entropy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_large_logits(dtype):
    gen = rng()
    n, v = 40, 257
    x = big_logits((n, v), dtype, gen)
    target = gen.integers(0, v, n)
    target[:5] = x[:5].argmax(-1)  # some rows right, with a loss near 0
    loss, lse = run("cross_entropy", [to_device(x, dtype), to_device(target, "int64")], [-100])
    r_lse = ref_lse(x)
    st = stat(dtype)
    assert_close(lse, r_lse, st, what="lse at |x| <= 1e4")
    assert_close(loss, np.mean(r_lse - x[np.arange(n), target]), st, what="loss at |x| <= 1e4")
    g = round_to(1.3, st)
    dx = run(
        "cross_entropy_backward",
        [to_device(x, dtype), to_device(target, "int64"), lse, to_device(np.array(g), st)],
        [-100],
    )[0]
    want = np.exp(x - lse.numpy().astype(np.float64)[:, None])  # from lse as the forward saved it (float32: 1e-3 off)
    want[np.arange(n), target] -= 1
    assert_close(dx, g * want / n, dtype, what="dlogits at |x| <= 1e4")


def composite(op, inputs, attrs):
    """Runs an op through its composite (what a device without the kernel runs)."""
    out = _C.op(op).call_composite(list(inputs), list(attrs))
    _C.synchronize(DEVICE)
    return out


@pytest.mark.parametrize("call", [run, composite], ids=["kernel", "composite"])
def test_cross_entropy_masked_logits_and_nan(call):
    """-inf logits (masked vocabulary) are fine unless they are the target (loss inf); a fully masked row that is
    ignored changes neither the loss nor the gradient; NaN in a counted row makes the loss NaN."""
    gen = rng()
    x = gen.standard_normal((4, 7))
    x[0, [2, 5]] = -np.inf
    x[1, :] = -np.inf  # padding row, ignored
    target = np.array([1, -100, 3, 6])
    loss, lse = call("cross_entropy", [to_device(x, "float64"), to_device(target, "int64")], [-100])
    keep = [0, 2, 3]
    want = np.mean([ref_lse(x[[r]])[0] - x[r, target[r]] for r in keep])
    assert_close(loss, want, "float64", what="loss with masked logits")
    assert_close(lse.numpy()[keep], ref_lse(x[keep]), "float64", what="lse")
    dx = call(
        "cross_entropy_backward",
        [to_device(x, "float64"), to_device(target, "int64"), lse, to_device(np.array(1.0), "float64")],
        [-100],
    )[0].numpy()
    assert (dx[1] == 0).all() and dx[0, 2] == 0 and dx[0, 5] == 0 and np.isfinite(dx).all()
    x2 = x.copy()
    x2[0, target[0]] = -np.inf
    loss2, _ = call("cross_entropy", [to_device(x2, "float64"), to_device(target, "int64")], [-100])
    assert loss2.numpy() == np.inf
    x3 = x.copy()
    x3[2, 0] = np.nan
    loss3, lse3 = call("cross_entropy", [to_device(x3, "float64"), to_device(target, "int64")], [-100])
    assert np.isnan(loss3.numpy()) and np.isnan(lse3.numpy()[2]) and np.isfinite(lse3.numpy()[[0, 3]]).all()


# ---- sdpa ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [0, 1])
def test_sdpa_huge_scores(causal, dtype):
    """Scores in the thousands: the row max must be subtracted before exp."""
    gen = rng()
    b, h, t, d = 2, 2, 9, 8
    q = round_to(gen.standard_normal((b, h, t, d)) * 40, dtype)
    k = round_to(gen.standard_normal((b, h, t, d)) * 40, dtype)
    v = round_to(gen.standard_normal((b, h, t, d)), dtype)
    scale = 1 / math.sqrt(d)
    out, lse = run("sdpa", [to_device(a, dtype) for a in (q, k, v)], [causal, scale])
    s = q @ np.swapaxes(k, -1, -2) * scale
    assert np.abs(s).max() > 1000
    if causal:
        s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
    m = s.max(-1, keepdims=True)
    r_lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(s - r_lse[..., None])
    # The scores are float32 (float64) products: each is off by up to D * u * sum |q k| (the standard dot-product
    # bound, u = 2^-24 or 2^-53), thousands times u here. lse and out may be off by that much besides rounding.
    u = 2.0**-53 if dtype == "float64" else 2.0**-24
    slack = (d * u * np.abs(q) @ np.abs(np.swapaxes(k, -1, -2)) * scale).max(-1)
    st = stat(dtype)
    rtol, atol = TOL[st]
    got = lse.numpy().astype(np.float64)
    assert (np.abs(got - r_lse) <= atol + rtol * np.abs(r_lse) + slack).all(), "lse of huge scores"
    rtol, atol = TOL[dtype]
    err = np.abs(out.numpy().astype(np.float64) - p @ v)
    assert (err <= atol + rtol * np.abs(p @ v) + 2 * slack[..., None] * np.abs(v).max()).all(), "out"


# ---- layernorm / rmsnorm -------------------------------------------------------------------------------------


def ref_layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return (x - mu) * rstd * w + b, mu[..., 0], rstd[..., 0]


def ref_rmsnorm(x, w, eps):
    rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * rstd * w, rstd[..., 0]


EPS = {"float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-7, "float16": 2.0**-10}  # unit roundoff x 2

# (case, scale of the row's spread, offset of its mean, dtypes): tiny rows are dominated by eps; huge ones square
# past float32's range (1e20^2) unless accumulated in double; an offset of 1e4 over a spread of 1e-2 cancels
# catastrophically in a one-pass variance (float32 only: in float64 that condition, 1e6, eats float64's rtol).
NORM_CASES = [
    ("tiny", 1e-20, 0.0, ("float32", "float64")),
    ("small", 1e-3, 0.0, DTYPES),
    ("huge", 1e20, 0.0, ("float32", "bfloat16", "float64")),
    ("offset", 1e-2, 1e4, ("float32",)),
    ("constant", 0.0, 3.0, DTYPES),
]


@pytest.mark.parametrize("case,spread,offset,dtypes", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_norms_at_extreme_scales(case, spread, offset, dtypes):
    gen = rng()
    for dtype in dtypes:
        st = stat(dtype)
        x = round_to(offset + spread * gen.standard_normal((6, 48)), dtype)
        w = round_to(1 + 0.5 * gen.standard_normal(48), dtype)
        b = round_to(0.5 * gen.standard_normal(48), dtype)
        eps = 1e-5
        out, mean, rstd = run("layernorm", [to_device(a, dtype) for a in (x, w, b)], [eps])
        r_out, r_mean, r_rstd = ref_layernorm(x, w, b, eps)
        assert_close(out, r_out, dtype, what=f"layernorm {case} {dtype}")
        assert_close(mean, r_mean, st, what=f"layernorm mean {case} {dtype}")
        assert_close(rstd, r_rstd, st, what=f"layernorm rstd {case} {dtype}")
        out, rstd = run("rmsnorm", [to_device(a, dtype) for a in (x, w)], [eps])
        r_out, r_rstd = ref_rmsnorm(x, w, eps)
        assert_close(out, r_out, dtype, what=f"rmsnorm {case} {dtype}")
        assert_close(rstd, r_rstd, st, what=f"rmsnorm rstd {case} {dtype}")
        # Backward from the saved statistics: finite, and as the formula says.
        g = round_to(gen.standard_normal(x.shape), dtype)
        _, mean, rstd = run("layernorm", [to_device(a, dtype) for a in (x, w, b)], [eps])
        dx, dw, db = run(
            "layernorm_backward", [to_device(g, dtype), to_device(x, dtype), to_device(w, dtype), mean, rstd]
        )
        m, r = mean.numpy().astype(np.float64)[:, None], rstd.numpy().astype(np.float64)[:, None]
        xhat = (x - m) * r
        d = g * w
        want = r * (d - d.mean(-1, keepdims=True) - xhat * (d * xhat).mean(-1, keepdims=True))
        assert np.isfinite(dx.numpy()).all()
        # dx = rstd * (d - mean(d) - ...): a rounding of d's size, times rstd (316 for constant rows), where the
        # difference cancels to ~0 (measured in a float32 emulation: 7.6e-5 against the former atol of 1e-5).
        rounding = 8 * EPS[dtype] * float(np.abs(r).max()) * float(np.abs(d).max())
        atol = max(TOL[dtype][1] * max(1.0, float(np.abs(r).max()) * 1e-3), rounding)
        assert_close(dx, want, dtype, atol=atol, what=f"dx {case}")
        assert_close(db, g.sum(0), dtype, what=f"dbias {case}")


def test_norm_nan_propagates_to_its_row_only():
    x = rng().standard_normal((3, 16))
    x[1, 5] = np.nan
    w = np.ones(16)
    out, _, rstd = run(
        "layernorm", [to_device(x, "float32"), to_device(w, "float32"), to_device(0 * w, "float32")], [1e-5]
    )
    o = out.numpy()
    assert np.isnan(o[1]).all() and np.isfinite(o[[0, 2]]).all() and np.isnan(rstd.numpy()[1])
    out, _ = run("rmsnorm", [to_device(x, "float32"), to_device(w, "float32")], [1e-5])
    o = out.numpy()
    assert np.isnan(o[1]).all() and np.isfinite(o[[0, 2]]).all()


# ---- sum / mean / amax / argmax / sum_squares -------------------------------------------------------------


def test_sums_beyond_float32():
    """Accumulation in double: the mean of float32 values near float32's max is finite, a sum past it is inf;
    squares past float32's range are inf in a float32 result, tiny squares survive."""
    big = round_to(3e38, "float32")
    x = np.full((2, 4), big)
    (mean,) = run("mean", [to_device(x, "float32")], [[1], 0])
    assert_close(mean, np.full(2, big), "float32", what="mean of values near the max")
    (s,) = run("sum", [to_device(x, "float32")], [[], 0])
    assert s.numpy() == np.inf
    x = round_to(rng().standard_normal(5000) * 1e20, "float32")
    (sq,) = run("sum_squares", [to_device(x, "float32")])
    assert sq.numpy() == np.inf  # 1e40 is past float32 (the result's dtype)
    (sq,) = run("sum_squares", [to_device(x, "float64")])
    assert_close(sq, np.sum(x * x), "float64", what="sum_squares of 1e20s in float64")
    x = round_to(rng().standard_normal(5000) * 1e-20, "float32")
    (sq,) = run("sum_squares", [to_device(x, "float32")])
    assert_close(sq, np.sum(x * x), "float32", atol=0, what="sum_squares of 1e-20s (squares subnormal in float32)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_with_infinities_and_nan(dtype):
    x = round_to(rng().standard_normal((4, 6)), dtype)
    x[0, 2] = np.inf
    x[1, 3] = -np.inf
    x[2, :] = -np.inf
    x[3, 1], x[3, 4] = np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        want = {"sum": x.sum(1), "mean": x.mean(1), "amax": x.max(1)}
    for op, w in want.items():
        (out,) = run(op, [to_device(x, dtype)], [[1], 0])
        got = out.numpy().astype(np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(w), err_msg=op)
        fin = np.isfinite(w)
        np.testing.assert_array_equal(got[~fin], w[~fin], err_msg=op)  # inf, -inf and NaN where NumPy has them
        assert_close(got[fin], w[fin], dtype, what=op)
    (idx,) = run("argmax", [to_device(x, dtype)], [1, 0])
    np.testing.assert_array_equal(idx.numpy(), x.argmax(1))
    (sq,) = run("sum_squares", [to_device(x, dtype)])
    assert sq.numpy() == np.inf
    x[3, 0] = np.nan
    (sq,) = run("sum_squares", [to_device(x, dtype)])
    assert np.isnan(sq.numpy())
