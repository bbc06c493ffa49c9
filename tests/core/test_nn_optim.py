"""nn modules, AdamW, SGD, the schedule and gradient clipping against NumPy
implementations of the same formulas, on fresh random inputs."""

import math

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, assert_close, rng, round_to
from infinitrain import nn
from infinitrain.optim import SGD, AdamW, WarmupCosine, clip_grad_norm_, warmup_cosine_lr


def t(a, dtype="float32", requires_grad=False):
    return it.from_numpy(np.asarray(a), dtype=dtype, device=DEVICE, requires_grad=requires_grad)


def r32(a):
    return np.asarray(a, np.float32).astype(np.float64)


def test_linear_forward_backward():
    m = nn.Linear(5, 3, device=DEVICE)
    x = rng().standard_normal((4, 5))
    w, b = m.weight.numpy().astype(np.float64), rng().standard_normal(3)
    m.bias.copy_(t(b))
    xt = t(x, requires_grad=True)
    y = m(xt)
    assert_close(y, r32(x) @ w.T + r32(b), "float32")
    g = rng().standard_normal((4, 3))
    y.backward(t(g))
    assert_close(m.weight.grad, r32(g).T @ r32(x), "float32")
    assert_close(m.bias.grad, r32(g).sum(0), "float32")
    assert_close(xt.grad, r32(g) @ w, "float32")


def test_embedding():
    emb = nn.Embedding(7, 4, device=DEVICE)
    idx = rng().integers(0, 7, size=(2, 3))
    assert_close(emb(t(idx, "int64")), emb.weight.numpy()[idx], "float32")


@pytest.mark.parametrize("rms", [False, True])
def test_layernorm_and_rmsnorm_modules_with_weights_and_bias(rms):
    """Weights away from 1 and a nonzero bias (a module that ignored either would pass with the defaults)."""
    gen = rng()
    x, w, b, g = (
        gen.standard_normal((3, 4, 6)),
        1 + gen.standard_normal(6),
        gen.standard_normal(6),
        gen.standard_normal((3, 4, 6)),
    )
    x, w, b, g = r32(x), r32(w), r32(b), r32(g)
    eps = 1e-6 if rms else 1e-5
    m = nn.RMSNorm(6, eps=eps, device=DEVICE) if rms else nn.LayerNorm(6, eps=eps, device=DEVICE)
    m.weight.copy_(t(w))
    if not rms:
        m.bias.copy_(t(b))
    mu = 0.0 if rms else x.mean(-1, keepdims=True)
    var = (x * x).mean(-1, keepdims=True) if rms else x.var(-1, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    xhat = (x - mu) * rstd
    xt = t(x, requires_grad=True)
    y = m(xt)
    assert_close(y, xhat * w + (0.0 if rms else b), "float32", what="forward")
    y.backward(t(g))
    d = g * w
    dx = rstd * (d - (0.0 if rms else d.mean(-1, keepdims=True)) - xhat * (d * xhat).mean(-1, keepdims=True))
    assert_close(xt.grad, dx, "float32", what="dx")
    assert_close(m.weight.grad, (g * xhat).sum((0, 1)), "float32", what="dweight")
    if not rms:
        assert_close(m.bias.grad, g.sum((0, 1)), "float32", what="dbias")


def test_dropout_module_train_and_eval():
    d = nn.Dropout(0.25)
    x = t(rng().standard_normal((64, 64)) + 3.0)
    y = d(x).numpy()
    kept = y != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(y[kept], x.numpy()[kept] / 0.75, rtol=1e-6)
    d.eval()
    assert d(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        nn.Dropout(1.0)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 4, device=DEVICE)
        self.blocks = nn.ModuleList([nn.Linear(4, 4, device=DEVICE) for _ in range(2)])
        self.seq = nn.Sequential(nn.LayerNorm(4, device=DEVICE), nn.Linear(4, 2, bias=False, device=DEVICE))

    def forward(self, x):
        x = self.a(x)
        for b in self.blocks:
            x = b(x).relu()
        return self.seq(x)


def test_module_registry_and_state_dict_round_trip():
    m = Tiny()
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "a.weight",
        "a.bias",
        "blocks.0.weight",
        "blocks.0.bias",
        "blocks.1.weight",
        "blocks.1.bias",
        "seq.0.weight",
        "seq.0.bias",
        "seq.1.weight",
    ]
    other = Tiny()
    other.load_state_dict({k: v.numpy() for k, v in m.state_dict().items()})
    x = t(rng().standard_normal((5, 3)))
    np.testing.assert_array_equal(m(x).numpy(), other(x).numpy())
    with pytest.raises(KeyError, match="missing keys"):
        other.load_state_dict({"a.weight": m.a.weight})
    with pytest.raises(ValueError, match="has shape"):
        other.load_state_dict({**m.state_dict(), "a.bias": np.zeros(5, np.float32)})


