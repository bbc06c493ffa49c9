"""Reductions (sum, mean, amax, argmax, sum_squares) against float64 NumPy on dtype-rounded inputs."""

import warnings

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")

# (shape, dims): all dims, one dim, negative dims, adjacent and non-adjacent sets,
# size-1 dims, 0-d tensors, sizes that are not multiples of 32.
CASES = [
    ((17,), []),
    ((17,), [0]),
    ((3, 17), [1]),
    ((3, 17), [0]),
    ((3, 17), [-1]),
    ((3, 17), [0, 1]),
    ((2, 3, 33), [0, 2]),
    ((2, 3, 33), [-1, 0]),
    ((2, 3, 33), [1]),
    ((2, 3, 5, 7), [1, 3]),
    ((2, 3, 5, 7), [0, 2, 3]),
    ((2, 3, 5, 7), [3, 1, 0]),
    ((4, 1, 5), [1]),
    ((4, 1, 5), [0, 1]),
    ((1, 65, 1), [0, 2]),
    ((65, 33), []),
    ((), []),
    ((1, 1), []),
    ((300, 257), [0]),  # several column chunks, threads
    ((40000,), []),  # long reduction cut into pieces
    ((20000, 3), [0]),
]


def _axis(dims):
    return None if not dims else tuple(dims)


def _input(shape, dtype):
    return round_to(randn(*shape), dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dims", CASES)
@pytest.mark.parametrize("keepdim", [0, 1])
@pytest.mark.parametrize("op,ref", [("sum", np.sum), ("mean", np.mean), ("amax", np.max)])
def test_reduce(op, ref, shape, dims, keepdim, dtype):
    x = _input(shape, dtype)
    (out,) = run(op, [to_device(x, dtype)], [dims, keepdim])
    assert out.dtype == dtype
    expected = np.asarray(ref(x, axis=_axis(dims), keepdims=bool(keepdim)))
    assert_close(out, expected, dtype, what=f"{op}{shape} dims={dims} keepdim={keepdim}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [0, 1])
@pytest.mark.parametrize("shape,dims", [((3, 0, 4), [1]), ((3, 0, 4), [0, 1]), ((0,), []), ((3, 0, 4), [0])])
def test_sum_mean_empty(shape, dims, keepdim, dtype):
    x = np.zeros(shape)
    for op, ref in (("sum", np.sum), ("mean", np.mean)):
        (out,) = run(op, [to_device(x, dtype)], [dims, keepdim])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = np.asarray(ref(x, axis=_axis(dims), keepdims=bool(keepdim)))
        got = out.numpy().astype(np.float64)
        assert got.shape == expected.shape
        # The sum of nothing is 0 and the mean of nothing is NaN (0/0), as in NumPy.
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_mean_accumulate_in_double(dtype):
    # Many same-sign values: float32 accumulation would drift past rtol 1.3e-6.
    scale = 0.1 if dtype == "float16" else 1.0  # sums within float16's range (65504)
    x = round_to(rng().uniform(0.5, 1.5, size=(3, 40001, 2)) * scale, dtype)
    for op, ref in (("sum", np.sum), ("mean", np.mean)):
        for dims in ([], [1], [0, 1]):
            (out,) = run(op, [to_device(x, dtype)], [dims, 0])
            assert_close(out, ref(x, axis=_axis(dims)), dtype, what=f"{op} dims={dims}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [[], [1], [0, 2]])
def test_amax_nan_propagates(dims, dtype):
    x = _input((3, 4, 5), dtype)
    x[1, 2, 3] = np.nan
    (out,) = run("amax", [to_device(x, dtype)], [dims, 0])
    expected = np.max(x, axis=_axis(dims))
    got = out.numpy().astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    ok = ~np.isnan(expected)
    assert_close(got[ok], expected[ok], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [0, 1])
@pytest.mark.parametrize(
    "shape,dim",
    [
        ((17,), 0),
        ((3, 17), 1),
        ((3, 17), 0),
        ((3, 17), -1),
        ((2, 3, 33), 1),
        ((2, 1, 5), 1),
        ((1, 1), 0),
        ((300, 257), 0),
    ],
)
def test_argmax(shape, dim, keepdim, dtype):
    g = rng()
    # Small integers: exact in every dtype and full of ties, so "first max wins" is exercised.
    x = g.integers(-3, 4, size=shape).astype(np.float64)
    (out,) = run("argmax", [to_device(x, dtype)], [dim, keepdim])
    assert out.dtype == "int64"
    np.testing.assert_array_equal(out.numpy(), np.argmax(x, axis=dim, keepdims=bool(keepdim)))
    x = _input(shape, dtype)
    (out,) = run("argmax", [to_device(x, dtype)], [dim, keepdim])
    np.testing.assert_array_equal(out.numpy(), np.argmax(x, axis=dim, keepdims=bool(keepdim)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_nan_is_max(dtype):
    x = _input((4, 6), dtype)
    x[1, 4] = np.nan
    x[1, 5] = np.nan
    x[2, 0] = np.nan
    (out,) = run("argmax", [to_device(x, dtype)], [1, 0])
    np.testing.assert_array_equal(out.numpy(), np.argmax(x, axis=1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (17,), (3, 33), (2, 3, 65), (0, 4), (70001,)])
def test_sum_squares(shape, dtype):
    x = _input(shape, dtype)
    (out,) = run("sum_squares", [to_device(x, dtype)])
    out_dtype = "float64" if dtype == "float64" else "float32"
    assert out.dtype == out_dtype and out.shape == ()
    # The result is float32 even for bfloat16 input, so float32's tolerance applies.
    assert_close(out, np.sum(x * x), out_dtype, what=f"sum_squares{shape}")


@pytest.mark.parametrize("op", ["sum", "mean", "amax"])
def test_reduce_bad_input(op):
    x = to_device(randn(2, 3, 4), "float32")
    with pytest.raises(ValueError, match=rf"{op}: dim -2 repeated in dims"):
        run(op, [x], [[1, -2], 0])
    with pytest.raises(ValueError, match=rf"{op}: dim 3 out of range for a 3-d tensor"):
        run(op, [x], [[3], 0])
    with pytest.raises(ValueError, match=rf"{op}: dim -4 out of range"):
        run(op, [x], [[0, -4], 1])
    with pytest.raises(ValueError, match=rf"{op}: x must be float32, bfloat16, float16 or float64, got int64"):
        run(op, [to_device(np.ones((2, 3)), "int64")], [[], 0])
    with pytest.raises(ValueError, match=rf"{op}: expected 2 attribute"):
        run(op, [x], [[0]])


def test_reduce_bad_input_other():
    x = to_device(randn(2, 3), "float32")
    with pytest.raises(ValueError, match="amax: cannot take the max over an empty dimension"):
        run("amax", [to_device(np.zeros((2, 0)), "float32")], [[], 0])
    with pytest.raises(ValueError, match="argmax: dim 2 out of range"):
        run("argmax", [x], [2, 0])
    with pytest.raises(ValueError, match="argmax: cannot take argmax over an empty dimension"):
        run("argmax", [to_device(np.zeros((2, 0)), "float32")], [-1, 0])
    with pytest.raises(ValueError, match="argmax: x must be float32"):
        run("argmax", [to_device(np.ones(3), "int32")], [0, 0])
    with pytest.raises(ValueError, match="sum_squares: x must be float32"):
        run("sum_squares", [to_device(np.ones(3), "int64")])
