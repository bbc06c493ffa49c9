"""Shape ops (permute, slice, slice_backward, concat, stack, split, tril, triu) against NumPy.

These ops only move elements, so results must match the NumPy reference exactly,
in every dtype the schema allows ("all" for all but tril/triu).
"""

import math

import numpy as np
import pytest

from harness import randn, rng, round_to, run, to_device

FLOATS = ("float32", "bfloat16", "float16", "float64")
ALL = ("float32", "bfloat16", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")


def _input(shape, dtype):
    """Random values exactly representable in dtype, as float64 (or bool)."""
    g = rng()
    if dtype == "bool":
        return g.random(shape) < 0.5
    if dtype in ("int64", "int32", "int8"):
        return g.integers(-100, 100, size=shape).astype(np.float64)
    if dtype == "uint8":
        return g.integers(0, 256, size=shape).astype(np.float64)
    return round_to(randn(*shape, gen=g), dtype).reshape(shape)


def check_equal(out, expected, dtype, what=""):
    assert out.dtype == dtype, what
    got = out.numpy()
    assert got.shape == np.shape(expected), f"{what}: shape {got.shape}, expected {np.shape(expected)}"
    np.testing.assert_array_equal(got.astype(np.float64), np.asarray(expected, dtype=np.float64), err_msg=what)


# ---- permute ----


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shape,dims",
    [
        ((2, 3, 4), [2, 0, 1]),
        ((2, 3, 4), [0, 2, 1]),
        ((2, 3, 4), [-1, 0, -2]),
        ((2, 3, 4), [0, 1, 2]),
        ((17, 33), [1, 0]),
        ((2, 3, 5, 7), [0, 2, 1, 3]),
        ((2, 3, 5, 7), [3, 2, 1, 0]),
        ((1, 5, 1, 3), [3, 1, 0, 2]),
        ((3, 0, 2), [2, 1, 0]),
        ((1,), [0]),
        ((), []),
        ((64, 65, 3), [1, 0, 2]),
        # Past the threshold where rows split over threads (>= 2^15 elements), with three or more coalesced dims, so
        # a thread's first row needs its full multi-index: contiguous rows, and strided ones.
        ((32, 33, 5, 7), [2, 0, 1, 3]),
        ((40, 3, 300), [2, 0, 1]),
    ],
)
def test_permute(shape, dims, dtype):
    x = _input(shape, dtype)
    (out,) = run("permute", [to_device(x, dtype)], [dims])
    check_equal(out, np.transpose(x, dims), dtype, f"permute{shape} {dims}")


def test_permute_bad_input():
    x = to_device(randn(2, 3, 4), "float32")
    with pytest.raises(ValueError, match="permute: dims must be a permutation, 1 repeats"):
        run("permute", [x], [[1, -2, 0]])
    with pytest.raises(ValueError, match="permute: dims must list all 3 dimensions"):
        run("permute", [x], [[1, 0]])
    with pytest.raises(ValueError, match="permute: dim 3 out of range"):
        run("permute", [x], [[0, 1, 3]])


# ---- slice / slice_backward ----

SLICES = [
    ((17,), 0, 0, 17, 1),
    ((17,), 0, 3, 11, 2),
    ((17,), 0, -5, -1, 1),
    ((17,), 0, -100, 100, 3),
    ((17,), 0, 10, 3, 1),  # end < start: empty
    ((17,), 0, 17, 20, 1),  # start at the end: empty
    ((17,), 0, 5, 5, 1),
    ((3, 33), 1, 1, -1, 4),
    ((3, 33), -1, -20, 33, 1),
    ((3, 33), 0, 1, 2, 1),
    ((3, 33), -2, -1, 3, 5),
    ((2, 1, 5, 3), 1, 0, 1, 1),
    ((2, 1, 5, 3), 2, 1, 5, 2),
    ((2, 0, 5), 2, 1, 4, 1),  # empty input
    ((2, 0, 5), 1, 0, 3, 1),
    ((65, 700), 1, 3, 650, 2),  # big enough for threads
]


def _slicer(ndim, dim, start, end, step):
    s = [slice(None)] * ndim
    s[dim] = slice(start, end, step)
    return tuple(s)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape,dim,start,end,step", SLICES)
