"""cross_entropy and cross_entropy_backward CPU kernels against float64 NumPy."""

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, stat_dtype, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")
IGNORE = -100


def ref_lse(x):
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[:, 0]


def ref_cross_entropy(x, target, ignore):
    lse = ref_lse(x)
    keep = target != ignore
    rows = np.nonzero(keep)[0]
    loss = (lse[rows] - x[rows, target[rows]]).sum() / keep.sum() if keep.any() else 0.0
    return loss, lse


def ref_cross_entropy_backward(x, target, lse, grad, ignore):
    keep = target != ignore
    count = keep.sum()
    d = np.exp(x - lse[:, None])
    d[np.arange(len(target)), np.where(keep, target, 0)] -= 1.0
    d = np.where(keep[:, None], d, 0.0)
    return grad * d / count if count else np.zeros_like(x)


def make_targets(n, v, ignore, frac_ignored, gen):
    t = gen.integers(0, v, size=n)
    t[gen.random(n) < frac_ignored] = ignore
    return t.astype(np.int64)


# (N, V, ignore_index, fraction of rows ignored)
CE_CASES = [
    (1, 1, IGNORE, 0.0),
    (7, 5, IGNORE, 0.3),
    (33, 65, IGNORE, 0.2),
    (17, 33, 0, 0.0),  # ignore_index inside [0, V): rows with target 0 are skipped
    (64, 257, IGNORE, 0.1),  # parallel rows
    (5, 17, IGNORE, 1.0),  # every row ignored: loss 0, zero gradient
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, v, ignore, frac", CE_CASES, ids=str)
def test_cross_entropy(n, v, ignore, frac, dtype):
    gen = rng()
    x = round_to(randn(n, v, gen=gen, scale=3.0), dtype)
    target = make_targets(n, v, ignore, frac, gen)
    loss, lse = run("cross_entropy", [to_device(x, dtype), to_device(target, "int64")], [ignore])
    r_loss, r_lse = ref_cross_entropy(x, target, ignore)
    st = stat_dtype(dtype)
    assert loss.shape == () and loss.dtype == st and lse.dtype == st
    assert_close(loss, r_loss, st, what="loss")
    assert_close(lse, r_lse, st, what="lse")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, v, ignore, frac", CE_CASES, ids=str)
def test_cross_entropy_backward(n, v, ignore, frac, dtype):
    gen = rng()
    st = stat_dtype(dtype)
    x = round_to(randn(n, v, gen=gen, scale=3.0), dtype)
    target = make_targets(n, v, ignore, frac, gen)
    lse = round_to(ref_lse(x), st)  # as the forward saved it
    grad = round_to(gen.uniform(0.5, 2.0), st)
    ins = [to_device(x, dtype), to_device(target, "int64"), to_device(lse, st), to_device(np.array(grad), st)]
    dx = run("cross_entropy_backward", ins, [ignore])[0]
    assert_close(dx, ref_cross_entropy_backward(x, target, lse, grad, ignore), dtype, what="dlogits")


def test_cross_entropy_backward_finite_difference():
    """Kernel and NumPy gradients match central differences of the mean loss (float64, with ignored rows)."""
    gen, h, d = rng(), 1e-6, "float64"
    x = randn(4, 6, gen=gen)
    target = np.array([2, IGNORE, 5, 0], dtype=np.int64)
    loss, lse = run("cross_entropy", [to_device(x, d), to_device(target, "int64")], [IGNORE])
    grad = 1.7
    dx = run(
        "cross_entropy_backward",
        [to_device(x, d), to_device(target, "int64"), lse, to_device(np.array(grad), d)],
        [IGNORE],
    )
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        num[i] = (
            grad * (ref_cross_entropy(x + e, target, IGNORE)[0] - ref_cross_entropy(x - e, target, IGNORE)[0]) / (2 * h)
        )
    np.testing.assert_allclose(dx[0].numpy(), num, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        ref_cross_entropy_backward(x, target, lse.numpy(), grad, IGNORE), num, rtol=1e-6, atol=1e-9
    )
    assert abs(float(loss.numpy()) - ref_cross_entropy(x, target, IGNORE)[0]) < 1e-12


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_empty(dtype):
    st = stat_dtype(dtype)
    x, target = np.zeros((0, 5)), np.zeros(0, dtype=np.int64)
    loss, lse = run("cross_entropy", [to_device(x, dtype), to_device(target, "int64")], [IGNORE])
    assert lse.shape == (0,)
    assert_close(loss, 0.0, st, what="empty loss")
    ins = [to_device(x, dtype), to_device(target, "int64"), to_device(np.zeros(0), st), to_device(np.array(1.0), st)]
    assert run("cross_entropy_backward", ins, [IGNORE])[0].shape == (0, 5)


def f32(*shape):
    return to_device(randn(*shape), "float32")


def i64(values):
    return to_device(np.array(values, dtype=np.int64), "int64")


def scalar():
    return to_device(np.array(1.0), "float32")


@pytest.mark.parametrize("op", ["cross_entropy", "cross_entropy_backward"])
@pytest.mark.parametrize("bad", [5, 7, -1, -101])
def test_cross_entropy_bad_target(op, bad):
    inputs = [f32(3, 5), i64([0, bad, 4])]
    if op == "cross_entropy_backward":
        inputs += [f32(3), scalar()]
    with pytest.raises(IndexError, match=rf"target {bad} at row 1 is out of range \[0, 5\)"):
        run(op, inputs, [IGNORE])


@pytest.mark.parametrize(
    "op, inputs, match",
    [
        ("cross_entropy", lambda: [f32(3, 5), to_device(np.zeros(3), "int32")], "target must be int64"),
        ("cross_entropy", lambda: [f32(3, 5), i64([0, 1])], r"target must have shape \[3\]"),
        ("cross_entropy", lambda: [f32(15), i64([0])], "logits must be 2-d"),
        ("cross_entropy", lambda: [to_device(np.ones((3, 5)), "int64"), i64([0, 1, 2])], "must be float32"),
        ("cross_entropy_backward", lambda: [f32(3, 5), i64([0, 1, 2]), f32(4), scalar()], r"lse must have shape \[3\]"),
        (
            "cross_entropy_backward",
            lambda: [f32(3, 5), i64([0, 1, 2]), to_device(randn(3), "float64"), scalar()],
            "lse must be float32",
        ),
        ("cross_entropy_backward", lambda: [f32(3, 5), i64([0, 1]), f32(3), scalar()], r"target must have shape \[3\]"),
        ("cross_entropy_backward", lambda: [f32(3, 5), i64([0, 1, 2]), f32(3), f32(2)], r"grad must have shape \[\]"),
        ("cross_entropy_backward", lambda: [f32(15), i64([0]), f32(1), scalar()], "logits must be 2-d"),
    ],
)
def test_cross_entropy_errors(op, inputs, match):
    with pytest.raises(ValueError, match=match):
        run(op, inputs(), [IGNORE])


def test_cross_entropy_backward_attr_type():
    with pytest.raises(ValueError, match="'ignore_index' must be an int"):
        run("cross_entropy_backward", [f32(3, 5), i64([0, 1, 2]), f32(3), scalar()], [1.5])