def adamw_reference(p, grads, lr, b1, b2, eps, wd):
    """(p, m, v) after the steps."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for step, g in enumerate(grads, 1):
        p = p - lr * wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + eps)
    return p, m, v


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adamw_matches_numpy(dtype):
    """Two parameters of one group (one foreach_adamw_ a step): the parameters and PyTorch's state entries
    (exp_avg, exp_avg_sq) follow NumPy's AdamW."""
    shapes = [(5, 7), (3,)]
    p0 = [rng().standard_normal(s) for s in shapes]
    grads = [[rng().standard_normal(s) for s in shapes] for _ in range(5)]
    ps = [nn.Parameter(t(a, dtype)) for a in p0]
    opt = AdamW(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for gs in grads:
        for p, g in zip(ps, gs, strict=True):
            p.grad = t(g, dtype)
        opt.step()
    state = opt.state_dict()["state"]
    for i, p in enumerate(ps):
        ref_p, ref_m, ref_v = adamw_reference(p0[i], [gs[i] for gs in grads], 0.01, 0.8, 0.95, 1e-6, 0.1)
        # Five float32 steps round p, m and v each time, yet stay within float32's tolerance (measured: 0.03 of it).
        assert_close(p, ref_p, dtype)
        assert_close(state[i]["exp_avg"], ref_m, dtype, what="exp_avg")
        assert_close(state[i]["exp_avg_sq"], ref_v, dtype, what="exp_avg_sq")


def test_sgd_momentum_matches_numpy():
    p0 = rng().standard_normal(6)
    grads = [rng().standard_normal(6) for _ in range(3)]
    p = nn.Parameter(t(p0, "float64"))
    opt = SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    ref, buf = p0.copy(), None
    for g in grads:
        p.grad = t(g, "float64")
        opt.step()
        d = g + 0.01 * ref
        buf = d if buf is None else 0.9 * buf + d
        ref = ref - 0.1 * buf
    np.testing.assert_allclose(p.numpy(), ref, rtol=1e-12)


def test_optimizer_state_round_trip():
    p = nn.Parameter(t(rng().standard_normal(4)))
    q = nn.Parameter(t(p.numpy()))
    a, b = AdamW([p], lr=0.1), AdamW([q], lr=0.1)
    p.grad = t(rng().standard_normal(4))
    a.step()
    b.load_state_dict(a.state_dict())
    q.copy_(p)
    g = t(rng().standard_normal(4))
    p.grad, q.grad = g, g
    a.step()
    b.step()
    np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_warmup_cosine_schedule():
    lrs = [warmup_cosine_lr(s, 1.0, 4, 20, 0.1) for s in range(25)]
    np.testing.assert_allclose(lrs[:4], [0.25, 0.5, 0.75, 1.0])
    for s in range(4, 20):
        want = 0.1 + 0.5 * (1 + math.cos(math.pi * (s - 4) / 16)) * 0.9
        assert lrs[s] == pytest.approx(want)
    assert lrs[20:] == [pytest.approx(0.1)] * 5
    opt = SGD([nn.Parameter(t(np.ones(2)))], lr=2.0)
    sched = WarmupCosine(opt, 2, 10)
    assert opt.lr == pytest.approx(1.0)
    sched.step()
    assert opt.lr == pytest.approx(2.0)


def test_warmup_cosine_min_lr_ratio_bounds():
    """min_lr_ratio is any value in [0, 1]: 0 decays to zero (the cosine's end point, 0.5 * (1 + cos(pi)) = 0) and
    1 holds max_lr after warmup; outside [0, 1] or NaN is refused."""
    for ratio, end in ((0.0, 0.0), (1.0, 2.0)):
        opt = SGD([nn.Parameter(t(np.ones(2)))], lr=2.0)
        sched = WarmupCosine(opt, 2, 6, min_lr_ratio=ratio)
        seen = [opt.lr] + [sched.step() for _ in range(7)]
        assert seen[:2] == [1.0, 2.0]  # warmup: (step + 1) / 2 * max_lr
        assert seen[6:] == [end, end]
        if ratio == 1.0:
            assert seen[2:] == [2.0] * 6
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="min_lr_ratio must be in"):
            WarmupCosine(SGD([nn.Parameter(t(np.ones(2)))], lr=2.0), 2, 6, min_lr_ratio=bad)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm(max_norm):
    ps = [nn.Parameter(t(np.zeros(s))) for s in [(3, 4), (5,), (2, 2, 2)]]
    gs = [rng().standard_normal(p.shape) for p in ps]
    for p, g in zip(ps, gs, strict=True):
        p.grad = t(g)
    total = math.sqrt(sum((r32(g) ** 2).sum() for g in gs))
    norm = clip_grad_norm_(ps, max_norm)
    assert norm.item() == pytest.approx(total, rel=1e-6)
    coef = min(1.0, max_norm / (total + 1e-6))
    for p, g in zip(ps, gs, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), r32(g) * coef, rtol=1e-5, atol=1e-7)


