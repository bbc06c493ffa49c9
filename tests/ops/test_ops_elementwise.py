"""Elementwise ops: unary math and its backward kernels, affine/pow_scalar/clamp, broadcasting
binary arithmetic and comparisons, where, masked_fill, axpy_ and swiglu, against float64 NumPy
references computed from the dtype-rounded inputs."""

import math
import os

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")
K0, K1 = np.sqrt(2.0 / np.pi), 0.044715


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # no overflow in the tails
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(K0 * (x + K1 * x**3)))


def _gelu_grad(x):
    t = np.tanh(K0 * (x + K1 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K0 * (1.0 + 3.0 * K1 * x * x)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _normal_cdf(x):
    return 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-x / math.sqrt(2.0))


def _gelu_exact_grad(x):
    return _normal_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _silu_grad(x):
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


# name -> (float64 reference, input domain)
UNARY = {
    "neg": (np.negative, "any"),
    "exp": (np.exp, "any"),
    "log": (np.log, "pos"),
    "sqrt": (np.sqrt, "pos"),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), "pos"),
    "abs": (np.abs, "any"),
    "sin": (np.sin, "any"),
    "cos": (np.cos, "any"),
    "tanh": (np.tanh, "any"),
    "sigmoid": (_sigmoid, "any"),
    "relu": (lambda x: np.maximum(x, 0.0), "any"),
    "silu": (lambda x: x * _sigmoid(x), "any"),
    "gelu_tanh": (_gelu, "any"),
    "gelu": (lambda x: x * _normal_cdf(x), "any"),
    "erf": (_erf, "any"),
    "log1p": (np.log1p, "above-1"),
    "expm1": (np.expm1, "any"),
    "floor": (np.floor, "any"),
    "ceil": (np.ceil, "any"),
    "round": (np.round, "any"),  # halves to even on both sides
    "trunc": (np.trunc, "any"),
    "sign": (np.sign, "any"),
}
SHAPES = [(), (1,), (3,), (17, 33), (2, 1, 65), (0, 3), (40001,)]


def _input(domain, shape, dtype, gen=None):
    gen = gen or rng()
    if domain == "above-1":
        return _round(gen.uniform(-0.99, 4.0, shape), dtype)
    x = np.exp(randn(*shape, gen=gen)) if domain == "pos" else randn(*shape, gen=gen, scale=2.0)
    return _round(x, dtype)


def _round(x, dtype):
    # harness.round_to and to_device go through np.ascontiguousarray, which turns 0-d into 1-d.
    x = np.asarray(x, dtype=np.float64)
    return round_to(x, dtype).reshape(x.shape)


def _tensor(x, dtype):
    x = np.asarray(x)
    return to_device(x, dtype).reshape(list(x.shape))


# ---- unary -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, dtype, shape):
    ref, domain = UNARY[op]
    x = _input(domain, shape, dtype)
    (out,) = run(op, [_tensor(x, dtype)])
    assert out.dtype == dtype
    assert_close(out, ref(x), dtype, what=op)


@pytest.mark.parametrize("op", ["sigmoid", "silu", "gelu_tanh", "gelu", "erf", "tanh", "exp"])
def test_unary_tails(op):
    # Large |x|: the stable forms must neither overflow to NaN nor lose the small left tails.
    x = np.array([-200.0, -80.0, -30.0, -9.0, -3.0, 3.0, 9.0, 30.0, 80.0])
    if op == "exp":
        x = x[(x > -80) & (x < 80)]
    for dtype in DTYPES:
        xr = _round(x, dtype)
        (out,) = run(op, [_tensor(xr, dtype)])
        with np.errstate(over="ignore"):  # float16's exp(30) is inf, as rounding says
            assert_close(out, _round(UNARY[op][0](xr), dtype), dtype, what=f"{op} {dtype}")


def test_unary_nan_propagates():
    x = np.array([np.nan, 1.0, -1.0])
    for op in ("neg", "exp", "abs", "tanh", "sigmoid", "relu", "silu", "gelu_tanh", "gelu", "erf", "sign", "floor"):
        (out,) = run(op, [_tensor(x, "float32")])
        assert np.isnan(out.numpy()[0]), op


