"""Counter-based random ops: normal_, uniform_, dropout, dropout_backward.

Besides statistics, the tests rebuild the documented formula (infinitrain/kernels/cpu/random.cc)
in NumPy: every device must reproduce uniform_ and the dropout mask bit for bit.
"""

import math

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")
N = 100_000

# ---- the documented formula, in NumPy (uint64 array arithmetic wraps mod 2^64) ----

_M64 = (1 << 64) - 1
_G = 0x9E3779B97F4A7C15


def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _bits(seed, stream, offset, n):
    key = _mix64(np.array([(seed + (stream + 1) * _G) & _M64], dtype=np.uint64))[0]
    ctr = np.uint64(offset & _M64) + np.arange(n, dtype=np.uint64)
    return _mix64(key + ctr * np.uint64(_G))


def _u(seed, offset, n, dtype, stream=0):
    b = _bits(seed, stream, offset, n)
    if dtype == "float64":
        return (b >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (b >> np.uint64(40)).astype(np.float64) * 2.0**-24


def _round_exact(v, dtype):
    """Rounds float64 values once (nearest even) to dtype; harness.round_to goes through float32 for bf16."""
    v = np.asarray(v, dtype=np.float64)
    if dtype == "float32":
        return v.astype(np.float32).astype(np.float64)
    if dtype == "bfloat16":
        m, e = np.frexp(v)  # v = m * 2^e, 0.5 <= |m| < 1: keep 8 significant bits
        return np.ldexp(np.rint(m * 256.0), e - 8)
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float64)  # NumPy rounds float64 to float16 once
    return v


def _nan_tensor(n, dtype):
    # In-place ops are not poisoned by the dispatcher: start from NaN so unwritten elements show.
    return to_device(np.full(n, np.nan), dtype)


# ---- far-tail bounds ----------------------------------------------------------------------------------
# Each statistical check fails a correct kernel with probability below DELTA (rigorous bounds for the exact
# distributions; the dtype's rounding moves them by far less than the bounds' width). With about 150 checks per
# run, a false failure is rarer than 1 in 10^6 runs.
DELTA = 1e-9
_L = math.log(2 / DELTA)


def _kl(q, p):
    """KL divergence between Bernoulli(q) and Bernoulli(p)."""
    out = 0.0
    if q > 0:
        out += q * math.log(q / p)
    if q < 1:
        out += (1 - q) * math.log((1 - q) / (1 - p))
    return out


def binomial_interval(n, p):
    """[lo, hi] holding a Binomial(n, p) frequency but with probability < DELTA (Chernoff: P(X/n >= q) <=
    exp(-n KL(q || p)) above p, likewise below)."""

    if p in (0.0, 1.0):
        return p, p  # certain
    lo, hi = [0.0, p], [p, 1.0]  # bisect each side for n KL(q || p) = L
    for _ in range(100):
        mid = sum(lo) / 2
        lo[n * _kl(mid, p) <= _L] = mid
        mid = sum(hi) / 2
        hi[n * _kl(mid, p) > _L] = mid
    return lo[0], hi[1]


def _check_fraction(hits, n, p, what):
    lo, hi = binomial_interval(n, p)
    assert lo <= hits / n <= hi, f"{what}: {hits / n} outside [{lo}, {hi}] (p = {p})"


def _bernstein(n, var, bound):
    """t with P(|mean of n - mu| >= t) < DELTA for independent values of variance var within bound of mu."""
    a = 2 * bound * _L / 3
    return (a + math.sqrt(a * a + 8 * n * var * _L)) / (2 * n)


def _check_uniform_moments(x, low, high, what):
    n, w = x.size, high - low
    mu = (low + high) / 2
    assert abs(x.mean() - mu) < _bernstein(n, w * w / 12, w / 2), f"{what}: mean {x.mean()} vs {mu}"
    # (x - mu)^2 lies in [0, w^2/4] with mean w^2/12 and variance w^4/180.
    sq = ((x - mu) ** 2).mean()
    assert abs(sq - w * w / 12) < _bernstein(n, w**4 / 180, w * w / 6), f"{what}: variance {sq} vs {w * w / 12}"


