"""matmul, linear and linear_weight_grad kernels against float64 NumPy products of the dtype-rounded inputs."""

import numpy as np
import pytest

from harness import TOL, assert_close, randn, rng, round_to, run, to_device
from infinitrain.tools.conformance_specs import _gelu as gelu
from infinitrain.tools.conformance_specs import _gelu_grad as gelu_grad

DTYPES = ("float32", "bfloat16", "float16", "float64")


def gemm_tol(dtype, k):
    """Every dtype but float64 accumulates K products in float32: the absolute error grows about linearly in K
    (measured worst ~7e-6 at K=128 for N(0,1) inputs), so beyond K=64 the absolute bound scales with K/64 (a
    16-bit output's own rounding is relative, in rtol)."""
    rtol, atol = TOL[dtype]
    if dtype != "float64" and k > 64:
        atol *= k / 64
    return rtol, atol


def stored(shape, trans):
    """The stored shape of an operand whose logical last two dims are `shape[-2:]`."""
    shape = tuple(shape)
    return shape[:-2] + shape[-2:][::-1] if trans else shape


def logical(x, trans):
    return np.swapaxes(x, -1, -2) if trans else x


# (logical a shape [..., M, K], logical b shape [..., K, N])
MATMUL_CASES = [
    ((1, 1), (1, 1)),
    ((3, 17), (17, 33)),
    ((7, 65), (65, 1)),
    ((2, 3, 5, 7), (7, 4)),  # b shared by every batch: folds into one product
    ((5, 7), (2, 3, 7, 4)),  # a broadcast over b's batch
    ((2, 1, 5, 9), (1, 3, 9, 6)),  # size-1 batch dims on both sides
    ((4, 1, 3, 5), (6, 5, 2)),  # different batch ranks
    ((64, 9, 17), (64, 17, 9)),  # many small products: batch-parallel path
    ((2, 200, 65), (2, 65, 300)),  # few big products: OpenBLAS threads each
    ((3, 33, 128), (128, 17)),
    ((100, 140), (140, 20)),  # at 8 threads no 8-block grid of 16 x 16 blocks fits: 6 x 1, the last block clipped
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("shapes", MATMUL_CASES, ids=str)
def test_matmul(shapes, ta, tb, dtype):
    sa, sb = shapes
    g = rng()
    a = round_to(randn(*stored(sa, ta), gen=g), dtype)
    b = round_to(randn(*stored(sb, tb), gen=g), dtype)
    out = run("matmul", [to_device(a, dtype), to_device(b, dtype)], [ta, tb])[0]
    ref = np.matmul(logical(a, ta), logical(b, tb))
    rtol, atol = gemm_tol(dtype, sa[-1])
    assert_close(out, ref, dtype, rtol, atol, what=f"matmul {sa} @ {sb} ta={ta} tb={tb}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "sa, sb, expect",
    [
        ((3, 0), (0, 4), (3, 4)),  # K = 0: all zeros
        ((0, 3, 4), (4, 5), (0, 3, 5)),  # empty batch
        ((0, 4), (4, 5), (0, 5)),  # M = 0
        ((2, 3, 4), (2, 4, 0), (2, 3, 0)),  # N = 0
    ],
)
def test_matmul_empty(sa, sb, expect, dtype):
    a = randn(*sa) if np.prod(sa) else np.zeros(sa)
    b = randn(*sb) if np.prod(sb) else np.zeros(sb)
    out = run("matmul", [to_device(a, dtype), to_device(b, dtype)], [0, 0])[0]
    assert out.shape == expect
    assert_close(out, np.zeros(expect), dtype, what="empty matmul")


def _linear_case(x_shape, out_features, bias, dtype):
    """Fresh x [..., in], weight [out, in] (and bias [out]) in dtype: (device inputs, float64 x @ w^T [+ bias])."""
    g = rng()
    x = round_to(randn(*x_shape, gen=g), dtype)
    w = round_to(randn(out_features, x_shape[-1], gen=g), dtype)
    inputs, ref = [to_device(x, dtype), to_device(w, dtype)], x @ w.T
    if bias:
        bvec = round_to(randn(out_features, gen=g), dtype)
        inputs.append(to_device(bvec, dtype))
        ref = ref + bvec
    return inputs, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "x_shape, out_features",
    [((17,), 5), ((1, 1), 1), ((5, 17), 33), ((2, 3, 65), 7), ((4, 9, 128), 65)],
    ids=str,
)
def test_linear(x_shape, out_features, bias, dtype):
    in_features = x_shape[-1]
    inputs, ref = _linear_case(x_shape, out_features, bias, dtype)
    out = run("linear", inputs)[0]
    rtol, atol = gemm_tol(dtype, in_features)
    assert_close(out, ref, dtype, rtol, atol, what=f"linear {x_shape} -> {out_features} bias={bias}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_zero_inputs(dtype):
    """in_features = 0: the product is empty, so the output is the bias (or zeros)."""
    bvec = round_to(randn(4), dtype)
    x, w = np.zeros((3, 0)), np.zeros((4, 0))
    out = run("linear", [to_device(x, dtype), to_device(w, dtype), to_device(bvec, dtype)])[0]
    assert_close(out, np.broadcast_to(bvec, (3, 4)), dtype, what="linear K=0 with bias")
    out = run("linear", [to_device(x, dtype), to_device(w, dtype)])[0]
    assert_close(out, np.zeros((3, 4)), dtype, what="linear K=0")
    out = run("linear", [to_device(np.zeros((0, 5)), dtype), to_device(randn(4, 5), dtype)])[0]
    assert out.shape == (0, 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [0, 1])
@pytest.mark.parametrize(
    "lead, out_features, in_features",
    [((), 5, 17), ((1,), 1, 1), ((5,), 33, 17), ((2, 3), 7, 65), ((3, 128), 96, 80), ((1024,), 72, 48)],
    ids=str,
)
def test_linear_weight_grad(lead, out_features, in_features, bias, dtype):
    g = rng()
    grad = round_to(randn(*lead, out_features, gen=g), dtype)
    x = round_to(randn(*lead, in_features, gen=g), dtype)
    dw, db = run("linear_weight_grad", [to_device(grad, dtype), to_device(x, dtype)], [bias])
    g2, x2 = grad.reshape(-1, out_features), x.reshape(-1, in_features)
    rtol, atol = gemm_tol(dtype, g2.shape[0])
    assert_close(dw, g2.T @ x2, dtype, rtol, atol, what=f"dweight {lead} {out_features}x{in_features}")
    if bias:
        assert_close(db, g2.sum(0), dtype, rtol, atol, what=f"dbias {lead} {out_features}")
    else:
        assert db.shape == (0,)


# A kernel built from linear's and gelu_tanh's kernels rounds pre to the 16-bit dtype before the GELU (an epilogue
# does not): up to half an ulp of |pre| more, times |gelu_tanh'| <= 1.13.
_HALF_ULP = {"bfloat16": 2.0**-9, "float16": 2.0**-12}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "x_shape, out_features", [((17,), 8), ((5, 17), 33), ((2, 3, 65), 16), ((4, 9, 128), 64), ((0, 24), 8)], ids=str
)
def test_linear_gelu_tanh(x_shape, out_features, bias, dtype):
    in_features = x_shape[-1]
    inputs, pre_ref = _linear_case(x_shape, out_features, bias, dtype)
    out, pre = run("linear_gelu_tanh", inputs)
    rtol, atol = gemm_tol(dtype, in_features)
    what = f"linear_gelu_tanh {x_shape} -> {out_features} bias={bias}"
    assert_close(pre, pre_ref, dtype, rtol, atol, what=what + " pre")
    extra = 1.13 * _HALF_ULP.get(dtype, 0.0) * float(np.abs(pre_ref).max(initial=0.0))
    assert_close(out, gelu(pre_ref), dtype, rtol, 1.13 * atol + extra, what=what + " out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [0, 1])
@pytest.mark.parametrize(
    "lead, out_features, in_features",
    [((), 5, 8), ((5,), 33, 17), ((2, 3), 7, 64), ((3, 128), 96, 80), ((1024,), 48, 72), ((0,), 4, 8)],
    ids=str,
)
def test_linear_dgelu_tanh(lead, out_features, in_features, bias, dtype):
    g = rng()
    grad = round_to(randn(*lead, out_features, gen=g), dtype)
    w = round_to(randn(out_features, in_features, gen=g), dtype)
    pre = round_to(randn(*lead, in_features, gen=g, scale=2.0), dtype)
    dpre, db = run("linear_dgelu_tanh", [to_device(grad, dtype), to_device(w, dtype), to_device(pre, dtype)], [bias])
    dpre_ref = (grad @ w) * gelu_grad(pre)
    rtol, atol = gemm_tol(dtype, out_features)
    what = f"linear_dgelu_tanh {lead} {out_features}->{in_features}"
    # The product's error times |gelu_tanh'| <= 1.13, plus gelu_tanh_backward's own (relative, as the GELU kernels').
    assert_close(dpre, dpre_ref, dtype, 2 * rtol, 1.13 * atol, what=what + " dpre")
    if bias:
        d2 = dpre_ref.reshape(-1, in_features)
        # A kernel summing the rounded dpre: up to half an ulp of each |dpre| more.
        extra = 2 * _HALF_ULP.get(dtype, 0.0) * float(np.abs(d2).sum(0).max(initial=0.0))
        rtol_b, atol_b = gemm_tol(dtype, d2.shape[0])
        assert_close(db, d2.sum(0), dtype, rtol_b, 1.13 * atol_b * out_features + extra, what=what + " dbias")
    else:
        assert db.shape == (0,)


@pytest.mark.parametrize(
    "op, inputs, attrs, match",
    [
        ("linear_gelu_tanh", lambda: [f32(3, 4), f32(5, 6)], [], "does not match weight"),
        ("linear_gelu_tanh", lambda: [f32(3, 4), f32(5, 4), f32(4)], [], "bias must have shape"),
        ("linear_dgelu_tanh", lambda: [f32(3, 5), f32(5, 6), f32(3, 7)], [0], "do not fit"),
        ("linear_dgelu_tanh", lambda: [f32(3, 4), f32(5, 6), f32(3, 6)], [0], "do not fit"),
        ("linear_dgelu_tanh", lambda: [f32(3, 5), f32(5, 6), f32(2, 6)], [0], "do not fit"),
        ("linear_dgelu_tanh", lambda: [f32(3, 5), f32(5, 6), f32(3, 6)], [2], "bias must be 0 or 1"),
        ("linear_dgelu_tanh", lambda: [f32(3, 5), f32(5, 6), to_device(randn(3, 6), "bfloat16")], [0], "dtype"),
    ],
)
def test_gelu_gemm_errors(op, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), attrs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_weight_grad_without_rows(dtype):
    """No rows: both gradients are zeros of the parameters' shapes (a sum over nothing)."""
    dw, db = run(
        "linear_weight_grad", [to_device(np.zeros((2, 0, 4)), dtype), to_device(np.zeros((2, 0, 3)), dtype)], [1]
    )
    assert_close(dw, np.zeros((4, 3)), dtype, what="dweight of no rows")
    assert_close(db, np.zeros(4), dtype, what="dbias of no rows")


@pytest.mark.parametrize(
    "inputs, attrs, match",
    [
        (lambda: [f32(3, 4), f32(2, 5)], [1], "must share their leading dims"),
        (lambda: [f32(3, 4), f32(3, 1, 5)], [0], "must share their leading dims"),
        (lambda: [f32(3, 4), to_device(randn(3, 5), "bfloat16")], [1], "dtype mismatch"),
        (lambda: [f32(3, 4), f32(3, 5)], [2], "bias must be 0 or 1"),
    ],
)
def test_linear_weight_grad_errors(inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run("linear_weight_grad", inputs(), attrs)


# Significant bits of the 16-bit floats.
_BITS = {"bfloat16": 8, "float16": 11}


def assert_rounded_once(got, ref, acc, dtype, what):
    """A 16-bit result of float32 arithmetic rounded once: within half an ulp of the dtype (at |ref| + acc) plus acc,
    the float32 error bound, elementwise. A second rounding, of an intermediate larger than the result (the product
    before the bias is added, a partial sum), breaks it."""
    got = got.numpy().astype(np.float64)
    mag = np.abs(ref) + acc
    half_ulp = np.exp2(np.floor(np.log2(np.maximum(mag, 2.0**-14))) - _BITS[dtype])
    bad = np.abs(got - ref) > half_ulp + acc
    if bad.any():
        i = tuple(int(j[0]) for j in np.nonzero(bad))
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} elements beyond one rounding; at {i}: got {got[i]!r}, "
            f"exact {ref[i]!r}, bound {half_ulp[i] + acc[i]:.3g}"
        )