@pytest.mark.parametrize("dtype", DTYPES)
def test_affine(dtype):
    x = _input("any", (5, 33), dtype)
    for scale, bias in [(0.5, -1.25), (3, 2), (-1.0, 0.0)]:
        (out,) = run("affine", [_tensor(x, dtype)], [scale, bias])
        assert_close(out, x * scale + bias, dtype, what=f"affine {scale} {bias}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exponent", [2.0, 3, 0.5, -1.5, 1.7, 0.0])
def test_pow_scalar(dtype, exponent):
    integral = float(exponent).is_integer()
    x = _input("any" if integral else "pos", (7, 65), dtype)
    (out,) = run("pow_scalar", [_tensor(x, dtype)], [exponent])
    assert_close(out, np.power(x, float(exponent)), dtype, what=f"pow {exponent}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp(dtype):
    x = _input("any", (3, 17), dtype)
    x.flat[0] = np.nan
    for low, high in [(-1.0, 1.0), (0, 0), (-0.5, 10.0)]:
        (out,) = run("clamp", [_tensor(x, dtype)], [low, high])
        expected = np.where(np.isnan(x), np.nan, np.minimum(np.maximum(x, low), high))
        assert_close(out, expected, dtype, what=f"clamp {low} {high}")


# ---- unary backward ------------------------------------------------------------------

# name -> (forward op, takes forward output (True) or input (False), d forward / dx as a function of x)
UNARY_BW = {
    "tanh_backward": ("tanh", True, lambda x: 1.0 - np.tanh(x) ** 2),
    "sigmoid_backward": ("sigmoid", True, lambda x: _sigmoid(x) * (1.0 - _sigmoid(x))),
    "relu_backward": ("relu", False, lambda x: (x > 0).astype(np.float64)),
    "silu_backward": ("silu", False, _silu_grad),
    "gelu_tanh_backward": ("gelu_tanh", False, _gelu_grad),
    "gelu_backward": ("gelu", False, _gelu_exact_grad),
}


@pytest.mark.parametrize("shape", [(1,), (17, 33), (2, 1, 65), (0, 5), (40001,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(UNARY_BW))
def test_unary_backward(op, dtype, shape):
    fwd, from_out, _ = UNARY_BW[op]
    x = _input("any", shape, dtype)
    g = _input("any", shape, dtype)
    if from_out:
        y = _round(UNARY[fwd][0](x), dtype)  # the saved forward output, as stored
        expected = g * (1.0 - y * y) if fwd == "tanh" else g * y * (1.0 - y)
        first = y
    else:
        expected = g * UNARY_BW[op][2](x)
        first = x
    (dx,) = run(op, [_tensor(first, dtype), _tensor(g, dtype)])
    assert dx.dtype == dtype
    assert_close(dx, expected, dtype, what=op)


@pytest.mark.parametrize("op", sorted(UNARY_BW))
def test_unary_backward_finite_difference(op):
    # float64: the backward kernel agrees with central differences of the forward kernel.
    fwd, from_out, _ = UNARY_BW[op]
    gen = rng()
    x = randn(31, gen=gen, scale=2.0)
    x = np.where(np.abs(x) < 1e-3, 0.5, x)  # keep relu away from its kink
    g = randn(31, gen=gen)
    h = 1e-6
    f = lambda v: run(fwd, [_tensor(v, "float64")])[0].numpy()  # noqa: E731
    fd = g * (f(x + h) - f(x - h)) / (2 * h)
    first = f(x) if from_out else x
    (dx,) = run(op, [_tensor(first, "float64"), _tensor(g, "float64")])
    assert_close(dx, fd, "float64", rtol=1e-6, atol=1e-8, what=op)  # finite-difference error ~1e-9


@pytest.mark.parametrize("op", ["silu_backward", "gelu_tanh_backward", "gelu_backward"])
def test_unary_backward_tails(op):
    # Saturated tails: x^2 may overflow in float32, the derivative must still be 0 or 1, not NaN.
    for dtype in DTYPES:
        big = min(1e20, float(np.finfo(np.float16).max) if dtype == "float16" else 1e20)  # finite in the dtype
        xr = _round(np.array([-big, -50.0, -10.0, 10.0, 50.0, big]), dtype)
        (dx,) = run(op, [_tensor(xr, dtype), _tensor(np.ones(6), dtype)])
        assert_close(dx, UNARY_BW[op][2](xr), dtype, what=f"{op} {dtype}")


def test_relu_backward_at_zero():
    x = np.array([0.0, -0.0, 1e-30, -1e-30])
    (dx,) = run("relu_backward", [_tensor(x, "float32"), _tensor(np.ones(4), "float32")])
    np.testing.assert_array_equal(dx.numpy(), [0.0, 0.0, 1.0, 0.0])


# ---- binary with broadcasting ------------------------------------------------------------

BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
    "fmod": np.fmod,
    "remainder": lambda a, b: np.where(
        (np.fmod(a, b) != 0) & ((np.fmod(a, b) < 0) != (b < 0)), np.fmod(a, b) + b, np.fmod(a, b)
    ),
    "atan2": np.arctan2,
}
BCAST = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 3, 4)),
    ((2, 1, 4), (3, 1)),
    ((1,), (5,)),
    ((), (3,)),
    ((), ()),
    ((17, 1, 33), (1, 65, 1)),
    ((5, 1, 3, 1), (1, 7, 1, 2)),
    ((0, 3), (1, 3)),
    ((2, 0, 3), (3,)),
    ((20001,), ()),  # one long row, split into parallel blocks
    ((301, 200), (301, 1)),  # many rows across threads: odometer restarts mid-tensor
    ((6, 1, 64, 70), (1, 9, 64, 1)),
]