def test_optimizer_bad_arguments():
    with pytest.raises(ValueError, match="empty parameter list"):
        AdamW([])
    with pytest.raises(ValueError, match="betas"):
        AdamW([nn.Parameter(t(np.ones(2)))], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match=r"betas\[0\]"):
        AdamW([nn.Parameter(t(np.ones(2)))], betas=(-float(rng().uniform(1e-3, 1.0)), 0.9))
    with pytest.raises(ValueError, match="learning rate"):
        SGD([nn.Parameter(t(np.ones(2)))], lr=-1.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_runs_matmuls_in_low_precision(dtype):
    a, b = t(rng().standard_normal((4, 8))), t(rng().standard_normal((8, 3)))
    with it.amp.autocast(DEVICE, dtype=dtype):
        y = a @ b
        p = it.functional.softmax(y, -1)
    assert y.dtype == dtype and p.dtype == "float32"
    # The product of the operands rounded to dtype, at dtype's tolerance (a float32 product would be off by more).
    ref = round_to(a.numpy(), dtype) @ round_to(b.numpy(), dtype)
    assert_close(y, ref, dtype)
    assert np.abs(y.numpy().astype(np.float64) - r32(a.numpy()) @ r32(b.numpy())).max() > 0
    # As PyTorch: a dtype autocast cannot lower to disables it with a warning; other dtypes are errors.
    with pytest.warns(UserWarning, match="autocast is disabled"), it.amp.autocast(DEVICE, dtype="float32"):
        assert (a @ b).dtype == "float32"
    with pytest.raises(ValueError, match="autocast dtype"):
        it.amp.autocast(DEVICE, dtype="int64")


def test_sgd_momentum_survives_a_round_trip_into_a_fresh_optimizer():
    p0 = rng().standard_normal(5)
    grads = [rng().standard_normal(5) for _ in range(4)]
    a = nn.Parameter(t(p0, "float64"))
    opt_a = SGD([a], lr=0.1, momentum=0.9)
    for g in grads[:2]:
        a.grad = t(g, "float64")
        opt_a.step()
    b = nn.Parameter(t(a.numpy(), "float64"))
    opt_b = SGD([b], lr=0.1, momentum=0.9)
    opt_b.load_state_dict(opt_a.state_dict())
    for g in grads[2:]:
        a.grad, b.grad = t(g, "float64"), t(g, "float64")
        opt_a.step()
        opt_b.step()
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(KeyError, match="unexpected"):
        opt_b.load_state_dict({"step": 1, "lr": 0.1, "tensors": {"bogus.0": np.zeros(5)}})
