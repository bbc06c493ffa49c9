"""cumsum and sort against float64 NumPy on dtype-rounded inputs: every dim, both directions, rows short and long
(the GPU kernels' tiled and global-memory paths), ties (which keep their order) and NaN (the largest value)."""

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")

SCAN_CASES = [
    ((17,), 0),
    ((3, 17), 1),
    ((3, 17), 0),
    ((2, 3, 33), 1),
    ((2, 3, 33), -1),
    ((4, 1, 5), 1),
    ((5, 5000), 1),  # rows longer than one tile
    ((3000, 2), 0),  # long columns
    ((0, 4), 1),
    ((2, 0, 3), 1),
]


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("shape, dim", SCAN_CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cumsum(dtype, shape, dim, reverse):
    x = round_to(randn(*shape), dtype)
    (out,) = run("cumsum", [to_device(x, dtype)], [dim, reverse])
    flip = (lambda a: np.flip(a, dim)) if reverse else (lambda a: a)
    expected = flip(np.cumsum(flip(x), axis=dim))
    # 16-bit: each prefix rounds once from a float32 sum; the prefix of n values of size ~1 grows like sqrt(n), and
    # float32 accumulation adds up to n * 2^-24 of the largest partial sum.
    atol = 1e-5 if dtype in ("float32", "float64") else 1e-5 + shape[dim] * 2.0**-24 * np.abs(expected).max(initial=0)
    assert_close(out, expected, dtype, atol=atol, what=f"cumsum {shape} dim {dim}")


def _sort_ref(x, descending):
    keys = np.where(np.isnan(x), np.inf, x)
    rank = np.where(np.isnan(x), 1, 0)  # NaN after +inf ascending
    order = np.lexsort((rank, keys), axis=-1) if not descending else None
    if descending:
        order = np.lexsort((-rank, -keys), axis=-1)
    return np.take_along_axis(x, order, -1), order


SORT_SHAPES = [(1,), (17,), (3, 17), (2, 3, 64), (4, 1000), (2, 4097), (3, 70000), (0, 5), (5, 0)]


@pytest.mark.parametrize("descending", [0, 1])
@pytest.mark.parametrize("shape", SORT_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sort(dtype, shape, descending):
    g = rng()
    x = round_to(np.round(g.standard_normal(shape) * 4) / 4, dtype)  # many ties
    if x.size > 3:
        x.flat[g.integers(0, x.size, 3)] = [np.nan, np.inf, -np.inf]
    values, indices = run("sort", [to_device(x, dtype)], [descending])
    want_v, want_i = _sort_ref(x, descending)
    assert indices.dtype == "int64" and values.dtype == dtype
    np.testing.assert_array_equal(indices.numpy(), want_i)
    np.testing.assert_array_equal(values.numpy().astype(np.float64), want_v)


def test_sort_rejects_0d_and_ints():
    with pytest.raises(ValueError, match="sort"):
        run("sort", [to_device(np.array(1.0), "float32").reshape([])], [0])
    with pytest.raises(ValueError, match="sort"):
        run("sort", [to_device(np.arange(3), "int64")], [0])


def test_cumsum_rejects_bad_dim():
    with pytest.raises((ValueError, IndexError), match="cumsum"):
        run("cumsum", [to_device(randn(3, 4), "float32")], [2, 0])