# Grid steps and ranges (in steps) of exact_grid's values: 6 and 8 significant bits, inside both 16-bit dtypes.
_GRID = {"bfloat16": (2.0**-2, 32), "float16": (2.0**-5, 128)}


def exact_grid(*shape, dtype, gen):
    """Multiples of a power-of-two step, exact in `dtype`: float32 sums of their products (multiples of step^2) are
    exact while the sum of |products| stays below 2^24 steps^2 (exact_sums checks it), so the only rounding left is
    the one into the output, and products finer than the dtype's ulp make a second rounding show."""
    step, units = _GRID[dtype]
    return np.clip(np.round(gen.standard_normal(shape) / step), -units, units) * step


def exact_sums(abs_sum, dtype):
    step = _GRID[dtype][0]
    assert abs_sum.max() < 2.0**24 * step**2, "inputs too large for exact float32 sums"


# Slack for a few float32 roundings (not K of them: the sums are exact), far below what a second 16-bit rounding
# leaves (up to half an ulp of the dtype at the intermediate).
_F32_SLACK = 4 * 2.0**-24


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("x_shape, out_features", [((36, 128), 65), ((4, 9, 512), 64), ((2, 3), 40)], ids=str)
def test_linear_bias_rounds_once(x_shape, out_features, dtype):
    """The bias joins the float32 product before the one rounding into the 16-bit output (few rows over a long K
    is where a BLAS splits K and may round in between)."""
    g = rng()
    k = x_shape[-1]
    x, w, b = (exact_grid(*s, dtype=dtype, gen=g) for s in (x_shape, (out_features, k), (out_features,)))
    exact_sums(np.abs(x) @ np.abs(w).T + np.abs(b), dtype)
    out = run("linear", [to_device(x, dtype), to_device(w, dtype), to_device(b, dtype)])[0]
    ref = x @ w.T + b
    assert_rounded_once(out, ref, _F32_SLACK * np.abs(ref), dtype, f"linear {x_shape} -> {out_features} with bias")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows, out_features, in_features", [(1024, 72, 48), (4096, 64, 32), (96, 40, 24)], ids=str)
