"""adamw_: several in-place steps against a float64 NumPy AdamW with the same storage rounding. The multi-tensor
ops: foreach_adamw_ bit for bit against adamw_ per set, foreach_sum_squares and foreach_mul_ against NumPy."""

import os
import subprocess
import sys

import numpy as np
import pytest

from harness import DEVICE, assert_close, randn, rng, round_to, run, stat_dtype, to_device
from infinitrain import _C

DTYPES = ("float32", "bfloat16", "float16", "float64")


def ref_adamw_step(p, g, m, v, lr, b1, b2, eps, wd, step):
    """PyTorch's AdamW formula in float64; returns the unrounded new param, m and v."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)
    return p, m, v


HYPER = [
    dict(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.1),
    dict(lr=3e-3, b1=0.8, b2=0.95, eps=1e-6, wd=0.0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hyper", HYPER, ids=["wd", "no_wd"])
@pytest.mark.parametrize("shape", [(1,), (7, 3), (33, 65), (4099,)], ids=str)  # 4099: parallel path
def test_adamw(shape, hyper, dtype):
    gen, st, steps = rng(), stat_dtype(dtype), 5
    p = round_to(randn(*shape, gen=gen), dtype)
    m, v = np.zeros(shape), np.zeros(shape)
    tp, tm, tv = to_device(p, dtype), to_device(m, st), to_device(v, st)
    h = hyper
    for step in range(1, steps + 1):
        g = round_to(randn(*shape, gen=gen, scale=0.5), dtype)
        assert (
            run("adamw_", [tp, to_device(g, dtype), tm, tv], [h["lr"], h["b1"], h["b2"], h["eps"], h["wd"], step]) == []
        )
        p, m, v = ref_adamw_step(p, g, m, v, h["lr"], h["b1"], h["b2"], h["eps"], h["wd"], step)
        # The tensors hold rounded values between steps.
        p, m, v = round_to(p, dtype), round_to(m, st), round_to(v, st)
        assert_close(tp, p, dtype, what=f"param after step {step}")
        assert_close(tm, m, st, what=f"m after step {step}")
        assert_close(tv, v, st, what=f"v after step {step}")
        # The next step starts from the kernel's state: a 1-ulp rounding flip at a large |p| would otherwise carry
        # into later steps where p is smaller and the relative tolerance tighter.
        p, m, v = (t.numpy().astype(np.float64) for t in (tp, tm, tv))


def test_adamw_first_step_moves_by_lr():
    """With zero state, the first step is param * (1 - lr * wd) - lr * sign(grad) (up to eps)."""
    gen = rng()
    p, g = randn(50, gen=gen), randn(50, gen=gen)
    g = np.sign(g) * (0.1 + np.abs(g))  # away from 0, where eps would matter
    tp = to_device(p, "float64")
    z = [to_device(np.zeros(50), "float64") for _ in range(2)]
    run("adamw_", [tp, to_device(g, "float64"), *z], [0.1, 0.9, 0.999, 1e-12, 0.5, 1])
    np.testing.assert_allclose(tp.numpy(), p * 0.95 - 0.1 * np.sign(g), rtol=1e-9, atol=1e-9)


def test_adamw_empty():
    e = [to_device(np.zeros(0), "float32") for _ in range(4)]
    assert run("adamw_", e, [1e-3, 0.9, 0.999, 1e-8, 0.0, 1]) == []


def f32(*shape):
    return to_device(randn(*shape), "float32")


ATTRS = [1e-3, 0.9, 0.999, 1e-8, 0.01, 1]


@pytest.mark.parametrize(
    "inputs, attrs, match",
    [
        (lambda: [f32(4), f32(4), f32(4), f32(4)], ATTRS[:5] + [0], "step must be >= 1"),
        (lambda: [f32(4), f32(4), f32(4), f32(4)], ATTRS[:5], "expected 6 attribute"),
        (lambda: [f32(4), f32(5), f32(4), f32(4)], ATTRS, "param, grad, m and v"),
        (lambda: [f32(4), f32(4), f32(4), f32(3)], ATTRS, "param, grad, m and v"),
        (lambda: [f32(4), to_device(randn(4), "float64"), f32(4), f32(4)], ATTRS, "dtype mismatch"),
        (lambda: [f32(4), f32(4), to_device(np.zeros(4), "float64"), f32(4)], ATTRS, "m must be float32"),
        (
            lambda: [to_device(randn(4), "bfloat16")] * 2 + [to_device(np.zeros(4), "bfloat16"), f32(4)],
            ATTRS,
            "m must be float32",
        ),
        (
            lambda: [to_device(randn(4), "float64")] * 2 + [to_device(np.zeros(4), "float64"), f32(4)],
            ATTRS,
            "v must be float64",
        ),
        (lambda: [to_device(np.ones(4), "int64")] * 4, ATTRS, "param must be float32"),
    ],
)
def test_adamw_errors(inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run("adamw_", inputs(), attrs)


# ---- multi-tensor (foreach) ops ----

# Mixed sizes: empty tensors, a 0-d one, odd sizes, and ones longer than a GPU block's chunk (16384 elements).
MIXED = [(1,), (0,), (7, 3), (), (33, 65), (4099,), (3, 0), (16385,), (2, 20000), (5,)]


def many_shapes(gen, n=100):
    """More tensors than one GPU launch holds (32 adamw sets, 64 tensors otherwise), of 0 to 300 elements."""
    return [(int(k),) for k in gen.integers(0, 300, n)]


def same_bits(a, b, what):
    x, y = a.numpy(), b.numpy()
    assert a.dtype == b.dtype and x.shape == y.shape, what
    assert x.tobytes() == y.tobytes(), f"{what}: differs at {np.flatnonzero(x.ravel() != y.ravel())[:5]}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hyper", HYPER, ids=["wd", "no_wd"])
@pytest.mark.parametrize("many", [False, True], ids=["mixed", "100"])
def test_foreach_adamw_is_adamw_bit_for_bit(many, hyper, dtype):
    """Several steps of foreach_adamw_ and of adamw_ per set from the same state give the same bits, and both
    follow the float64 NumPy AdamW; the grads come back untouched."""
    gen, st, h = rng(), stat_dtype(dtype), hyper
    shapes = many_shapes(gen) if many else MIXED
    n = len(shapes)
    ref_p = [round_to(randn(*s, gen=gen), dtype) for s in shapes]
    ref_m, ref_v = [np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes]
    fp, ap = [to_device(p, dtype) for p in ref_p], [to_device(p, dtype) for p in ref_p]
    fm, am = [to_device(m, st) for m in ref_m], [to_device(m, st) for m in ref_m]
    fv, av = [to_device(v, st) for v in ref_v], [to_device(v, st) for v in ref_v]
    for step in range(1, 5):
        attrs = [h["lr"], h["b1"], h["b2"], h["eps"], h["wd"], step]
        g = [round_to(randn(*s, gen=gen, scale=0.5), dtype) for s in shapes]
        fg = [to_device(x, dtype) for x in g]
        assert run("foreach_adamw_", fp + fg + fm + fv, attrs) == []
        for k in range(n):
            run("adamw_", [ap[k], to_device(g[k], dtype), am[k], av[k]], attrs)
        for k in range(n):
            what = f"set {k} {shapes[k]} after step {step}"
            same_bits(fp[k], ap[k], "param of " + what)
            same_bits(fm[k], am[k], "m of " + what)
            same_bits(fv[k], av[k], "v of " + what)
            np.testing.assert_array_equal(fg[k].numpy().astype(np.float64), g[k], err_msg="grad of " + what)
            p, m, v = ref_adamw_step(
                ref_p[k], g[k], ref_m[k], ref_v[k], h["lr"], h["b1"], h["b2"], h["eps"], h["wd"], step
            )
            assert_close(fp[k], round_to(p, dtype), dtype, what="param of " + what)
            assert_close(fm[k], round_to(m, st), st, what="m of " + what)
            assert_close(fv[k], round_to(v, st), st, what="v of " + what)
            ref_p[k], ref_m[k], ref_v[k] = (t.numpy().astype(np.float64) for t in (fp[k], fm[k], fv[k]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("many", [False, True], ids=["mixed", "100"])
def test_foreach_sum_squares(many, dtype):
    gen = rng()
    shapes = many_shapes(gen) if many else MIXED
    xs = [round_to(randn(*s, gen=gen, scale=3.0), dtype) for s in shapes]
    (out,) = run("foreach_sum_squares", [to_device(x, dtype) for x in xs])
    st = stat_dtype(dtype)
    assert out.shape == () and out.dtype == st
    assert_close(out, sum(np.sum(x * x) for x in xs), st, what=f"foreach_sum_squares of {len(xs)} tensors")


@pytest.mark.parametrize("dtype", DTYPES)
def test_foreach_sum_squares_accumulates_in_float64(dtype):
    """Integer values whose squares sum exactly in float64 but not in float32: the result is that exact sum,
    rounded once (float64: exact)."""
    gen = rng()
    top = 256 if dtype in ("bfloat16", "float16") else 4096  # integers the dtype holds exactly
    xs = [gen.integers(-top, top, s).astype(np.float64) for s in [(30000,), (0,), (777,), (40000,), ()]]
    xs[0][0] = top - 1  # at least one large square
    exact = sum(int(np.sum(x.astype(np.int64) ** 2)) for x in xs)
    assert exact < 2**53
    (out,) = run("foreach_sum_squares", [to_device(x, dtype) for x in xs])
    want = np.float64(exact) if dtype == "float64" else np.float32(exact)
    assert out.numpy() == want, f"{out.numpy()!r} != {want!r} (exact {exact})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_foreach_sum_squares_of_empty_tensors_is_zero(dtype):
    for shapes in ([(0,)], [(0,), (3, 0), (0, 5)]):
        (out,) = run("foreach_sum_squares", [to_device(np.zeros(s), dtype) for s in shapes])
        assert out.dtype == stat_dtype(dtype) and out.numpy() == 0.0


def test_foreach_sum_squares_does_not_depend_on_the_thread_count(tmp_path):
    """The same inputs in processes with 1 and 3 OpenMP threads: the same bits (fixed chunks summed in order)."""
    gen = rng()
    xs = [randn(int(k), gen=gen) for k in gen.integers(1, 40000, 12)]
    np.savez(tmp_path / "xs.npz", *xs)
    code = (
        "import sys, numpy as np; from harness import run, to_device; "
        f"d = np.load({str(tmp_path / 'xs.npz')!r}); xs = [d[k] for k in d.files]; "
        "out = [run('foreach_sum_squares', [to_device(x, t) for x in xs])[0].numpy() for t in ('float32', 'float64')]; "
        "print(' '.join(float(o).hex() for o in out))"
    )
    got = []
    for threads in (1, 3):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        got.append(p.stdout.split())
    assert got[0] == got[1]
    want = sum(np.sum(x * x) for x in xs)
    assert float.fromhex(got[0][1]) == pytest.approx(want, rel=1e-12)


SCALES = ("float32", "float64", "bfloat16", "float16")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_dtype", SCALES)
@pytest.mark.parametrize("many", [False, True], ids=["mixed", "100"])
def test_foreach_mul(many, scale_dtype, dtype):
    """x * scale with scale read in the compute type (float32; float64 for float64 x) and the product rounded once:
    the NumPy product of the same values in that type, exactly, and within the dtype's tolerance of float64."""
    gen = rng()
    shapes = many_shapes(gen) if many else MIXED
    xs = [round_to(randn(*s, gen=gen, scale=2.0), dtype) for s in shapes]
    scale = round_to(np.array(gen.uniform(0.1, 3.0)), scale_dtype)
    ts = [to_device(x, dtype) for x in xs]
    ts_scale = to_device(scale, scale_dtype)
    assert run("foreach_mul_", [ts_scale] + ts) == []
    compute = np.float64 if dtype == "float64" else np.float32
    for k, (t, x) in enumerate(zip(ts, xs, strict=True)):
        exact = round_to((x.astype(compute) * compute(scale)).astype(np.float64), dtype)
        np.testing.assert_array_equal(t.numpy().astype(np.float64), exact, err_msg=f"xs[{k}] {shapes[k]}")
        assert_close(t, x * scale, dtype, what=f"xs[{k}] {shapes[k]}")
    assert ts_scale.numpy() == scale  # read only


