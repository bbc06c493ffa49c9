"""matmul and linear CPU kernels against float64 NumPy products of the dtype-rounded inputs."""

import numpy as np
import pytest

from harness import TOL, assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")


def gemm_tol(dtype, k):
    """float32 sgemm accumulates K products in float: the absolute error grows about linearly in K (measured
    worst ~7e-6 at K=128 for N(0,1) inputs), so beyond K=64 the absolute bound scales with K/64."""
    rtol, atol = TOL[dtype]
    if dtype == "float32" and k > 64:
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "x_shape, out_features",
    [((17,), 5), ((1, 1), 1), ((5, 17), 33), ((2, 3, 65), 7), ((4, 9, 128), 65)],
    ids=str,
)
def test_linear(x_shape, out_features, bias, dtype):
    g = rng()
    in_features = x_shape[-1]
    x = round_to(randn(*x_shape, gen=g), dtype)
    w = round_to(randn(out_features, in_features, gen=g), dtype)
    inputs = [to_device(x, dtype), to_device(w, dtype)]
    ref = x @ w.T
    if bias:
        bvec = round_to(randn(out_features, gen=g), dtype)
        inputs.append(to_device(bvec, dtype))
        ref = ref + bvec
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
