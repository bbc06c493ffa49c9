"""Composite definitions of the fused ops agree with the native kernels: at the
dispatcher level (forward and backward ops) and through autograd when the
Python layer routes a fused op to its composite."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, TOL, rng, round_to, to_device
from infinitrain import _C, dispatch
from infinitrain import functional as F
from infinitrain.tools.conformance_specs import GELU_GEMM_16

FUSED = [o["name"] for o in _C.ops() if o["tier"] == "fused"]
# Ops whose one integer flag switches a part of the computation on (rope's interleaving, the bias gradient, top-k's
# renormalisation; linear_gelu_tanh's optional bias, the norm backwards' optional residual): each composite is checked
# with the flag both ways.
FLAGGED = {
    "rope",
    "linear_weight_grad",
    "linear_gelu_tanh",
    "linear_dgelu_tanh",
    "moe_topk",
    "moe_topk_backward",
    "add_layernorm_backward",
    "add_rmsnorm_backward",
}
GELU_GEMMS = {"linear_gelu_tanh", "linear_dgelu_tanh"}
CASES = [(n, flag) for n in FUSED for flag in ((0, 1) if n in FLAGGED else (None,))]
FP8 = ("float8_e4m3fn", "float8_e5m2")


def test_every_fused_op_has_a_composite():
    missing = [n for n in FUSED if not _C.op(n).info()["composite"]]
    assert not missing, f"fused ops without a composite: {missing}"


def inputs_for(name, dtype, flag=None):
    g = rng()

    def f(*shape, lo=None):
        a = g.standard_normal(shape) if lo is None else g.uniform(lo, 2.0, shape)
        return to_device(round_to(a, dtype), dtype)

    stat = "float64" if dtype == "float64" else "float32"
    B, H, Hkv, T, D, N, V = 2, 4, 2, 7, 8, 6, 11
    ang = g.uniform(-3, 3, (T, D // 2))
    cos, sin = to_device(np.cos(ang), stat), to_device(np.sin(ang), stat)
    target = g.integers(0, V, N)
    target[1] = -100
    tgt = to_device(target, "int64")
    q, k, v = f(B, H, T, D), f(B, Hkv, T, D), f(B, Hkv, T, D)
    table = {
        "silu": ([f(3, 17)], []),
        "gelu_tanh": ([f(3, 17)], []),
        "gelu": ([f(3, 17)], []),
        "gelu_backward": ([f(3, 17), f(3, 17)], []),
        "silu_backward": ([f(3, 17), f(3, 17)], []),
        "gelu_tanh_backward": ([f(3, 17), f(3, 17)], []),
        "rmsnorm": ([f(3, 17), f(17)], [1e-5]),
        "add_layernorm": ([f(3, 17), f(3, 17), f(17), f(17)], [1e-5, ""]),
        # x * scale beyond the format's range too (saturation); a float8 product's output in the case's dtype.
        "fp8_quantize": ([f(3, 17), to_device(np.array(g.choice([1.0, 40.0, 700.0])), "float32")], [FP8[0]]),
        "fp8_amax_push_": (
            [
                to_device(np.abs(g.standard_normal((3, 6))), "float32"),
                to_device(g.uniform(1, 9, 3), "float32"),
                to_device(np.array(abs(g.standard_normal())), "float32"),
            ],
            [int(g.integers(3)), 448.0, int(g.integers(0, 3))],
        ),  # fmt: skip
        "fp8_matmul": (
            [
                to_device(g.standard_normal((5, 16)) * 8, "float32"),
                to_device(g.standard_normal((9, 16)) * 8, "float32"),
                to_device(np.array(0.25), "float32"),
                to_device(np.array(1 / 3), "float32"),
                f(9),
            ],
            [0, 1, "float32" if dtype == "float64" else dtype],
        ),  # fmt: skip
        "add_rmsnorm": ([f(3, 17), f(3, 17), f(17)], [1e-5, ""]),
        "swiglu": ([f(3, 17), f(3, 17)], []),
        "swiglu_backward": ([f(3, 17), f(3, 17), f(3, 17)], []),
        "rope": ([f(B, T, 3, D), cos, sin], [flag]),
        "sdpa": ([q, k, v], [1, 0.35]),
        "sdpa_bthd": ([f(B, T, H, D), f(B, T, Hkv, D), f(B, T, Hkv, D)], [1, 0.35]),
        "cross_entropy": ([f(N, V), tgt], [-100]),
        "linear_weight_grad": ([f(2, 9, 5), f(2, 9, 17)], [flag]),
        "linear_gelu_tanh": ([f(2, 9, 5), f(16, 5)] + ([f(16)] if flag else []), []),
        "linear_dgelu_tanh": ([f(2, 9, 6), f(6, 16), f(2, 9, 16)], [flag]),
    }
    if name in table:
        return table[name]
    if name == "rmsnorm_backward":
        x, w = f(3, 17), f(17)
        rstd = _C.op("rmsnorm")([x, w], [1e-5])[1]
        return [f(3, 17), x, w, rstd], []
    if name in ("add_layernorm_backward", "add_rmsnorm_backward"):
        rms = name == "add_rmsnorm_backward"
        x, w = f(3, 17), f(17)
        stats = _C.op("rmsnorm" if rms else "layernorm")([x, w] + ([] if rms else [f(17)]), [1e-5])[1:]
        return [f(3, 17), x, w, *stats] + ([f(3, 17)] if flag else []), []
    if name == "sdpa_backward":
        out, lse = _C.op("sdpa")([q, k, v], [1, 0.35])
        return [f(B, H, T, D), q, k, v, out, lse], [1, 0.35]
    if name == "sdpa_bthd_backward":
        qb, kb, vb = f(B, T, H, D), f(B, T, Hkv, D), f(B, T, Hkv, D)
        out, lse = _C.op("sdpa_bthd")([qb, kb, vb], [0, 0.35])
        return [f(B, T, H, D), qb, kb, vb, out, lse], [0, 0.35]
    if name == "cross_entropy_backward":
        logits = f(N, V)
        lse = _C.op("cross_entropy")([logits, tgt], [-100])[1]
        return [logits, tgt, lse, to_device(np.array(g.standard_normal()), stat)], [-100]
    if name.startswith("moe_"):
        return _moe_inputs(name, f, g, stat, flag)
    if name == "adamw_":
        p, grad = f(4, 5), f(4, 5)
        m, vv = to_device(g.standard_normal((4, 5)), stat), to_device(g.uniform(0, 1, (4, 5)), stat)
        return [p, grad, m, vv], [1e-2, 0.9, 0.95, 1e-8, 0.1, 3]
    shapes = [(4, 5), (3,), (0,), (), (17,)]
    if name == "foreach_sum_squares":
        return [f(*s) for s in shapes], []
    if name == "foreach_mul_":
        return [to_device(round_to(np.array(g.uniform(0.25, 2.0)), dtype), dtype)] + [f(*s) for s in shapes], []
    if name == "foreach_adamw_":
        m = [to_device(g.standard_normal(s), stat) for s in shapes]
        vv = [to_device(g.uniform(0, 1, s), stat) for s in shapes]
        return [f(*s) for s in shapes] + [f(*s) for s in shapes] + m + vv, [1e-2, 0.9, 0.95, 1e-8, 0.1, 3]
    if name == "fp8_quantize_delayed_":  # quarter-integers: the column sums are exact in float32 either way
        x = to_device(round_to(np.round(g.standard_normal((70, 72)) * 8) / 4, dtype), dtype)
        hist = to_device(np.abs(g.standard_normal((3, 4))), "float32")
        return [x, hist, to_device(g.uniform(0.5, 50, 3), "float32")], [1, 1, FP8[1], 1, 1, 1]
    raise AssertionError(f"no inputs for {name}")


def _moe_inputs(name, f, g, stat, flag):
    n, e, k, c = 10, 5, 2, 6
    routes = to_device(np.stack([g.permutation(e)[:k] for _ in range(n)]), "int64")
    source = to_device(g.permutation(n * k), "int64")
    weights = to_device(g.uniform(0, 1, (n, k)), stat)
    if name == "moe_topk":
        return [f(n, e)], [k, flag]
    if name == "moe_topk_backward":
        return [f(n, e), routes, to_device(g.standard_normal((n, k)), stat)], [flag]
    if name == "moe_permute":
        return [f(n, c), routes], [e]
    if name == "moe_unpermute":
        return [f(n * k, c), source, weights], []
    return [f(n, c), f(n * k, c), source, weights], []  # moe_unpermute_backward


def clone(t):
    return _C.op("cast")([t], [t.dtype])[0]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name, flag", CASES, ids=lambda c: str(c))
def test_composite_matches_native(name, flag, dtype):
    ins, attrs = inputs_for(name, dtype, flag)
    if name == "fp8_matmul":  # operands on the float8 grids (e4m3 x e5m2), the bias in the output dtype
        ins[0], ins[1] = _C.op("cast")([ins[0]], [FP8[0]])[0], _C.op("cast")([ins[1]], [FP8[1]])[0]
        ins[4] = _C.op("cast")([ins[4]], [attrs[2]])[0]
    written = _C.op(name).written(len(ins))
    native_in = [clone(t) for t in ins]
    native = list(_C.op(name)(native_in, attrs)) + [native_in[i] for i in written]
    comp_in = [clone(t) for t in ins]
    comp = list(_C.op(name).call_composite(comp_in, attrs)) + [comp_in[i] for i in written]
    assert len(native) == len(comp)
    # Composites compute low-precision dtypes in float32, as the kernels do: the dtype's own tolerance holds
    # (measured worst: 0.05 of it for float32, 0.02 for bfloat16, 0.7 for float16 sdpa).
    for k, (a, b) in enumerate(zip(native, comp, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a, b)
        rtol, atol = TOL[a.dtype if a.dtype in TOL else dtype]
        if name.startswith("sdpa") and dtype in ("bfloat16", "float16"):
            # Fused attention kernels (cuDNN's) round the probabilities to the 16-bit type before P @ V: an
            # absolute error of up to ~2^-8 of the values' scale (0.0017 at |out| ~ 1 on an H200), not a relative one.
            atol = max(atol, 2**-7 * float(np.abs(a.numpy()).max()))
        if name in GELU_GEMMS and dtype in GELU_GEMM_16 and a.numpy().size:
            # One side may round pre (or the product) to the 16-bit type before the GELU, the other not.
            atol = max(atol, GELU_GEMM_16[dtype] * float(np.abs(a.numpy()).max()))
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=rtol, atol=atol, err_msg=f"{name} output {k}")


def _both_paths(fn, *arrays):
    """Runs fn natively and with every fused op forced onto its composite; returns (outputs, grads) of each."""
    results = []
    for force in (False, True):
        with dispatch.prefer_composites(FUSED if force else []):
            assert all(dispatch.how(n, DEVICE) == "composite" for n in FUSED) == force
            ts = [it.from_numpy(a, device=DEVICE, requires_grad=True) for a in arrays]
            out = fn(*ts)
            (out * it.from_numpy(np.linspace(-1, 1, out.numel()).reshape(out.shape), device=DEVICE)).sum().backward()
            results.append((out.numpy(), [t.grad.numpy() for t in ts]))
    return results


@pytest.mark.parametrize(
    "fn,shapes",
    [
        (F.silu, [(3, 9)]),
        (F.gelu, [(3, 9)]),
        (lambda x: F.gelu(x, approximate="tanh"), [(3, 9)]),
        (lambda x, w: F.rms_norm(x, w, 1e-5), [(3, 9), (9,)]),
        (F.swiglu, [(3, 9), (3, 9)]),
        (
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [(2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)],
        ),
        (
            lambda q, k, v: F.attention_bthd(q, k, v, is_causal=True),
            [(2, 5, 4, 8), (2, 5, 2, 8), (2, 5, 2, 8)],
        ),
    ],
)
def test_autograd_through_composites(fn, shapes):
    arrays = [rng().standard_normal(s) for s in shapes]
    (o1, g1), (o2, g2) = _both_paths(fn, *arrays)
    np.testing.assert_allclose(o2, o1, rtol=1e-10, atol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)


def test_cross_entropy_and_rope_composites_through_autograd():
    target = rng().integers(0, 7, 5)
    target[0] = -100
    t = it.from_numpy(target, device=DEVICE)
    (o1, g1), (o2, g2) = _both_paths(lambda x: F.cross_entropy(x, t).reshape(1), rng().standard_normal((5, 7)))
    np.testing.assert_allclose(o2, o1, rtol=1e-12)
    np.testing.assert_allclose(g2[0], g1[0], rtol=1e-10, atol=1e-12)
    ang = rng().uniform(-3, 3, (4, 3))
    cos, sin = it.from_numpy(np.cos(ang), device=DEVICE), it.from_numpy(np.sin(ang), device=DEVICE)
    (o1, g1), (o2, g2) = _both_paths(lambda x: F.rope(x, cos, sin), rng().standard_normal((2, 4, 3, 6)))
    np.testing.assert_allclose(o2, o1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g2[0], g1[0], rtol=1e-12, atol=1e-12)


def test_cross_entropy_composite_handles_masked_logits():
    logits = np.array([[0.0, 1.0, -np.inf], [2.0, -np.inf, 0.5]])
    ins = [it.from_numpy(logits, device=DEVICE)._t, it.from_numpy(np.array([1, 0]), device=DEVICE)._t]
    native = _C.op("cross_entropy")(ins, [-100])[0].numpy()
    comp = _C.op("cross_entropy").call_composite(ins, [-100])[0].numpy()
    assert np.isfinite(comp) and comp == pytest.approx(native, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_optimizer_and_clipping_through_the_foreach_composites(dtype):
    """clip_grad_norm_ and AdamW steps over parameters of two dtypes with every fused op on its composite
    (foreach_sum_squares and foreach_mul_ on theirs, foreach_adamw_ on adamw_'s per set): what the kernels give,
    within the dtype's tolerance."""
    shapes = [(4, 5), (7,), (3, 3), (6,)]
    dtypes = [dtype, dtype, dtype, "float32"]
    init = [round_to(rng().standard_normal(s), d) for s, d in zip(shapes, dtypes, strict=True)]
    grads = [[3 * rng().standard_normal(s) for s in shapes] for _ in range(3)]
    results = []
    for force in (False, True):
        with dispatch.prefer_composites(FUSED if force else []):
            for n in ("foreach_sum_squares", "foreach_mul_", "foreach_adamw_", "adamw_"):
                assert dispatch.how(n, DEVICE) == ("composite" if force else "native")
            ps = [it.nn.Parameter(it.from_numpy(a, dtype=d, device=DEVICE)) for a, d in zip(init, dtypes, strict=True)]
            opt = it.optim.AdamW(ps, lr=0.05, weight_decay=0.1)
            norms, clipped = [], []
            for gs in grads:
                for p, g in zip(ps, gs, strict=True):
                    p.grad = it.from_numpy(g, dtype=p.dtype, device=DEVICE)
                norms.append(it.optim.clip_grad_norm_(ps, 1.0).item())
                clipped += [p.grad.numpy().astype(np.float64) for p in ps]
                opt.step()
            results.append((norms, clipped, [p.numpy().astype(np.float64) for p in ps]))
    (n1, g1, p1), (n2, g2, p2) = results
    np.testing.assert_allclose(n2, n1, rtol=TOL["float32"][0])  # one group is float32
    assert all(np.sqrt(sum((g**2).sum() for g in g1[k : k + 4])) < 1.01 for k in range(0, 12, 4))  # clipped to 1
    for a, b, d in zip(g1, g2, dtypes * 3, strict=True):
        np.testing.assert_allclose(b, a, rtol=TOL[d][0], atol=TOL[d][1])
    for a, b, d, a0 in zip(p1, p2, dtypes, init, strict=True):
        assert np.abs(a - a0).max() > 0.01  # the steps moved the parameters
        np.testing.assert_allclose(b, a, rtol=TOL[d][0], atol=TOL[d][1])
