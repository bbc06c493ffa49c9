"""FP8: the float8 dtypes' rounding, fp8_quantize, fp8_matmul and the Fp8Linear layer, against float64 references
built here from the formats' definitions (every code decoded by its bit fields; rounding as the nearest code, ties
to the even code), on fresh random inputs."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng, run
from infinitrain import fp8, nn

FORMATS = {"float8_e4m3fn": (4, 3, 7), "float8_e5m2": (5, 2, 15)}  # exponent bits, mantissa bits, bias
FMAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def decode(code, fmt):
    """The value of an 8-bit code, from its sign, exponent and mantissa fields."""
    ebits, mbits, bias = FORMATS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
    if fmt == "float8_e4m3fn" and e == 15 and m == 7:
        return np.nan
    if fmt == "float8_e5m2" and e == 31:
        return np.nan if m else sign * np.inf
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2**mbits) * 2.0 ** (e - bias)


def finite_grid(fmt):
    """(non-negative finite values ascending, their codes)."""
    codes = [c for c in range(128) if np.isfinite(decode(c, fmt))]
    return np.array([decode(c, fmt) for c in codes]), np.array(codes)


def nearest(v, fmt):
    """v (float64) rounded to the format as a cast does: nearest code, ties to the even code; past the largest
    finite value by half its step or more (ties included when the even neighbour would be past it): NaN for
    e4m3fn, infinity for e5m2."""
    vals, codes = finite_grid(fmt)
    top = vals[-1]
    step_top = top - vals[-2]
    mag = np.abs(v)
    i = np.clip(np.searchsorted(vals, mag), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick_hi = (mag - lo > hi - mag) | ((mag - lo == hi - mag) & (codes[i] % 2 == 0))
    r = np.where(pick_hi, hi, lo)
    r = np.where(mag <= vals[0], 0.0, r)
    # Beyond the top: the next step up (not representable) is nearer, or a tie with top's odd code.
    over = (mag > top + step_top / 2) | ((mag == top + step_top / 2) & (codes[-1] % 2 == 1))
    r = np.where(over, np.inf if fmt == "float8_e5m2" else np.nan, r)
    r = np.where(np.isnan(v), np.nan, r)
    return np.copysign(r, v)


def same(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.all((a == b) | (np.isnan(a) & np.isnan(b)))


@pytest.fixture(params=sorted(FORMATS))
def fmt(request):
    return request.param


@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_every_code_round_trips(dtype):
    """Each finite code, cast to float32 (and float64, bfloat16 where exact) and back, is itself with its defined
    value."""
    want = np.array([decode(c, dtype) for c in range(256)])
    finite = want[np.isfinite(want)]
    t = it.tensor(finite.astype(np.float32), device=DEVICE).to(dtype)
    for wide in ("float32", "float64"):
        back = it.Tensor(run("cast", [t._t], [wide])[0])
        assert back.dtype == wide and same(back.cpu().numpy(), finite)
        assert same(it.Tensor(run("cast", [back._t], [dtype])[0]).float().cpu().numpy(), finite)


def test_cast_rounds_to_nearest_even(fmt):
    """Random values over the whole range (subnormals, normals, past the top), the midpoints between neighbouring
    codes (ties) and just beside them, and NaN / infinities, against the nearest-code reference."""
    g = rng()
    vals, _ = finite_grid(fmt)
    mids = (vals[1:] + vals[:-1]) / 2
    beside = np.concatenate([mids * (1 + 2.0**-20), mids * (1 - 2.0**-20)])
    spread = np.exp(g.uniform(np.log(vals[1] / 4), np.log(FMAX[fmt] * 1.2), 20000))
    x = np.concatenate([spread, mids, beside, [0.0, np.inf, np.nan, FMAX[fmt] * 4]])
    x = (x * g.choice([-1.0, 1.0], x.size)).astype(np.float32).astype(np.float64)
    got = it.tensor(x.astype(np.float32), device=DEVICE).to(fmt).float().cpu().numpy()
    want = nearest(x, fmt)
    bad = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])


def test_bfloat16_and_float64_cast_alike(fmt):
    """The cast from bfloat16 and float64 (values exact in float32) gives the float32 cast's codes."""
    x = (rng().standard_normal(4096) * 50).astype(np.float32)
    want = it.tensor(x, device=DEVICE).to(fmt).float().cpu().numpy()
    for dt in ("float64",):
        got = it.tensor(x.astype(np.float64), dtype=dt, device=DEVICE).to(fmt).float().cpu().numpy()
        assert same(got, want)
    xb = it.tensor(x, device=DEVICE).to("bfloat16")
    assert same(xb.to(fmt).float().cpu().numpy(), nearest(xb.float().cpu().numpy().astype(np.float64), fmt))