def _check_normal_moments(x, mean, std, what):
    n = x.size
    z = 6.2  # erfc(6.2 / sqrt(2)) = 5.6e-10: the sample mean of normals is exactly normal
    assert abs(x.mean() - mean) < z * std / math.sqrt(n), f"{what}: mean {x.mean()} vs {mean}"
    # sum ((x - mean) / std)^2 is chi-square with n degrees (Laurent and Massart's tail bounds).
    chi2 = float((((x - mean) / std) ** 2).sum())
    assert n - 2 * math.sqrt(n * _L) <= chi2 <= n + 2 * math.sqrt(n * _L) + 2 * _L, f"{what}: chi2 {chi2} ({n} dof)"


# ---- uniform_ -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-2.0, 3.0), (5, 6)])
def test_uniform_statistics(dtype, low, high):
    if dtype == "bfloat16" and low == 5:
        pytest.skip("bfloat16's grid in [4, 8) is 1/32: too coarse for moment tests (the formula test covers it)")
    seed = int(rng().integers(0, 2**62))
    x = _nan_tensor(N, dtype)
    assert run("uniform_", [x], [low, high, seed, 0]) == []
    v = x.numpy().astype(np.float64)
    assert np.isfinite(v).all()
    # Closed at high: rounding to the dtype may land on it (documented).
    assert v.min() >= low and v.max() <= high
    _check_uniform_moments(v, low, high, "uniform_")
    # Equidistribution over 10 bins (bfloat16's and float16's grids do not align with the bins).
    if dtype in ("bfloat16", "float16"):
        return
    for k, count in enumerate(np.histogram(v, bins=10, range=(low, high))[0]):
        _check_fraction(count, N, 0.1, f"uniform_ bin {k}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_uniform_matches_formula(dtype):
    gen = rng()
    seed = int(gen.integers(0, 2**63))
    offset = int(gen.integers(0, 2**40))
    # Large enough that bfloat16 meets the ~5 in 10^6 values where rounding through float32 would be off.
    n = 400_003
    x = _nan_tensor(n, dtype)
    run("uniform_", [x], [-2.0, 3.0, seed, offset])
    expected = _round_exact(-2.0 + 5.0 * _u(seed, offset, n, dtype), dtype)
    np.testing.assert_array_equal(x.numpy().astype(np.float64), expected)


def test_uniform_offset_wraps():
    # offset + i passes 2^63 (and wraps as uint64) without trouble.
    x = _nan_tensor(64, "float64")
    offset = 2**63 - 10
    run("uniform_", [x], [0.0, 1.0, 7, offset])
    np.testing.assert_array_equal(x.numpy(), _u(7, offset, 64, "float64"))


# ---- normal_ --------------------------------------------------------------------------


def _normal_ref(seed, offset, n, mean, std):
    a = 1.0 - _u(seed, offset, n, "float64", stream=1)
    t = _u(seed, offset, n, "float64", stream=2)
    return mean + std * (np.sqrt(-2.0 * np.log(a)) * np.cos(2.0 * np.pi * t))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (0.5, 2.0), (-3, 0.02)])
def test_normal_statistics(dtype, mean, std):
    if dtype in ("bfloat16", "float16") and std < 0.1:
        # The grid near 3 (1/64, 1/512) is 78% and 10% of std: rounding shifts P(|z| < k) past any bound.
        pytest.skip(f"{dtype}'s grid near 3 is too coarse next to std {std}: the formula test covers it")
    seed = int(rng().integers(0, 2**62))
    x = _nan_tensor(N, dtype)
    assert run("normal_", [x], [mean, std, seed, 12345]) == []
    v = x.numpy().astype(np.float64)
    assert np.isfinite(v).all()
    _check_normal_moments(v, mean, std, "normal_")
    # Shape of the distribution: P(|z| < 1) = 0.6827, P(|z| < 2) = 0.9545.
    z = np.abs(v - mean) / std
    for k in (1, 2):
        _check_fraction(int((z < k).sum()), N, math.erf(k / math.sqrt(2)), f"P(|z| < {k})")


