"""Defaults and rarely used options of the tensor layer, checked by their effect against float64 NumPy or a hand
computation: ReduceLROnPlateau's default min_lr, WarmupCosine's total_steps bound, triplet_margin_loss's default
p, RMSNorm's default weight, sub's scalar alpha, squeeze's negative dim, bool() of an empty tensor, unbatched
conv1d, int32 embedding ids, 2-d multinomial, and softmax's dtype outside autocast."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng


def t64(a):
    return it.tensor(np.asarray(a, dtype=np.float64), dtype="float64", device=DEVICE)


def test_plateau_default_min_lr_lets_lr_fall_below_one():
    """ReduceLROnPlateau's default min_lr is 0: a plateau scales lr by factor, never raises it to a floor."""
    lr = rng().uniform(0.05, 0.5)
    opt = it.optim.SGD([it.nn.Parameter(t64([1.0]))], lr=lr)
    sched = it.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    sched.step(1.0)
    sched.step(1.0)  # no improvement, patience 0: one reduction
    assert opt.param_groups[0]["lr"] == pytest.approx(lr * 0.5, rel=1e-12)


def test_warmup_cosine_refuses_zero_total_steps():
    """total_steps=0 would divide by zero in the schedule; it is refused when the scheduler is built."""
    opt = it.optim.SGD([it.nn.Parameter(t64([1.0]))], lr=0.1)
    with pytest.raises(ValueError, match="total_steps"):
        it.optim.WarmupCosine(opt, 0, 0)


def test_triplet_margin_loss_default_is_euclidean():
    """triplet_margin_loss without p uses the 2-norm (PyTorch's default), pairwise eps included."""
    g = rng()
    a, pos, neg = (g.standard_normal((5, 7)) for _ in range(3))
    got = it.nn.functional.triplet_margin_loss(t64(a), t64(pos), t64(neg)).item()
    d = lambda u, v: np.linalg.norm(u - v + 1e-6, axis=-1)  # noqa: E731
    want = np.maximum(d(a, pos) - d(a, neg) + 1.0, 0.0).mean()
    assert got == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_rmsnorm_default_weight_is_identity_scale():
    """A fresh RMSNorm (elementwise_affine default) returns x / rms(x): its weight starts at ones."""
    x = rng().standard_normal((3, 8))
    norm = it.nn.RMSNorm(8, eps=1e-6, device=DEVICE, dtype="float64")
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(norm(t64(x)).numpy(), want, rtol=1e-10, atol=1e-12)


def test_sub_scales_a_scalar_other_by_alpha():
    """it.sub(t, s, alpha=a) is t - a*s also when s is a Python number."""
    g = rng()
    x, s, a = g.standard_normal(4), float(g.uniform(1.5, 4.0)), float(g.uniform(1.5, 3.0))
    np.testing.assert_allclose(it.sub(t64(x), s, alpha=a).numpy(), x - a * s, rtol=1e-12)


def test_squeeze_takes_negative_dims():
    """squeeze(-1) and squeeze(-3) count from the end, as PyTorch."""
    x = t64(rng().standard_normal((1, 4, 1)))
    assert x.squeeze(-1).shape == (1, 4)
    assert x.squeeze(-3).shape == (4, 1)
    with pytest.raises(IndexError):
        x.squeeze(-4)


def test_bool_of_an_empty_tensor_is_ambiguous():
    """bool() of a tensor with no elements raises RuntimeError, as one with several."""
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(it.zeros(0))


def test_conv1d_unbatched_input_returns_unbatched_output():
    """conv1d on [C, L] returns [O, L'] with the values of the batched call."""
    g = rng()
    x, w = g.standard_normal((2, 6)), g.standard_normal((3, 2, 3))
    got = it.nn.functional.conv1d(t64(x), t64(w)).numpy()
    want = np.stack([[sum(np.dot(w[o, c], x[c, i : i + 3]) for c in range(2)) for i in range(4)] for o in range(3)])
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_embedding_takes_int32_ids():
    """embedding accepts int32 indices (PyTorch does) and looks up the same rows as int64 ones."""
    g = rng()
    w, ids = g.standard_normal((6, 3)), g.integers(0, 6, size=5)
    got = it.nn.functional.embedding(it.tensor(ids.astype(np.int32), dtype="int32", device=DEVICE), t64(w))
    np.testing.assert_array_equal(got.numpy(), w[ids])


def test_multinomial_samples_each_row_of_a_2d_input():
    """multinomial on [N, C] returns [N, k] ids; a one-hot row can only give its hot category."""
    hot = rng().integers(0, 4, size=3)
    p = np.zeros((3, 4))
    p[np.arange(3), hot] = rng().uniform(0.5, 2.0, size=3)
    out = it.multinomial(t64(p), 2, replacement=True).numpy()
    assert out.shape == (3, 2)
    np.testing.assert_array_equal(out, np.repeat(hot[:, None], 2, axis=1))


def test_softmax_keeps_float16_outside_autocast():
    """Outside autocast, softmax of float16 stays float16: the float32 upcast is autocast's policy only."""
    x = rng().standard_normal((2, 5))
    out = it.softmax(it.tensor(x, dtype="float16", device=DEVICE), -1)
    assert out.dtype == "float16"
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy().astype(np.float64), e / e.sum(-1, keepdims=True), atol=2e-3)


def test_to_the_same_device_returns_self():
    """x.to(d) with d naming x's own device (as a string or an it.device) is x itself, as PyTorch: no copy."""
    x = it.tensor(rng().standard_normal(3), device=DEVICE)
    for d in (DEVICE, str(x.device), it.device(DEVICE), "".join(list(DEVICE))):  # the last one: a fresh string
        assert x.to(d) is x


def test_to_its_own_dtype_returns_self():
    """x.to(dtype) with dtype naming x's own dtype, even as a string built at run time, is x itself, as PyTorch."""
    x = it.tensor(rng().standard_normal(3), dtype="float32", device=DEVICE)
    for d in ("float32", "".join(["float", "32"]), it.float32):
        assert x.to(d) is x and x.to(DEVICE, d) is x


class _Cube(it.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3.0 * x * x


def test_custom_function_records_its_backward():
    """Function.apply on an input requiring grad records the user's backward: x.grad = 3 x^2 * upstream."""
    g = rng()
    x0, up = g.standard_normal(5), g.standard_normal(5)
    x = it.nn.Parameter(t64(x0))
    y = _Cube.apply(x)
    assert y.requires_grad
    y.backward(t64(up))
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * x0**2 * up, rtol=1e-12)
    assert not _Cube.apply(t64(x0)).requires_grad  # no input needs grad: no graph
