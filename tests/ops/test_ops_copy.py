"""cast, copy_ and fill_ against NumPy conversions, across every dtype pair."""

import numpy as np
import pytest

from harness import DEVICE, assert_close, rng, round_to, run, to_device
from infinitrain import _C

ALL = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
CARRIER = {"bfloat16": np.float32}


def sample(dtype, shape):
    g = rng()
    if dtype == "bool":
        return g.random(shape) > 0.5
    if dtype == "uint8":
        return g.integers(0, 256, shape)
    if dtype == "int8":
        return g.integers(-128, 128, shape)
    if dtype in ("int32", "int64"):
        return g.integers(-1000, 1000, shape)
    return round_to(g.standard_normal(shape) * 10, dtype)


def expected(values, src, dst):
    """NumPy's conversion of `values` (exact in src) to dst; floats to ints truncate toward zero."""
    v = np.asarray(values, dtype=np.float64)
    if dst == "bool":
        return v != 0
    if dst in ("uint8", "int8", "int32", "int64"):
        return np.trunc(v)
    return round_to(v, dst)


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("dst", ALL)
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 17), (2, 3, 33)])
def test_cast(src, dst, shape):
    vals = sample(src, shape)
    if dst in ("uint8", "int8") and src not in ("bool", dst):
        vals = np.clip(vals, 0 if dst == "uint8" else -128, 127)
        vals = vals.astype(CARRIER.get(src, src)).astype(np.float64) if src != "bool" else vals
    x = to_device(vals, src)
    out = run("cast", [x], [dst])[0]
    assert out.dtype == dst and out.shape == shape
    got = out.numpy()
    np.testing.assert_array_equal(got.astype(np.float64), expected(x.numpy(), src, dst).astype(np.float64))


@pytest.mark.parametrize("dtype", ALL)
def test_copy_converts_in_place(dtype):
    src = rng().standard_normal((5, 7)) * 10
    if dtype == "uint8":
        src = np.abs(src)  # a negative float has no uint8 value
    dst = to_device(sample(dtype, (5, 7)), dtype)
    run("copy_", [dst, to_device(src, "float64")])
    assert_close(dst, expected(src, "float64", dtype), "float64", rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ALL)
def test_fill(dtype):
    x = to_device(sample(dtype, (4, 9)), dtype)
    value = 1.0 if dtype == "bool" else 7.0
    run("fill_", [x], [value])
    np.testing.assert_array_equal(x.numpy().astype(np.float64), np.full((4, 9), value))


def test_bad_input():
    x = to_device(rng().standard_normal((2, 3)), "float32")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        run("cast", [x], ["float8"])
    with pytest.raises(ValueError, match="copy_: dst and src: shapes"):
        run("copy_", [x, to_device(np.ones((3, 2)), "float32")])
    with pytest.raises(ValueError, match="fill_: expected 1 attribute"):
        run("fill_", [x], [])
    with pytest.raises(ValueError, match="attribute 'value' must be a float"):
        run("fill_", [x], ["one"])


def test_poisoned_outputs_are_overwritten():
    # The harness poisons outputs; a cast to float32 of finite input must contain no NaN.
    out = run("cast", [to_device(rng().standard_normal(100), "float64")], ["float32"])[0]
    assert np.isfinite(out.numpy()).all()
    assert out.device == _C.parse_device(DEVICE)


def test_float64_to_float16_rounds_once_like_numpy():
    g = rng()
    edges = np.array(
        [
            65519.99999,
            65520.0,
            -65520.0,
            65504.0,
            1 + 2.0**-11 + 2.0**-40,
            2.0**-25,
            2.0**-24 * 1.5,
            6.1e-5,
            -0.0,
            np.inf,
            -np.inf,
        ]
    )
    vals = np.concatenate([edges, g.standard_normal(20000) * 10.0 ** g.uniform(-8, 5, 20000)])
    x = to_device(vals, "float64")
    got = run("cast", [x], ["float16"])[0].numpy()
    with np.errstate(over="ignore"):  # the overflow to inf is part of what is checked
        want = vals.astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