@pytest.mark.parametrize("dtype", DTYPES)
def test_normal_matches_formula(dtype):
    gen = rng()
    seed, offset = int(gen.integers(0, 2**63)), int(gen.integers(0, 2**40))
    x = _nan_tensor(5003, dtype)
    run("normal_", [x], [0.25, 1.5, seed, offset])
    expected = _normal_ref(seed, offset, 5003, 0.25, 1.5)
    # log/cos may differ in the last double bit between libms, so not bit for bit:
    # float64 to a few ulps, float32/bfloat16 to one ulp of the dtype.
    rtol = {"float64": 1e-13, "float32": 2**-23, "bfloat16": 2**-7, "float16": 2**-10}[dtype]
    # Below 2**-14 float16 is subnormal, with a fixed spacing of 2**-24: one ulp there is absolute.
    atol = 2**-24 if dtype == "float16" else 1e-12
    assert_close(x, expected, dtype, rtol=rtol, atol=atol, what="normal_")


# ---- properties shared by the generators ----------------------------------------------

GENERATORS = {"uniform_": [-1.0, 2.0], "normal_": [0.0, 1.0]}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_counter_properties(op, dtype):
    params = GENERATORS[op]
    n, k, seed, offset = 70_001, 12_345, int(rng().integers(0, 2**62)), 1000

    def draw(count, off, s=seed):
        x = _nan_tensor(count, dtype)
        run(op, [x], params + [s, off])
        return x.numpy()

    whole = draw(n, offset)
    # Same (seed, offset): identical output.
    np.testing.assert_array_equal(draw(n, offset), whole)
    # The range [offset, offset + n) is the concatenation of its pieces, whatever the thread split.
    np.testing.assert_array_equal(np.concatenate([draw(k, offset), draw(n - k, offset + k)]), whole)
    np.testing.assert_array_equal(draw(1, offset + 777), whole[777:778])
    # A shifted offset shifts the sequence, and is a different draw.
    shifted = draw(n, offset + 1)
    np.testing.assert_array_equal(shifted[:-1], whole[1:])
    assert np.mean(shifted != whole) > 0.9
    # A different seed is a different draw.
    assert np.mean(draw(n, offset, seed + 1) != whole) > 0.9


def test_generator_shapes():
    # Works on any shape (element i counts in row-major order) and on empty tensors.
    for op in GENERATORS:
        x = to_device(np.full((3, 0, 2), np.nan), "float32")
        run(op, [x], GENERATORS[op] + [1, 0])
        a = to_device(np.full((4, 17, 3), np.nan), "float32")
        run(op, [a], GENERATORS[op] + [1, 5])
        b = _nan_tensor(4 * 17 * 3, "float32")
        run(op, [b], GENERATORS[op] + [1, 5])
        np.testing.assert_array_equal(a.numpy().ravel(), b.numpy())


def test_generator_errors():
    with pytest.raises(ValueError, match="normal_: x must be float32, bfloat16, float16 or float64, got int64"):
        run("normal_", [to_device(np.zeros(3), "int64")], [0.0, 1.0, 0, 0])
    with pytest.raises(ValueError, match=r"uniform_: expected 4 attribute\(s\)"):
        run("uniform_", [_nan_tensor(3, "float32")], [0.0, 1.0, 0])
    with pytest.raises(ValueError, match="uniform_: attribute 'seed' must be an int"):
        run("uniform_", [_nan_tensor(3, "float32")], [0.0, 1.0, 0.5, 0])
    with pytest.raises(ValueError, match="normal_: attribute 'std' must be a float"):
        run("normal_", [_nan_tensor(3, "float32")], [0.0, "one", 0, 0])


# ---- dropout ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout(dtype, p):
    gen = rng()
    seed, offset = int(gen.integers(0, 2**62)), int(gen.integers(0, 2**40))
    x = round_to(randn(N, gen=gen), dtype)
    out, mask = run(
        "dropout",
        [
            to_device(x, dtype),
        ],
        [p, seed, offset],
    )
    assert out.dtype == dtype and mask.dtype == "bool"
    m = mask.numpy()
    assert set(np.unique(m.view(np.uint8))) <= {0, 1}
    bits = 53 if dtype == "float64" else 24  # u is on a grid of 2^-bits: P(u >= p) exactly
    _check_fraction(int(m.sum()), N, 1 - math.ceil(p * 2**bits) / 2**bits, "keep fraction")
    # The mask is the documented formula, bit for bit.
    np.testing.assert_array_equal(m, _u(seed, offset, N, dtype) >= p)
    # out == x * mask / (1 - p), rounded once to the dtype.
    expected = _round_exact(x * np.where(m, 1.0 / (1.0 - p), 0.0), dtype)
    assert_close(out, expected, dtype, rtol=0, atol=0, what="dropout out")
    if p == 0.0:
        np.testing.assert_array_equal(out.numpy(), x)