def test_slice(shape, dim, start, end, step, dtype):
    x = _input(shape, dtype)
    (out,) = run("slice", [to_device(x, dtype)], [dim, start, end, step])
    check_equal(out, x[_slicer(len(shape), dim, start, end, step)], dtype, f"slice{shape} {dim} {start}:{end}:{step}")


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape,dim,start,end,step", SLICES)
def test_slice_backward(shape, dim, start, end, step, dtype):
    sl = _slicer(len(shape), dim, start, end, step)
    g = _input(np.zeros(shape)[sl].shape, dtype)
    (dx,) = run("slice_backward", [to_device(g, dtype)], [list(shape), dim, start, end, step])
    expected = np.zeros(shape, dtype=g.dtype)
    expected[sl] = g
    check_equal(dx, expected, dtype, f"slice_backward{shape} {dim} {start}:{end}:{step}")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_slice_backward_is_adjoint(dtype):
    # slice is linear, so <slice(x), g> == <x, slice_backward(g)> (the exact finite-difference check).
    x, shape = randn(4, 9, 5), [4, 9, 5]
    (y,) = run("slice", [to_device(x, dtype)], [1, -7, 8, 3])
    g = randn(*y.shape)
    (dx,) = run("slice_backward", [to_device(g, dtype)], [shape, 1, -7, 8, 3])
    x, g = round_to(x, dtype), round_to(g, dtype)
    # Both sides hold the same products (and zeros): fsum's exact sums are equal, where np.sum's pairwise order
    # differs between the 40 and 180 terms and a sum near 0 broke rtol=1e-12 about 1 run in 10^4.
    assert math.fsum((y.numpy() * g).ravel()) == math.fsum((x * dx.numpy()).ravel())


def test_slice_bad_input():
    x = to_device(randn(3, 4), "float32")
    with pytest.raises(ValueError, match="slice: step must be positive, got 0"):
        run("slice", [x], [0, 0, 2, 0])
    with pytest.raises(ValueError, match="slice: step must be positive, got -1"):
        run("slice", [x], [0, 0, 2, -1])
    with pytest.raises(ValueError, match="slice: dim 2 out of range"):
        run("slice", [x], [2, 0, 2, 1])
    with pytest.raises(ValueError, match=r"slice_backward: grad \[3, 4\] must have shape \[3, 2\]"):
        run("slice_backward", [x], [[3, 4], 1, 0, 2, 1])
    with pytest.raises(ValueError, match="slice_backward: dim -3 out of range"):
        run("slice_backward", [x], [[3, 4], -3, 0, 2, 1])