def test_foreach_written_inputs_get_new_versions():
    """A written variadic input covers every tensor from its position: each one's version moves on (saved
    tensors of a graph notice the write), the read-only scale's does not."""
    xs = [f32(3), f32(0), f32(2, 2)]
    scale = to_device(np.array(0.5), "float32")
    before, scale_before = [x.version for x in xs], scale.version
    run("foreach_mul_", [scale] + xs)
    assert [x.version for x in xs] == [v + 1 for v in before] and scale.version == scale_before
    assert _C.op("foreach_mul_").written(4) == [1, 2, 3]
    sets = [f32(4) for _ in range(4)] + [z32(4) for _ in range(4)]
    before = [t.version for t in sets]
    run("foreach_adamw_", sets, ATTRS)
    assert [t.version for t in sets] == [v + 1 for v in before]
    assert _C.op("foreach_adamw_").written(8) == list(range(8)) and _C.op("adamw_").written(4) == [0, 2, 3]


def z32(*shape):
    return to_device(np.zeros(shape), "float32")


def _adamw_sets(*sizes, dtype="float32"):
    """n params, grads, m and v of the given sizes."""
    st = stat_dtype(dtype)
    return [to_device(randn(s), dtype) for s in sizes * 2] + [to_device(np.zeros(s), st) for s in sizes * 2]