def test_dropout_mask_is_uniform_threshold():
    # mask[i] = U(seed, offset + i) >= p with U exactly what uniform_(0, 1) writes.
    for dtype in DTYPES:
        u = _nan_tensor(3001, dtype)
        run("uniform_", [u], [0.0, 1.0, 99, 5])
        _, mask = run("dropout", [to_device(np.ones(3001), dtype)], [0.3, 99, 5])
        np.testing.assert_array_equal(mask.numpy(), u.numpy() >= 0.3)


def test_dropout_shapes_and_split():
    # 2-d input counts in row-major order; the two halves with shifted offsets give the same mask.
    x = randn(64, 33)
    _, mask = run("dropout", [to_device(x, "float32")], [0.5, 3, 10])
    _, top = run("dropout", [to_device(x[:20], "float32")], [0.5, 3, 10])
    _, bottom = run("dropout", [to_device(x[20:], "float32")], [0.5, 3, 10 + 20 * 33])
    np.testing.assert_array_equal(mask.numpy(), np.concatenate([top.numpy(), bottom.numpy()]))
    out, mask = run("dropout", [to_device(np.zeros((0, 5)), "float32")], [0.5, 3, 0])
    assert out.shape == (0, 5) and mask.shape == (0, 5)


@pytest.mark.parametrize("shape", [(1,), (17, 33), (2, 3, 65), (0, 4), (N,)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.25, 0.8])
def test_dropout_backward(dtype, p, shape):
    gen = rng()
    g = round_to(randn(*shape, gen=gen), dtype).reshape(shape)
    mask = gen.random(shape) < 0.6
    (dx,) = run("dropout_backward", [to_device(g, dtype), to_device(mask, "bool")], [p])
    assert dx.dtype == dtype
    assert_close(dx, g * mask / (1.0 - p), dtype, what="dropout_backward")


def test_dropout_backward_matches_forward():
    # Dropout is linear in x: its backward applies the same mask and scale.
    x = randn(999)
    g = randn(999)
    out, mask = run("dropout", [to_device(x, "float64")], [0.3, 11, 0])
    (dx,) = run("dropout_backward", [to_device(g, "float64"), mask], [0.3])
    m = mask.numpy()
    assert_close(out, x * m / 0.7, "float64")
    assert_close(dx, g * m / 0.7, "float64")


def test_dropout_errors():
    x = to_device(randn(5), "float32")
    for p in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\)"):
            run("dropout", [x], [p, 0, 0])
    with pytest.raises(ValueError, match=r"dropout_backward: p must be in \[0, 1\)"):
        run("dropout_backward", [x, to_device(np.ones(5, bool), "bool")], [1.0])
    with pytest.raises(ValueError, match="dropout_backward: mask must be bool, got float32"):
        run("dropout_backward", [x, x], [0.5])
    with pytest.raises(ValueError, match=r"dropout_backward: grad and mask: shapes \[5\] and \[4\] must be equal"):
        run("dropout_backward", [x, to_device(np.ones(4, bool), "bool")], [0.5])
    with pytest.raises(ValueError, match="dropout: x must be float32, bfloat16, float16 or float64, got int32"):
        run("dropout", [to_device(np.arange(5), "int32")], [0.5, 0, 0])


@pytest.mark.parametrize(
    "op,attrs,message",
    [
        ("normal_", [0.0, 1.0, -1, 0], "seed must be >= 0"),
        ("normal_", [0.0, -1.0, 1, 0], "std must be >= 0"),
        ("uniform_", [1.0, 0.0, 1, 0], "low must be <= high"),
        ("uniform_", [0.0, 1.0, 1, -5], "offset must be >= 0"),
        ("dropout", [0.5, 1.5, 0], "attribute 'seed' must be an int"),
    ],
)
def test_random_attribute_errors(op, attrs, message):
    x = to_device(np.ones(4), "float32")
    with pytest.raises(ValueError, match=message):
        run(op, [x], attrs)


def test_dropout_backward_rejects_bad_p():
    g = to_device(np.ones(4), "float32")
    m = to_device(np.ones(4, dtype=bool), "bool")
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        run("dropout_backward", [g, m], [1.0])