def test_linear_weight_grad_rounds_once(rows, out_features, in_features, dtype):
    g = rng()
    grad, x = exact_grid(rows, out_features, dtype=dtype, gen=g), exact_grid(rows, in_features, dtype=dtype, gen=g)
    exact_sums(np.abs(grad).T @ np.abs(x), dtype)
    dw, db = run("linear_weight_grad", [to_device(grad, dtype), to_device(x, dtype)], [1])
    dw_ref, db_ref = grad.T @ x, grad.sum(0)
    assert_rounded_once(dw, dw_ref, _F32_SLACK * np.abs(dw_ref), dtype, "dweight")
    assert_rounded_once(db, db_ref, _F32_SLACK * np.abs(db_ref), dtype, "dbias")


def f32(*shape):
    return to_device(randn(*shape), "float32")


@pytest.mark.parametrize(
    "inputs, attrs, err, match",
    [
        (lambda: [f32(3, 4), f32(5, 6)], [0, 0], ValueError, "inner dimensions differ"),
        (lambda: [f32(3, 4), f32(3, 6)], [0, 1], ValueError, "inner dimensions differ"),
        (lambda: [f32(4), f32(4, 6)], [0, 0], ValueError, "at least 2-d"),
        (lambda: [f32(2, 3, 4), f32(3, 4, 5)], [0, 0], ValueError, "cannot be broadcast"),
        (
            lambda: [f32(3, 4), to_device(randn(4, 5), "float64")],
            [0, 0],
            ValueError,
            "dtype mismatch",
        ),
        (
            lambda: [to_device(np.ones((3, 4)), "int64"), to_device(np.ones((4, 5)), "int64")],
            [0, 0],
            ValueError,
            "must be float32, bfloat16, float16 or float64",
        ),
        (lambda: [f32(3, 4), f32(4, 5)], [0], ValueError, "expected 2 attribute"),
    ],
)
def test_matmul_errors(inputs, attrs, err, match):
    with pytest.raises(err, match=match):
        run("matmul", inputs(), attrs)


@pytest.mark.parametrize(
    "inputs, match",
    [
        (lambda: [f32(3, 4), f32(5, 6)], "does not match weight"),
        (lambda: [f32(3, 4), f32(4)], "weight must be 2-d"),
        (lambda: [f32(3, 4), f32(5, 4), f32(4)], r"bias must have shape \[5\]"),
        (lambda: [f32(3, 4), to_device(randn(5, 4), "bfloat16")], "dtype mismatch"),
    ],
)
def test_linear_errors(inputs, match):
    with pytest.raises(ValueError, match=match):
        run("linear", inputs())