# ---- concat / stack / split ----


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shapes,dim",
    [
        ([(3,), (5,)], 0),
        ([(2, 3), (2, 17), (2, 1)], 1),
        ([(2, 3), (2, 17), (2, 1)], -1),
        ([(2, 3), (1, 3), (4, 3)], 0),
        ([(2, 0, 4), (2, 3, 4), (2, 0, 4)], 1),  # empty pieces
        ([(2, 0, 4), (2, 0, 4)], 1),  # empty result
        ([(2, 3, 33), (2, 3, 33)], -1),
        ([(3, 4)], 0),  # a single input
        ([(1, 1, 1), (1, 1, 1), (1, 1, 1)], 2),
        ([(300, 65), (300, 3), (300, 64)], 1),  # big enough for threads
    ],
)
def test_concat(shapes, dim, dtype):
    xs = [_input(s, dtype) for s in shapes]
    (out,) = run("concat", [to_device(x, dtype) for x in xs], [dim])
    check_equal(out, np.concatenate(xs, axis=dim), dtype, f"concat {shapes} {dim}")


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shape,n,dim",
    [((3,), 2, 0), ((3,), 2, 1), ((3,), 2, -1), ((2, 17), 3, 1), ((2, 17), 3, -3), ((2, 0, 3), 2, 1), ((), 4, 0)],
)
def test_stack(shape, n, dim, dtype):
    xs = [_input(shape, dtype) for _ in range(n)]
    (out,) = run("stack", [to_device(x, dtype) for x in xs], [dim])
    check_equal(out, np.stack(xs, axis=dim), dtype, f"stack {shape} x{n} {dim}")


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize(
    "shape,dim,sizes",
    [
        ((8,), 0, [3, 5]),
        ((2, 17), 1, [1, 0, 16]),
        ((2, 17), -1, [17]),
        ((6, 3), 0, [2, 2, 2]),
        ((2, 0, 4), 1, [0, 0]),
        ((2, 5, 4), 2, [0, 4, 0]),
        ((3, 33, 2), -2, [10, 23]),
        ((300, 132), 1, [65, 3, 64]),  # big enough for threads
    ],
)
def test_split(shape, dim, sizes, dtype):
    x = _input(shape, dtype)
    outs = run("split", [to_device(x, dtype)], [dim, sizes])
    expected = np.split(x, np.cumsum(sizes)[:-1], axis=dim)
    assert len(outs) == len(sizes)
    for k, (o, e) in enumerate(zip(outs, expected, strict=True)):
        check_equal(o, e, dtype, f"split{shape} {dim} {sizes} piece {k}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_split_concat_roundtrip(dtype):
    # split and concat are each other's backward.
    x = _input((4, 19, 3), dtype)
    pieces = run("split", [to_device(x, dtype)], [1, [5, 0, 14]])
    (back,) = run("concat", pieces, [1])
    check_equal(back, x, dtype)


def test_concat_stack_split_bad_input():
    a, b = to_device(randn(2, 3), "float32"), to_device(randn(2, 4), "float32")
    with pytest.raises(ValueError, match=r"concat: shapes \[2, 3\] and \[2, 4\] differ outside dim 0"):
        run("concat", [a, b], [0])
    with pytest.raises(ValueError, match="concat: all inputs must have the same number of dimensions"):
        run("concat", [a, to_device(randn(2, 3, 1), "float32")], [1])
    with pytest.raises(ValueError, match="concat: dtype mismatch: float32 and float64"):
        run("concat", [a, to_device(randn(2, 3), "float64")], [0])
    with pytest.raises(ValueError, match="concat: dim 2 out of range"):
        run("concat", [a, a], [2])
    with pytest.raises(ValueError, match="concat: .*0-d"):
        run("concat", [to_device(np.float64(1.0), "float32")], [0])
    with pytest.raises(ValueError, match=r"concat: expected inputs \(xs\.\.\.\), got 0"):
        run("concat", [], [0])
    with pytest.raises(ValueError, match=r"stack: stacked tensors: shapes \[2, 3\] and \[2, 4\] must be equal"):
        run("stack", [a, b], [0])
    with pytest.raises(ValueError, match="stack: dim 3 out of range"):
        run("stack", [a, a], [3])
    with pytest.raises(ValueError, match="split: sizes sum to 4 but dim 1 has 3"):
        run("split", [a], [1, [2, 2]])
    with pytest.raises(ValueError, match="split: sizes must be >= 0"):
        run("split", [a], [1, [4, -1]])
    with pytest.raises(ValueError, match="split: dim -3 out of range"):
        run("split", [a], [-3, [2]])


# ---- tril / triu ----


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op,ref", [("tril", np.tril), ("triu", np.triu)])
@pytest.mark.parametrize(
    "shape", [(3, 3), (4, 7), (7, 4), (2, 5, 5), (2, 3, 5, 2), (1, 1), (0, 3), (3, 0), (2, 65, 33)]
)
@pytest.mark.parametrize("k", [0, 1, -1, 2, -3, 100, -100])
def test_tril_triu(op, ref, shape, k, dtype):
    x = _input(shape, dtype)
    (out,) = run(op, [to_device(x, dtype)], [k])
    check_equal(out, ref(x, k), dtype, f"{op}{shape} k={k}")


@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tril_triu_bad_input(op):
    with pytest.raises(ValueError, match=f"{op}: .*x must be at least 2-d"):
        run(op, [to_device(randn(5), "float32")], [0])
    with pytest.raises(ValueError, match=f"{op}: .*x must be float32, bfloat16, float16 or float64, got int64"):
        run(op, [to_device(np.ones((2, 2)), "int64")], [0])
