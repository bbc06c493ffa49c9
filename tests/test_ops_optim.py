"""adamw_ CPU kernel: several in-place steps against a float64 NumPy AdamW with the same storage rounding."""

import numpy as np
import pytest

from harness import assert_close, randn, rng, round_to, run, to_device

DTYPES = ("float32", "bfloat16", "float16", "float64")


def stat_dtype(dtype):
    return "float64" if dtype == "float64" else "float32"


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