def _f64(*shape):
    return to_device(randn(*shape), "float64")


@pytest.mark.parametrize(
    "name, inputs, attrs, match",
    [
        ("foreach_adamw_", lambda: _adamw_sets(4, 3)[:7], ATTRS, r"foreach_adamw_: expected 4n tensors .*got 7"),
        (
            "foreach_adamw_",
            lambda: _adamw_sets(4, 3)[:4] + [f32(5)] + _adamw_sets(4, 3)[5:],
            ATTRS,
            r"foreach_adamw_: set 0 \(inputs 0, 2, 4, 6\): param, grad, m and v: shapes \[4\] and \[5\]",
        ),
        (
            "foreach_adamw_",
            lambda: _adamw_sets(4, 3)[:7] + [to_device(np.zeros(3), "float64")],
            ATTRS,
            r"foreach_adamw_: set 1 \(inputs 1, 3, 5, 7\): v must be float32, got float64",
        ),
        (
            "foreach_adamw_",
            lambda: [f32(4), _f64(3), f32(4), _f64(3), z32(4), to_device(np.zeros(3), "float64"), z32(4), z32(3)],
            ATTRS,
            r"foreach_adamw_: set 1 .*param is float64, set 0's float32: one param dtype per call",
        ),
        (
            "foreach_adamw_",
            lambda: [f32(4), _f64(4), z32(4), z32(4)],
            ATTRS,
            r"foreach_adamw_: set 0 .*dtype mismatch: float32 and float64",
        ),
        ("foreach_adamw_", lambda: _adamw_sets(4, 3), ATTRS[:5] + [0], "foreach_adamw_: step must be >= 1"),
        ("foreach_adamw_", lambda: _adamw_sets(4), ATTRS[:5], "foreach_adamw_: expected 6 attribute"),
        (
            "foreach_adamw_",
            lambda: [to_device(np.ones(4), "int64")] * 4,
            ATTRS,
            "foreach_adamw_: tensors must be float32, bfloat16, float16 or float64, got int64",
        ),
        ("foreach_sum_squares", lambda: [], [], r"foreach_sum_squares: expected inputs \(xs...\), got 0"),
        (
            "foreach_sum_squares",
            lambda: [f32(3), f32(2), _f64(3)],
            [],
            r"foreach_sum_squares: xs\[2\] is float64, xs\[0\] float32: all xs must share one dtype",
        ),
        (
            "foreach_sum_squares",
            lambda: [to_device(np.ones(3), "int64")],
            [],
            "foreach_sum_squares: xs must be float32, bfloat16, float16 or float64, got int64",
        ),
        (
            "foreach_mul_",
            lambda: [f32(3), f32(3)],
            [],
            r"foreach_mul_: scale must be 0-d, got shape \[3\]",
        ),
        (
            "foreach_mul_",
            lambda: [to_device(np.array(2.0), "float32")],
            [],
            r"foreach_mul_: expected inputs \(scale, xs...\), got 1",
        ),
        (
            "foreach_mul_",
            lambda: [to_device(np.array(2.0), "float32"), f32(3), to_device(np.ones(2), "bfloat16")],
            [],
            r"foreach_mul_: xs\[1\] is bfloat16, xs\[0\] float32: all xs must share one dtype",
        ),
        (
            "foreach_mul_",
            lambda: [to_device(np.array(2.0), "float32"), to_device(np.ones(2), "int64")],
            [],
            "foreach_mul_: xs\\[0\\] must be float32, bfloat16, float16 or float64, got int64",
        ),
        (
            "foreach_mul_",
            lambda: [to_device(np.array(2), "int64"), f32(2)],
            [],
            "foreach_mul_: scale must be float32, bfloat16, float16 or float64, got int64",
        ),
        (
            "foreach_mul_",
            lambda: [to_device(np.array(2.0), "float32")] + [f32(3)] * 2,
            [],
            "foreach_mul_: inputs 1 and 2 share memory: each tensor may appear once",
        ),
        (
            "foreach_adamw_",
            lambda: (lambda t: t[:6] + [t[6], t[6]])(_adamw_sets(4, 4)),
            ATTRS,
            "foreach_adamw_: inputs 6 and 7 share memory: each tensor may appear once",
        ),
    ],
)
def test_foreach_errors(name, inputs, attrs, match):
    with pytest.raises(ValueError, match=match):
        run(name, inputs(), attrs)


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a second device type: the scale on the cpu, xs on the device")
def test_foreach_mul_refuses_a_scale_on_another_device():
    with pytest.raises(ValueError, match=r"foreach_mul_: expected all inputs on one device, got cpu \(input 0\)"):
        run("foreach_mul_", [to_device(np.array(2.0), "float32", device="cpu"), f32(3)])