def _operand(shape, op, dtype, gen):
    if op in ("div", "fmod", "remainder"):  # keep |b| away from 0
        v = gen.uniform(0.5, 2.0, shape) * gen.choice([-1.0, 1.0], shape)
        return _round(np.asarray(v, dtype=np.float64), dtype)
    return _round(randn(*shape, gen=gen), dtype)


@pytest.mark.parametrize("shapes", BCAST, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op, dtype, shapes):
    gen = rng()
    a = _round(randn(*shapes[0], gen=gen, scale=3.0 if op in ("fmod", "remainder") else 1.0), dtype)
    if op == "pow":  # a positive base of modest size: every power finite in float16
        a = _round(gen.uniform(0.5, 2.0, shapes[0]), dtype)
    b = _operand(shapes[1], op, dtype, gen)
    (out,) = run(op, [_tensor(a, dtype), _tensor(b, dtype)])
    expected = BINARY[op](a, b)
    assert out.shape == expected.shape and out.dtype == dtype
    assert_close(out, expected, dtype, what=op)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_maximum_minimum_nan(op, dtype):
    a = np.array([np.nan, 1.0, np.nan, -2.0, 3.0])
    b = np.array([0.0, np.nan, np.nan, 5.0, -1.0])
    (out,) = run(op, [_tensor(a, dtype), _tensor(b, dtype)])
    assert_close(out, BINARY[op](a, b), dtype, what=op)
    assert np.isnan(out.numpy()[:3]).all()


# ---- comparisons -------------------------------------------------------------------------

COMPARE = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _cmp_operands(dtype, shapes, gen):
    if dtype.startswith("int"):
        a = gen.integers(-3, 4, shapes[0]).astype(dtype)
        b = gen.integers(-3, 4, shapes[1]).astype(dtype)
        return a, b
    a = _round(np.round(randn(*shapes[0], gen=gen) * 2) / 2, dtype)  # coarse grid: many ties
    b = _round(np.round(randn(*shapes[1], gen=gen) * 2) / 2, dtype)
    if a.size > 1:
        a.flat[1] = np.nan
    return a, b


def _check_bool(out, expected):
    assert out.dtype == "bool"
    got = out.numpy()
    assert got.shape == expected.shape
    # Raw bytes must be exactly 0/1 (poisoned outputs hold 0xFF).
    np.testing.assert_array_equal(got.view(np.uint8), expected.astype(np.uint8))


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 17), (3, 1)), ((), (5,)), ((0, 2), (2,))], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", sorted(COMPARE))
def test_compare(op, dtype, shapes):
    a, b = _cmp_operands(dtype, shapes, rng())
    (out,) = run(op, [_tensor(a, dtype), _tensor(b, dtype)])
    _check_bool(out, COMPARE[op](a, b))