def _quantize(x, scale, fmt):
    out, amax = run("fp8_quantize", [x._t, it.tensor(np.float32(scale), device=DEVICE)._t], [fmt])
    return it.Tensor(out), it.Tensor(amax)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_quantize_saturates_and_reports_amax(fmt, dtype):
    """x * scale (in float32) clamped to +-max before rounding, so nothing overflows; amax is max |x| (not of the
    scaled values)."""
    g = rng()
    scale = float(g.choice([1.0, 3.25, 2.0**-5, 1000.0]))
    x = it.tensor((g.standard_normal((7, 33)) * 40).astype(np.float32), device=DEVICE).to(dtype)
    xs = x.float().cpu().numpy().astype(np.float64)
    out, amax = (
        it.Tensor(t) for t in run("fp8_quantize", [x._t, it.tensor(np.float32(scale), device=DEVICE)._t], [fmt])
    )
    assert out.dtype == fmt and out.shape == (7, 33) and amax.dtype == "float32" and amax.shape == ()
    scaled = (xs.astype(np.float32) * np.float32(scale)).astype(np.float64)
    want = nearest(np.clip(scaled, -FMAX[fmt], FMAX[fmt]), fmt)
    assert same(out.float().cpu().numpy(), want)
    assert np.isfinite(out.float().cpu().numpy()).all()
    assert float(amax.item()) == np.float32(np.abs(xs).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantize_every_path_rounds_like_the_reference(fmt, dtype):
    """Ties between codes, values beside them, subnormals, signed zeros and values past the top, scaled by a power of
    two: the codes (value and sign) of a long tensor whose size and alignment allow wide loads (a GPU's vector
    kernel), and of an unaligned view of it with an odd size (the one-element kernel), match the reference."""
    g = rng()
    vals, _ = finite_grid(fmt)
    mids = (vals[1:] + vals[:-1]) / 2
    beside = np.concatenate([mids * (1 + 2.0**-20), mids * (1 - 2.0**-20)])
    spread = np.exp(g.uniform(np.log(vals[1] / 4), np.log(FMAX[fmt] * 2), 40000))
    x = np.concatenate([spread, mids, beside, vals, [0.0, vals[1] / 2, vals[1] / 3, np.inf, FMAX[fmt] * 4]])
    x = x * g.choice([-1.0, 1.0], x.size)
    x = g.permutation(np.concatenate([x, np.zeros(-x.size % 64)]))  # a multiple of 8 elements
    scale = 2.0 ** int(g.integers(-3, 4))
    full = it.tensor((x / scale).astype(np.float32), device=DEVICE).to(dtype)
    for t in (full, full[1:]):  # full[1:]: odd length, 2 or 4 bytes past an aligned start
        xs = t.float().cpu().numpy().astype(np.float64)
        out, amax = _quantize(t, scale, fmt)
        got = out.float().cpu().numpy()
        want = nearest(np.clip(xs * scale, -FMAX[fmt], FMAX[fmt]), fmt)
        bad = ~same_each(got, want) | (np.signbit(got) != np.signbit(want))
        assert not bad.any(), (xs[bad][:5], got[bad][:5], want[bad][:5])
        assert float(amax.item()) == np.abs(xs).max()


def same_each(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a == b) | (np.isnan(a) & np.isnan(b))


def test_quantize_nan_stays_nan_and_wins_amax(fmt):
    x = np.array([1.0, np.nan, -3.0, 2.0e6], dtype=np.float32)
    out, amax = _quantize(it.tensor(x, device=DEVICE), 1.0, fmt)
    got = out.float().cpu().numpy()
    assert np.isnan(got[1]) and got[3] == FMAX[fmt] and np.isnan(float(amax.item()))


def _emulated(a8, b8, a_inv, b_inv, ta, tb, bias):
    a = a8.T if ta else a8
    b = b8.T if tb else b8
    out = (a @ b) * (np.float64(np.float32(a_inv)) * np.float64(np.float32(b_inv)))
    return out + bias if bias is not None else out


@pytest.mark.parametrize("ta,tb", [(0, 1), (0, 0), (1, 1), (1, 0)])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("dtype", sorted(FORMATS))
def test_matmul_against_float64(ta, tb, out_dtype, dtype):
    """Shapes FP8 tensor cores take (multiples of 16) in every layout, an e4m3 a times a b in `dtype`, with and
    without a bias: out equals the float64 product of the float8 values, scaled, to the output dtype's rounding
    (the float32 accumulation of small integers is exact)."""
    g = rng()
    # Up to 208: several of a GPU transpose's 64 x 64 tiles, partial ones at the edges.
    m, k, n = 16 * int(g.integers(1, 14)), 16 * int(g.integers(1, 14)), 16 * int(g.integers(1, 14))
    for b_fmt in (dtype,):
        a = np.round(g.standard_normal((k, m) if ta else (m, k)) * 6)
        b = np.round(g.standard_normal((n, k) if tb else (k, n)) * 6)
        a8 = it.tensor(a.astype(np.float32), device=DEVICE).to("float8_e4m3fn")
        b8 = it.tensor(b.astype(np.float32), device=DEVICE).to(b_fmt)
        a_inv, b_inv = float(g.choice([1.0, 0.125, 1 / 3])), float(g.choice([1.0, 0.5, 1 / 7]))
        for with_bias in (False, True):
            bias = it.tensor(g.standard_normal(n).astype(np.float32), device=DEVICE).to(out_dtype)
            ins = [a8, b8, it.tensor(np.float32(a_inv), device=DEVICE), it.tensor(np.float32(b_inv), device=DEVICE)]
            ins = [t._t for t in ins + ([bias] if with_bias else [])]
            out = it.Tensor(run("fp8_matmul", ins, [ta, tb, out_dtype])[0])
            assert out.dtype == out_dtype and out.shape == (m, n)
            bias_v = bias.float().cpu().numpy().astype(np.float64) if with_bias else None
            want = _emulated(
                a8.float().cpu().numpy().astype(np.float64),
                b8.float().cpu().numpy().astype(np.float64),
                a_inv,
                b_inv,
                ta,
                tb,
                bias_v,
            )
            rtol = 1e-5 if out_dtype == "float32" else 2.0**-8
            np.testing.assert_allclose(out.float().cpu().numpy(), want, rtol=rtol, atol=1e-5 * np.abs(want).max())


def test_matmul_refusals():
    a = it.tensor(np.ones((16, 16), np.float32), device=DEVICE)
    e5 = a.to("float8_e5m2")
    one = it.tensor(np.float32(1.0), device=DEVICE)
    with pytest.raises(ValueError, match="cannot both be float8_e5m2"):
        it.dispatch.call("fp8_matmul", [e5, e5, one, one], [0, 1, "float32"])
    with pytest.raises(ValueError, match="inner dimensions"):
        it.dispatch.call("fp8_matmul", [a.to("float8_e4m3fn"), a[:8].to("float8_e5m2"), one, one], [0, 0, "float32"])
    with pytest.raises(ValueError, match="float8"):
        it.dispatch.call("fp8_matmul", [a, a, one, one], [0, 1, "float32"])
    for arithmetic in (lambda t: t + t, lambda t: t * 2, lambda t: t.sum()):
        with pytest.raises(TypeError, match="float8_e5m2 tensors hold FP8 GEMM operands"):
            arithmetic(e5)


def test_linear_forward_backward_against_emulation():
    """Fp8Linear's output and gradients equal float64 products of the float8 values its scales give (x, weight
    e4m3; the output gradient e5m2), scaled back; the bias gradient is the plain sum."""
    g = rng()
    lin = nn.Linear(32, 48).to(DEVICE)
    layer = fp8.Fp8Linear.from_linear(lin, fp8.Recipe(scaling="current"))
    xv = (g.standard_normal((3, 5, 32)) * 2).astype(np.float32)
    x = it.tensor(xv, device=DEVICE, requires_grad=True)
    gv = g.standard_normal((3, 5, 48)).astype(np.float32)
    out = layer(x)
    out.backward(it.tensor(gv, device=DEVICE))

    def q(v, fmt):
        v = v.astype(np.float32).astype(np.float64)
        s = np.float32(FMAX[fmt] / np.float32(np.abs(v).max()))
        return nearest(np.clip((v.astype(np.float32) * s).astype(np.float64), -FMAX[fmt], FMAX[fmt]), fmt), s

    w = lin.weight.detach().cpu().numpy()
    x8, sx = q(xv.reshape(15, 32), "float8_e4m3fn")
    w8, sw = q(w, "float8_e4m3fn")
    g8, sg = q(gv.reshape(15, 48), "float8_e5m2")
    inv = lambda s: np.float64(np.float32(1.0) / s)  # noqa: E731
    want = (x8 @ w8.T) * inv(sx) * inv(sw) + lin.bias.detach().cpu().numpy()
    np.testing.assert_allclose(out.detach().cpu().numpy().reshape(15, 48), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        x.grad.cpu().numpy().reshape(15, 32), (g8 @ w8) * inv(sg) * inv(sw), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(lin.weight.grad.cpu().numpy(), (g8.T @ x8) * inv(sg) * inv(sx), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(lin.bias.grad.cpu().numpy(), gv.reshape(15, 48).sum(0), rtol=1e-5, atol=1e-5)


def test_delayed_scaling_history_and_scale():
    """Each use puts the tensor's amax at the front of its history row (the oldest drops out); the row's scale
    becomes fmax / max(history) / 2^margin, and a zero amax leaves the previous scale."""
    g = rng()
    h, margin = int(g.integers(2, 5)), int(g.integers(0, 3))
    layer = fp8.Fp8Linear(16, 16, recipe=fp8.Recipe(amax_history_len=h, margin=margin)).to(DEVICE)
    seen = []
    for _ in range(h + 2):
        xv = (g.standard_normal((4, 16)) * g.uniform(0.1, 10)).astype(np.float32)
        x = it.tensor(xv, device=DEVICE, requires_grad=True)
        layer(x).sum().backward()
        seen.insert(0, np.abs(xv).max())
        hist = layer.fp8_amax_history.cpu().numpy()
        want = np.array((seen + [0.0] * h)[:h], dtype=np.float32)
        assert same(hist[fp8.INPUT], want)
        assert hist[fp8.GRAD][0] == 1.0  # d(sum)/d(out) is all ones
        scale = layer.fp8_scale.cpu().numpy()
        assert scale[fp8.INPUT] == np.float32(np.float32(448.0 / 2**margin) / want.max())
        assert scale[fp8.GRAD] == np.float32(57344.0 / 2**margin)
    frozen = layer.fp8_amax_history.cpu().numpy().copy()
    with it.no_grad():  # evaluation and sampling leave the histories alone
        layer(it.tensor(g.standard_normal((4, 16)).astype(np.float32) * 100, device=DEVICE))
    assert same(layer.fp8_amax_history.cpu().numpy(), frozen)
    one = fp8.Fp8Linear(16, 16, recipe=fp8.Recipe(amax_history_len=1)).to(DEVICE)
    one(it.tensor(g.standard_normal((4, 16)).astype(np.float32), device=DEVICE))
    before = one.fp8_scale.cpu().numpy().copy()
    one(it.zeros(4, 16, device=DEVICE))  # a history of only zeros: the scale stays
    assert one.fp8_amax_history.cpu().numpy()[fp8.INPUT, 0] == 0.0
    assert one.fp8_scale.cpu().numpy()[fp8.INPUT] == before[fp8.INPUT] != 1.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("shape", [(300, 520), (257, 129), (64, 8), (5, 3)])
def test_quantize_delayed_against_reference(shape, dtype):
    """fp8_quantize_delayed_ on tensors of many 64 x 64 tiles, sizes on and off the tiles (a GPU's vector path and
    its edges): the codes, the transposed codes, 1 / scale, the float32 column sums, then the history row and its
    scale moved as fp8_amax_push_ moves them; a NaN in x wins the amax and leaves the scale."""
    g = rng()
    for fmt, nan in (("float8_e4m3fn", False), ("float8_e5m2", False), ("float8_e5m2", True)):
        xv = (np.round(g.standard_normal(shape) * 16) / 8 * 2.0 ** int(g.integers(0, 8))).astype(np.float32)
        if nan:
            xv[g.integers(shape[0]), g.integers(shape[1])] = np.nan
        x = it.tensor(xv, device=DEVICE).to(dtype)
        xs = x.float().cpu().numpy().astype(np.float64)
        h, row, margin = int(g.integers(1, 6)), int(g.integers(3)), int(g.integers(0, 3))
        hist = np.abs(g.standard_normal((3, h))).astype(np.float32)
        scale = g.uniform(0.01, 50, 3).astype(np.float32)
        ht, st = it.tensor(hist, device=DEVICE), it.tensor(scale, device=DEVICE)
        out, out_t, inv, sums = run("fp8_quantize_delayed_", [x._t, ht._t, st._t], [row, margin, fmt, 1, 1, 1])
        codes = it.Tensor(out).float().cpu().numpy()
        prod = (xs.astype(np.float32) * scale[row]).astype(np.float64)
        want = nearest(np.clip(prod, -FMAX[fmt], FMAX[fmt]), fmt)
        assert same(codes, want) and (np.signbit(codes) == np.signbit(want)).all()
        assert same(it.Tensor(out_t).float().cpu().numpy(), codes.T)
        assert it.Tensor(inv).item() == np.float32(1.0) / scale[row]
        np.testing.assert_allclose(it.Tensor(sums).cpu().numpy(), xs.sum(0), rtol=1e-6, atol=1e-3)
        amax = np.nan if nan else np.abs(xs).max()
        want_h = hist.copy()
        want_h[row] = np.concatenate([[np.float32(amax)], hist[row][:-1]])
        want_s = scale.copy()
        if not nan:
            want_s[row] = np.float32(FMAX[fmt] / 2**margin) / np.float32(want_h[row].max())
        assert same(ht.cpu().numpy(), want_h) and same(st.cpu().numpy(), want_s)
    # update = 0 leaves the history and the scales; transpose = colsum = 0 give empty outputs
    before_h, before_s = ht.cpu().numpy().copy(), st.cpu().numpy().copy()
    out, out_t, inv, sums = run("fp8_quantize_delayed_", [x._t, ht._t, st._t], [0, 0, "float8_e4m3fn", 0, 0, 0])
    assert same(ht.cpu().numpy(), before_h) and same(st.cpu().numpy(), before_s)
    assert tuple(it.Tensor(out_t).shape) == (0,) and tuple(it.Tensor(sums).shape) == (0,)
    with pytest.raises(ValueError, match="must be 0 or 1"):
        run("fp8_quantize_delayed_", [x._t, ht._t, st._t], [0, 0, "float8_e4m3fn", 2, 0, 0])
    with pytest.raises(ValueError, match="x must be 2-d"):
        run("fp8_quantize_delayed_", [it.tensor(xv.reshape(-1), device=DEVICE)._t, ht._t, st._t],
            [0, 0, "float8_e4m3fn", 0, 0, 0])  # fmt: skip


def test_delayed_linear_against_emulation():
    """Fp8Linear under delayed scaling (one fused op per tensor use, backward on the transposed copies it made):
    output and gradients equal float64 products of the float8 values the stored scales give, scaled back; the bias
    gradient is the float32 column sum of the output gradient; then each history row holds its tensor's amax."""
    g = rng()
    lin = nn.Linear(64, 80).to(DEVICE)
    layer = fp8.Fp8Linear.from_linear(lin)
    sv = g.uniform(1, 60, 3).astype(np.float32)
    layer.fp8_scale.copy_(it.tensor(sv, device=DEVICE))
    xv = (g.standard_normal((2, 36, 64)) * 2).astype(np.float32)
    x = it.tensor(xv, device=DEVICE, requires_grad=True)
    gv = g.standard_normal((2, 36, 80)).astype(np.float32)
    out = layer(x)
    out.backward(it.tensor(gv, device=DEVICE))

    def q(v, fmt, s):
        prod = (v.astype(np.float32) * s).astype(np.float64)
        return nearest(np.clip(prod, -FMAX[fmt], FMAX[fmt]), fmt)

    w = lin.weight.detach().cpu().numpy()
    x8 = q(xv.reshape(72, 64), "float8_e4m3fn", sv[fp8.INPUT])
    w8 = q(w, "float8_e4m3fn", sv[fp8.WEIGHT])
    g8 = q(gv.reshape(72, 80), "float8_e5m2", sv[fp8.GRAD])
    inv = [np.float64(np.float32(1.0) / s) for s in sv]
    want = (x8 @ w8.T) * inv[0] * inv[1] + lin.bias.detach().cpu().numpy()
    np.testing.assert_allclose(out.detach().cpu().numpy().reshape(72, 80), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.cpu().numpy().reshape(72, 64), (g8 @ w8) * inv[2] * inv[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lin.weight.grad.cpu().numpy(), (g8.T @ x8) * inv[2] * inv[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(lin.bias.grad.cpu().numpy(), gv.reshape(72, 80).sum(0), rtol=1e-5, atol=1e-5)
    hist = layer.fp8_amax_history.cpu().numpy()[:, 0]
    assert same(hist, [np.abs(xv).max(), np.abs(w).max(), np.abs(gv).max()])


@pytest.mark.parametrize("dtype", ["float32"])
def test_amax_push_against_reference(dtype):
    """fp8_amax_push_ on fresh histories: the row shifts with amax in front, the other rows stay; the scale is
    fmax / 2^margin / max(row) in float32 where the max is > 0 and finite, else it stays (a zero amax into an
    all-zero row, a NaN amax); a bad row or shape is refused."""
    g = rng()
    for amax_v, zero_row in ((abs(g.standard_normal()) * 5, False), (0.0, True), (np.nan, False)):
        h = int(g.integers(1, 6))
        hist = np.abs(g.standard_normal((3, h))).astype(np.float32)
        row, margin = int(g.integers(3)), int(g.integers(0, 3))
        if zero_row:
            hist[row] = 0
        scale = g.uniform(1, 50, 3).astype(np.float32)
        ht, st = it.tensor(hist, device=DEVICE), it.tensor(scale, device=DEVICE)
        run("fp8_amax_push_", [ht._t, st._t, it.tensor(np.float32(amax_v), device=DEVICE)._t], [row, 448.0, margin])
        want_h = hist.copy()
        want_h[row] = np.concatenate([[np.float32(amax_v)], hist[row][:-1]])
        want_s = scale.copy()
        m = want_h[row].max() if not np.isnan(want_h[row]).any() else np.nan
        if m > 0 and np.isfinite(m):
            want_s[row] = np.float32(448.0 / 2**margin) / np.float32(m)
        assert same(ht.cpu().numpy(), want_h) and same(st.cpu().numpy(), want_s)
    with pytest.raises(ValueError, match="row 3 is outside"):
        run("fp8_amax_push_", [ht._t, st._t, it.tensor(np.float32(1), device=DEVICE)._t], [3, 448.0, 0])


def test_convert_keeps_heads_and_odd_sizes():
    """convert replaces plain nn.Linear layers of sizes divisible by 16 (sharing their Parameters), not a head
    named lm_head, not one whose weight is tied, nor a 17-wide one."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.a = nn.Linear(16, 32)
            self.odd = nn.Linear(32, 17)
            self.tied = nn.Linear(16, 32, bias=False)
            self.tied.weight = self.emb.weight
            self.lm_head = nn.Linear(16, 32)

    net = Net().to(DEVICE)
    w = net.a.weight
    fp8.convert(net)
    assert isinstance(net.a, fp8.Fp8Linear) and net.a.weight is w
    assert type(net.odd) is nn.Linear and type(net.tied) is nn.Linear and type(net.lm_head) is nn.Linear
    assert net.fp8_layers == 1
    assert {"a.fp8_amax_history", "a.fp8_scale"} <= set(net.state_dict())


def test_convert_refuses_a_provider_without_kernels(monkeypatch):
    monkeypatch.setattr(fp8.dispatch, "how", lambda op, device: "composite")
    with pytest.raises(RuntimeError, match="has no FP8 kernels.*fp8_quantize, fp8_matmul"):
        fp8.convert(nn.Linear(16, 16).to(DEVICE))


def test_recipe_bounds():
    with pytest.raises(ValueError, match="scaling"):
        fp8.Recipe(scaling="dynamic")
    with pytest.raises(ValueError, match="amax_history_len"):
        fp8.Recipe(amax_history_len=0)
    with pytest.raises(ValueError, match="margin"):
        fp8.Recipe(margin=-1)


@pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="cuda's cuBLASLt FP8 path")
def test_cuda_aligned_products_run_on_cublaslt():
    """An FP8 layer of tensor-core shapes runs its three GEMMs on cuBLASLt, not on the plain fallback kernel."""
    import infinitrain_cuda

    before = infinitrain_cuda.lt_fp8_calls()
    layer = fp8.Fp8Linear(64, 128).to(DEVICE)
    x = it.tensor(rng().standard_normal((256, 64)).astype(np.float32), device=DEVICE, requires_grad=True)
    with it.autocast(DEVICE.split(":")[0], dtype=it.bfloat16):
        out = layer(x)
    out.float().sum().backward()
    assert infinitrain_cuda.lt_fp8_calls() - before == 3