def test_compare_int64_exact():
    # 2^53 + 1 and 2^53 are equal as doubles; int64 must compare exactly.
    a = np.array([2**53 + 1, -(2**62), 7], dtype=np.int64)
    b = np.array([2**53, -(2**62) + 1, 7], dtype=np.int64)
    for op, ref in COMPARE.items():
        (out,) = run(op, [to_device(a, "int64"), to_device(b, "int64")])
        _check_bool(out, ref(a, b))


# ---- where, masked_fill ---------------------------------------------------------------------

WHERE_SHAPES = [
    ((3, 4), (3, 4), (3, 4)),
    ((3, 1), (1, 4), (3, 4)),
    ((2, 3, 17), (), (17,)),
    ((), (2, 5), (5,)),
    ((4, 1, 1), (1, 3, 1), (1, 1, 33)),
    ((0, 3), (3,), ()),
    ((300, 1), (300, 200), (1,)),
]


@pytest.mark.parametrize("shapes", WHERE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_where(dtype, shapes):
    gen = rng()
    cond = gen.random(shapes[0]) < 0.5
    a = _round(randn(*shapes[1], gen=gen), dtype)
    b = _round(randn(*shapes[2], gen=gen), dtype)
    (out,) = run("where", [_tensor(cond, "bool"), _tensor(a, dtype), _tensor(b, dtype)])
    assert_close(out, np.where(cond, a, b), dtype, rtol=0, atol=0, what="where")  # a pure select: exact


@pytest.mark.parametrize("mask_shape", [(2, 3, 33), (3, 1), (33,), (), (1, 1, 1), (2, 1, 33)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_fill(dtype, mask_shape):
    gen = rng()
    x = _round(randn(2, 3, 33, gen=gen), dtype)
    mask = gen.random(mask_shape) < 0.5
    for value in (-3.5, -1e4, -np.inf):
        (out,) = run("masked_fill", [_tensor(x, dtype), _tensor(mask, "bool")], [value])
        expected = np.where(mask, _round(np.float64(value), dtype), x)
        assert_close(out, expected, dtype, rtol=0, atol=0, what=f"masked_fill {value}")  # exact select


def test_masked_fill_empty():
    (out,) = run("masked_fill", [_tensor(np.zeros((0, 4)), "float32"), to_device(np.ones(4, bool), "bool")], [1.0])
    assert out.shape == (0, 4)


# ---- axpy_, swiglu ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (17, 33), (0,), (40001,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_axpy(dtype, shape):
    gen = rng()
    y = _round(randn(*shape, gen=gen), dtype)
    x = _round(randn(*shape, gen=gen), dtype)
    yt = _tensor(y, dtype)
    for alpha in (0.75, -2):
        assert run("axpy_", [yt, _tensor(x, dtype)], [alpha]) == []
        expected = y + alpha * x
        assert_close(yt, expected, dtype, what=f"axpy_ alpha={alpha}")
        y = _round(expected, dtype)


@pytest.mark.parametrize("shape", [(1,), (4, 33), (2, 3, 65), (0, 7), (40001,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype, shape):
    gen = rng()
    g = _round(randn(*shape, gen=gen, scale=2.0), dtype)
    u = _round(randn(*shape, gen=gen), dtype)
    d = _round(randn(*shape, gen=gen), dtype)
    (out,) = run("swiglu", [_tensor(g, dtype), _tensor(u, dtype)])
    assert_close(out, g * _sigmoid(g) * u, dtype, what="swiglu")
    dgate, dup = run("swiglu_backward", [_tensor(g, dtype), _tensor(u, dtype), _tensor(d, dtype)])
    assert_close(dgate, d * u * _silu_grad(g), dtype, what="swiglu dgate")
    assert_close(dup, d * g * _sigmoid(g), dtype, what="swiglu dup")


def test_swiglu_backward_finite_difference():
    gen = rng()
    g, u, d = (randn(23, gen=gen) for _ in range(3))
    h = 1e-6
    f = lambda gg, uu: run("swiglu", [_tensor(gg, "float64"), _tensor(uu, "float64")])[0].numpy()  # noqa: E731
    dgate, dup = run("swiglu_backward", [_tensor(g, "float64"), _tensor(u, "float64"), _tensor(d, "float64")])
    # Elementwise, so perturbing every element at once gives each element's own derivative.
    assert_close(dgate, d * (f(g + h, u) - f(g - h, u)) / (2 * h), "float64", rtol=1e-6, atol=1e-8, what="dgate")
    assert_close(dup, d * (f(g, u + h) - f(g, u - h)) / (2 * h), "float64", rtol=1e-6, atol=1e-8, what="dup")


# ---- bad inputs ----------------------------------------------------------------------------


def _f32(*shape):
    return _tensor(randn(*shape), "float32")


@pytest.mark.parametrize("op", ["exp", "relu", "gelu_tanh"])
def test_unary_rejects_int(op):
    with pytest.raises(ValueError, match=f"{op}: .*must be float32, bfloat16, float16 or float64, got int32"):
        run(op, [to_device(np.arange(3), "int32")])


def test_binary_errors():
    with pytest.raises(ValueError, match=r"add: .*shapes \[3, 4\] and \[5\] cannot be broadcast"):
        run("add", [_f32(3, 4), _f32(5)])
    with pytest.raises(ValueError, match="mul: .*dtype mismatch: float32 and float64"):
        run("mul", [_f32(3), _tensor(randn(3), "float64")])
    with pytest.raises(ValueError, match="div: .*must be float32, bfloat16, float16 or float64"):
        run("div", [to_device(np.arange(3), "int64"), to_device(np.arange(3), "int64")])


def test_compare_errors():
    with pytest.raises(ValueError, match="lt: .*dtype mismatch"):
        run("lt", [_f32(3), to_device(np.arange(3), "int32")])
    with pytest.raises(ValueError, match="eq: a must be float32, bfloat16, float16, float64, int32 or int64, got bool"):
        run("eq", [to_device(np.ones(3, bool), "bool"), to_device(np.ones(3, bool), "bool")])
    with pytest.raises(ValueError, match="ge: .*cannot be broadcast"):
        run("ge", [_f32(2, 3), _f32(2)])


def test_unary_backward_errors():
    with pytest.raises(ValueError, match=r"silu_backward: .*shapes \[3\] and \[4\] must be equal"):
        run("silu_backward", [_f32(3), _f32(4)])
    with pytest.raises(ValueError, match="tanh_backward: .*dtype mismatch"):
        run("tanh_backward", [_f32(3), _tensor(randn(3), "bfloat16")])


def test_where_masked_fill_errors():
    with pytest.raises(ValueError, match="where: cond must be bool, got float32"):
        run("where", [_f32(3), _f32(3), _f32(3)])
    with pytest.raises(ValueError, match="where: .*cannot be broadcast"):
        run("where", [to_device(np.ones(4, bool), "bool"), _f32(3), _f32(3)])
    with pytest.raises(ValueError, match=r"masked_fill: mask \[3, 4\] must broadcast to x \[3, 1\]"):
        run("masked_fill", [_f32(3, 1), to_device(np.ones((3, 4), bool), "bool")], [0.0])
    with pytest.raises(ValueError, match="masked_fill: mask must be bool, got float32"):
        run("masked_fill", [_f32(3), _f32(3)], [0.0])


def test_scalar_op_errors():
    with pytest.raises(ValueError, match="clamp: low must be <= high"):
        run("clamp", [_f32(3)], [1.0, -1.0])
    with pytest.raises(ValueError, match="affine: attribute 'scale' must be a float"):
        run("affine", [_f32(3)], ["x", 1.0])
    with pytest.raises(ValueError, match=r"axpy_: y and x: shapes \[3\] and \[4\] must be equal"):
        run("axpy_", [_f32(3), _f32(4)], [1.0])
    with pytest.raises(ValueError, match=r"swiglu: gate and up: shapes \[2, 3\] and \[3, 2\] must be equal"):
        run("swiglu", [_f32(2, 3), _f32(3, 2)])
    with pytest.raises(ValueError, match="swiglu_backward: .*dtype mismatch"):
        run("swiglu_backward", [_f32(3), _f32(3), _tensor(randn(3), "float64")])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="counts threads through /proc (Linux)")
def test_openmp_runs_the_requested_threads():
    """The thread-count targets (tests/BUILD.bazel) really run their count: a large op starts that many OpenMP
    threads, which stay alive."""
    want = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    x = _tensor(randn(1 << 20), "float32")
    run("add", [x, x])
    with open("/proc/self/status") as f:
        threads = int(next(line for line in f if line.startswith("Threads:")).split()[1])
    assert threads >= want, (threads, want)
