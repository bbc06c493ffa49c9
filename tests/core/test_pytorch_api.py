"""PyTorch's names and semantics: type promotion, indexing and assignment, attention and losses as PyTorch
defines them, the nn layers, initialisers, optimizers with param_groups, GradScaler, it.save/it.load and
pickling, sampling. Results are checked against float64 NumPy (or exact) references on fresh random inputs."""

import math
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn as nn
from harness import DEVICE, assert_close, rng
from infinitrain.nn import functional as F


def t(a, dtype=None, **kw):
    return it.tensor(np.asarray(a), dtype=dtype, device=DEVICE, **kw)


def f32(*shape):
    return rng().standard_normal(shape).astype(np.float32)


# ---- type promotion -------------------------------------------------------------------------------------------


def test_promotion_follows_pytorch():
    a = rng().integers(-50, 50, size=(3, 4))
    x = t(a)  # int64
    y = x * 0.5
    assert y.dtype == "float32"
    np.testing.assert_array_equal(y.numpy(), (a * 0.5).astype(np.float32))
    z = x + 3
    assert z.dtype == "int64"
    np.testing.assert_array_equal(z.numpy(), a + 3)
    b = rng().integers(-50, 50, size=(4,))
    w = x * t(b)
    assert w.dtype == "int64"
    np.testing.assert_array_equal(w.numpy(), a * b)
    q = x / t(b + 100)
    assert q.dtype == "float32"
    np.testing.assert_allclose(q.numpy(), a / (b + 100), rtol=1e-6)
    m = rng().random((3, 4)) < 0.5
    mb = t(m)
    s = mb + x
    assert s.dtype == "int64"
    np.testing.assert_array_equal(s.numpy(), m + a)
    assert (mb * 2).dtype == "int64"
    assert (mb * 2.5).dtype == "float32"
    h = t(f32(3, 4), "bfloat16") + t(f32(3, 4), "float16")
    assert h.dtype == "float32"
    d = t(f32(4)) + t(rng().standard_normal(4), "float64")
    assert d.dtype == "float64"
    assert (t(a, "int32") + x).dtype == "int64"
    np.testing.assert_array_equal((-x).numpy(), -a)
    np.testing.assert_array_equal((2 - x).numpy(), 2 - a)
    np.testing.assert_allclose((1.0 / t(b + 100)).numpy(), 1.0 / (b + 100), rtol=1e-6)
    assert int(x.sum().item()) == int(a.sum()) and x.sum().dtype == "int64"
    np.testing.assert_array_equal((mb & t(~m)).numpy(), np.zeros_like(m))
    np.testing.assert_array_equal((mb | t(~m)).numpy(), np.ones_like(m))
    np.testing.assert_array_equal((~mb).numpy(), ~m)
    np.testing.assert_array_equal((x == 3).numpy(), a == 3)
    assert it.cat([x, t(a, "float32")]).dtype == "float32"


def test_zero_dim_tensors_promote_like_scalars():
    """PyTorch's result_type: a 0-d tensor beside a tensor with dimensions counts as a scalar of its category, so
    it changes the dtype only when its category (bool < integers < floats) is higher, and then gives its own."""
    g = rng()
    xb = t(g.standard_normal((3, 4)).astype(np.float32), "bfloat16")
    xv = xb.numpy().astype(np.float64)  # the bfloat16 values
    c = float(g.integers(2, 6))
    for y in (xb * t(np.float32(c)), t(np.float32(c)) * xb):
        assert y.dtype == "bfloat16"
        assert_close(y, xv * c, "bfloat16")
    assert (xb + t(np.float64(1.5))).dtype == "bfloat16"
    assert (t(f32(2), "float16") - t(np.float32(0.25), "bfloat16")).dtype == "float16"
    f = t(f32(5))
    assert (f * t(g.standard_normal(()), "float64")).dtype == "float32"
    a = g.integers(-50, 50, size=(3, 4))
    x = t(a)  # int64
    half = t(np.float32(0.5))  # it.tensor(0.5): the default float dtype
    for y in (x * half, half * x):
        assert y.dtype == "float32"
        np.testing.assert_array_equal(y.numpy(), (a * 0.5).astype(np.float32))
    assert (x * t(np.float64(0.5))).dtype == "float64"  # a higher category: the 0-d tensor's own dtype
    ai = g.integers(-1000, 1000, size=(6,))
    xi = t(ai, "int32")
    k = int(g.integers(-9, 10))
    y = xi * t(np.int64(k))
    assert y.dtype == "int32"
    np.testing.assert_array_equal(y.numpy(), ai * k)
    m = g.random((3, 4)) < 0.5
    y = t(m) + t(np.int64(k))
    assert y.dtype == "int64"
    np.testing.assert_array_equal(y.numpy(), m + k)
    np.testing.assert_array_equal((x < half).numpy(), a < 0.5)
    w = it.where(t(m), xb, t(np.float32(0.0)))
    assert w.dtype == "bfloat16"
    np.testing.assert_array_equal(w.numpy(), np.where(m, xv, 0.0))
    # Two 0-d tensors, or two with dimensions, follow the ordinary rules.
    assert (t(np.int32(2)) + t(np.float64(1.5))).dtype == "float64"
    assert (t(np.float32(2.0), "bfloat16") + t(np.float32(1.0))).dtype == "float32"
    assert (xb + t(f32(4))).dtype == "float32"
    # Gradients go back through the cast, each in its tensor's dtype.
    xg = t(g.standard_normal((3, 4)).astype(np.float32), "bfloat16", requires_grad=True)
    s = t(np.float32(g.standard_normal()), requires_grad=True)
    out = xg * s
    assert out.dtype == "bfloat16"
    out.sum().backward()
    assert xg.grad.dtype == "bfloat16" and s.grad.dtype == "float32"
    assert_close(s.grad, xg.numpy().astype(np.float64).sum(), "bfloat16", atol=1e-2)


def test_arange_full_and_random_integers():
    np.testing.assert_array_equal(it.arange(0, 10).numpy(), np.arange(10))
    assert it.arange(5).dtype == "int64" and it.arange(0, 1, 0.25).dtype == "float32"
    np.testing.assert_allclose(it.arange(1, 2, 0.25).numpy(), np.arange(1, 2, 0.25))
    np.testing.assert_array_equal(it.arange(10, 0, -3).numpy(), np.arange(10, 0, -3))
    assert it.full((2,), 7).dtype == "int64" and it.full((2,), 7.0).dtype == "float32"
    assert it.full((2,), True).dtype == "bool"
    with pytest.raises(ValueError, match="step"):
        it.arange(0, 3, 0)
    g1, g2 = it.Generator().manual_seed(5), it.Generator().manual_seed(5)
    r1 = it.randint(3, 9, (1000,), generator=g1)
    r2 = it.randint(3, 9, (1000,), generator=g2)
    np.testing.assert_array_equal(r1.numpy(), r2.numpy())  # a generator's stream, reproducible
    assert r1.dtype == "int64" and r1.numpy().min() >= 3 and r1.numpy().max() <= 8
    assert set(r1.numpy().tolist()) == set(range(3, 9))  # every value appears (1000 draws of 6)
    assert not np.array_equal(it.randint(3, 9, (1000,), generator=g1).numpy(), r1.numpy())
    assert sorted(it.randperm(50).tolist()) == list(range(50))


# ---- indexing and assignment ----------------------------------------------------------------------------------


def test_advanced_indexing_matches_numpy_and_differentiates():
    a = rng().standard_normal((4, 5, 6))
    x = t(a, "float64", requires_grad=True)
    np.testing.assert_array_equal(x[:, [-1], :].numpy(), a[:, [-1], :])
    ids = rng().integers(-5, 5, size=(2, 3))
    np.testing.assert_array_equal(x[:, ids].numpy(), a[:, ids])
    # An int selects first, as in PyTorch (NumPy would move the index dims to the front here).
    np.testing.assert_array_equal(x[1, :, t(ids % 6)].numpy(), a[1][:, ids % 6])
    mask = rng().random((4, 5)) < 0.5
    np.testing.assert_array_equal(x[t(mask)].numpy(), a[mask])
    np.testing.assert_array_equal(x[..., [0, 2]].numpy(), a[..., [0, 2]])
    rows = [3, 0, 3]
    g = rng().standard_normal((3, 5, 6))
    (x[rows] * t(g, "float64")).sum().backward()
    want = np.zeros_like(a)
    np.add.at(want, rows, g)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)
    with pytest.raises(IndexError, match="out of range"):
        x[:, [5]]
    with pytest.raises(NotImplementedError, match="more than one"):
        x[[0], [1]]


def test_setitem_and_inplace_ops():
    a = rng().standard_normal((4, 6)).astype(np.float32)
    x = t(a)
    view = x.view(24)  # shares storage, as in PyTorch
    b = a.copy()
    x[1:3, ::2] = 7.0
    b[1:3, ::2] = 7.0
    v = rng().standard_normal((4, 2)).astype(np.float32)
    x[:, [0, 5]] = t(v)
    b[:, [0, 5]] = v
    m = rng().random((4, 6)) < 0.3
    x[t(m)] = -1.0
    b[m] = -1.0
    x.masked_fill_(t(b > 1.0), 2.0)
    b[b > 1.0] = 2.0
    np.testing.assert_array_equal(x.numpy(), b)
    np.testing.assert_array_equal(view.numpy(), b.reshape(24))
    x += 1
    x *= t(np.full(6, 2.0, np.float32))
    np.testing.assert_allclose(x.numpy(), (b + 1) * 2, rtol=1e-6)
    ints = t(np.arange(6))
    ints[ints > 2] = 0
    np.testing.assert_array_equal(ints.numpy(), [0, 1, 2, 0, 0, 0])
    p = nn.Parameter(t(a))
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        p[0] = 1.0
    with it.no_grad():
        p -= 0.5 * t(a)  # a hand-written SGD step updates the Parameter itself
    np.testing.assert_allclose(p.numpy(), 0.5 * a, rtol=1e-6)
    # Assignment into a graph tensor: the gradient reaches the written value.
    w = t(f32(3), requires_grad=True)
    y = t(a, requires_grad=True) * 1.0
    y[0, :3] = w
    (y * y).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy(), rtol=1e-6)


def test_inplace_writes_into_a_graph_tensor_keep_the_gradient_of_the_kept_elements():
    a = f32(4, 6)
    w = t(f32(3), requires_grad=True)
    leaf = t(a, requires_grad=True)
    y = leaf * 1.0
    y[0, :3] = w
    (y * y).sum().backward()
    gy = 2 * a  # d sum(y^2) / d leaf: 2 * leaf where it was kept, 0 where w overwrote it
    gy[0, :3] = 0
    assert leaf.grad is not None, "setitem: no gradient reached the tensor y was computed from"
    np.testing.assert_allclose(leaf.grad.numpy(), gy, rtol=1e-6)
    leaf = t(a, requires_grad=True)
    y = leaf * 2.0
    y += 1.0
    (y * y).sum().backward()
    assert leaf.grad is not None, "+=: no gradient reached the tensor y was computed from"
    np.testing.assert_allclose(leaf.grad.numpy(), 4 * (2 * a + 1), rtol=1e-6)


# ---- attention, losses, activations ---------------------------------------------------------------------------


def _attention_ref(q, k, v, mask=None, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_sdpa_defaults_masks_and_grouped_heads():
    q, k, v = (rng().standard_normal((2, 4, 5, 8)) for _ in range(3))
    tq, tk, tv = (t(a, "float64") for a in (q, k, v))
    assert_close(F.scaled_dot_product_attention(tq, tk, tv), _attention_ref(q, k, v), "float64")  # not causal
    assert_close(
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=True), _attention_ref(q, k, v, causal=True), "float64"
    )
    mask = rng().random((5, 5)) < 0.7
    mask[:, 0] = True
    assert_close(
        F.scaled_dot_product_attention(tq, tk, tv, attn_mask=t(mask)), _attention_ref(q, k, v, mask), "float64"
    )
    bias = rng().standard_normal((2, 1, 5, 5))
    assert_close(
        F.scaled_dot_product_attention(tq, tk, tv, t(bias, "float64")), _attention_ref(q, k, v, bias), "float64"
    )
    k2, v2 = k[:, :2], v[:, :2]  # 4 query heads over 2 kv heads
    ref = _attention_ref(q, np.repeat(k2, 2, 1), np.repeat(v2, 2, 1), mask)
    got = F.scaled_dot_product_attention(tq, t(k2, "float64"), t(v2, "float64"), t(mask), enable_gqa=True)
    assert_close(got, ref, "float64")
    with pytest.raises(TypeError, match="is_causal=True"):
        F.scaled_dot_product_attention(tq, tk, tv, True)
    out = F.scaled_dot_product_attention(tq, tk, tv, dropout_p=0.5)
    assert out.shape == (2, 4, 5, 8) and not np.allclose(out.numpy(), _attention_ref(q, k, v))


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_reductions_smoothing_and_ignored(reduction, smoothing):
    n, c = 7, 5
    x = rng().standard_normal((n, c))
    y = rng().integers(0, c, size=n)
    y[rng().random(n) < 0.3] = -100
    y[0] = 1
    lp = _log_softmax(x)
    rows = -(1 - smoothing) * lp[np.arange(n), np.where(y >= 0, y, 0)] - smoothing * lp.mean(-1)
    rows = np.where(y >= 0, rows, 0.0)
    want = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / (y >= 0).sum()}[reduction]
    xt = t(x, "float64", requires_grad=True)
    got = F.cross_entropy(xt, t(y, "int32"), reduction=reduction, label_smoothing=smoothing)
    assert_close(got, want, "float64", rtol=1e-9)
    got.sum().backward()
    sm = np.exp(lp)
    gy = sm - (1 - smoothing) * np.eye(c)[np.where(y >= 0, y, 0)] - smoothing / c
    gy = np.where((y >= 0)[:, None], gy, 0.0)
    if reduction == "mean":
        gy = gy / (y >= 0).sum()
    assert_close(xt.grad, gy, "float64", rtol=1e-9)


def test_cross_entropy_edge_cases():
    x = t(f32(4, 3))
    assert math.isnan(F.cross_entropy(x, t(np.full(4, -100))).item())  # PyTorch: mean over nothing is NaN
    assert F.cross_entropy(x, t(np.full(4, -100)), reduction="sum").item() == 0.0
    a = rng().standard_normal((2, 3, 4))  # [N, C, d]: classes in dim 1
    y = rng().integers(0, 3, size=(2, 4))
    lp = _log_softmax(np.moveaxis(a, 1, -1))
    want = -np.take_along_axis(lp, y[..., None], -1)[..., 0]
    assert_close(F.cross_entropy(t(a, "float64"), t(y), reduction="none"), want, "float64")
    assert_close(nn.CrossEntropyLoss()(t(a, "float64"), t(y)), want.mean(), "float64")


def test_exact_gelu_and_its_gradient():
    a = np.concatenate([rng().standard_normal(200) * 3, [-12.0, -6.0, 0.0, 6.0]])
    erf = np.vectorize(math.erf)
    x = t(a, "float64", requires_grad=True)
    y = nn.GELU()(x)
    assert_close(y, 0.5 * a * (1 + erf(a / math.sqrt(2))), "float64", rtol=3e-7, atol=1e-12)  # erfc to 1.2e-7
    y.sum().backward()
    cdf, pdf = 0.5 * (1 + erf(a / math.sqrt(2))), np.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    # The gradient is the approximation's derivative: its error is absolute (measured 9e-8), not relative.
    assert_close(x.grad, cdf + a * pdf, "float64", rtol=3e-7, atol=2e-7)
    x32 = t(a.astype(np.float32))
    assert_close(F.gelu(x32), 0.5 * a * (1 + erf(a / math.sqrt(2))), "float32")
    tanh = 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
    assert_close(F.gelu(t(a, "float64"), approximate="tanh"), tanh, "float64")


def test_topk_multinomial_one_hot():
    a = rng().standard_normal((3, 9))
    v, i = it.topk(t(a, "float64"), 4)
    order = np.argsort(-a, -1, kind="stable")[:, :4]
    np.testing.assert_array_equal(i.numpy(), order)
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(a, order, -1))
    v2, i2 = t(a, "float64").topk(2, dim=0, largest=False)
    np.testing.assert_array_equal(i2.numpy(), np.argsort(a, 0, kind="stable")[:2])
    p = rng().random((2, 6))
    p[0, 2] = 0.0
    draws = it.multinomial(t(p), 4000, replacement=True, generator=it.Generator().manual_seed(1))
    assert draws.shape == (2, 4000) and (draws.numpy()[0] != 2).all()
    freq = np.stack([np.bincount(r, minlength=6) / 4000 for r in draws.numpy()])
    np.testing.assert_allclose(freq, p / p.sum(1, keepdims=True), atol=0.05)  # > 6 sigma of a frequency
    once = it.multinomial(t(p), 5, generator=it.Generator().manual_seed(2)).numpy()
    assert all(len(set(r)) == 5 for r in once)  # without replacement
    with pytest.raises(ValueError, match="non-negative"):
        it.multinomial(t(-p), 1)
    ids = rng().integers(0, 5, size=7)
    np.testing.assert_array_equal(F.one_hot(t(ids), 5).numpy(), np.eye(5, dtype=np.int64)[ids])


# ---- nn ----------------------------------------------------------------------------------------------------------


def test_layers_buffers_apply_and_state_dict():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.ModuleDict({"fc": nn.Linear(6, 5), "act": nn.SiLU(), "id": nn.Identity()})
            self.norm = nn.LayerNorm(5, bias=False)
            self.emb = nn.Embedding(9, 6, padding_idx=0)
            self.register_buffer("scale", t(np.full(5, 2.0, np.float32)))
            self.register_buffer("cache", t(np.zeros(3, np.float32)), persistent=False)

        def forward(self, ids):
            h = self.body["id"](self.body["act"](self.body["fc"](self.emb(ids))))
            return self.norm(h) * self.scale

    net = Net().to(DEVICE)
    assert "norm.bias" not in net.state_dict() and net.norm.bias is None
    # PyTorch's order: a module's own parameters and buffers, then its children's.
    assert list(net.state_dict()) == ["scale", "body.fc.weight", "body.fc.bias", "norm.weight", "emb.weight"]
    assert [n for n, _ in net.named_buffers()] == ["scale", "cache"]
    ids = rng().integers(0, 9, size=(2, 3))
    out = net(t(ids, "int32"))
    e = net.emb.weight.numpy()[ids]
    np.testing.assert_array_equal(net.emb.weight.numpy()[0], 0.0)
    h = e @ net.body["fc"].weight.numpy().T.astype(np.float64) + net.body["fc"].bias.numpy()
    h = h / (1 + np.exp(-h))
    want = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * 2.0
    assert_close(out, want, "float32", rtol=1e-5, atol=1e-5)  # float32 through a linear, a norm and SiLU
    out.sum().backward()
    np.testing.assert_array_equal(net.emb.weight.grad.numpy()[0], 0.0)  # padding_idx gets no gradient
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and "Linear" in seen and seen.index("Linear") < seen.index("ModuleDict")
    bound = 1 / math.sqrt(6)  # PyTorch's default Linear init: U(-1/sqrt(in), 1/sqrt(in))
    w = nn.Linear(6, 500).weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound and abs(w.mean()) < 0.02
    k = nn.init.kaiming_uniform_(it.empty(300, 200), a=math.sqrt(5)).numpy()
    assert np.abs(k).max() <= 1 / math.sqrt(200) + 1e-7
    tn = nn.init.trunc_normal_(it.empty(4000), std=1.0, a=-1.0, b=1.5).numpy()
    assert tn.min() >= -1.0 and tn.max() <= 1.5 and tn.std() > 0.5
    other = Net()
    other.load_state_dict(net.state_dict())
    np.testing.assert_array_equal(other.body["fc"].weight.numpy(), net.body["fc"].weight.numpy())


def test_tied_weights_appear_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(7, 4)
            self.head = nn.Linear(4, 7, bias=False)
            self.wte.weight = self.head.weight

    m = Tied()
    assert list(m.state_dict()) == ["wte.weight", "head.weight"]  # as PyTorch
    assert len(list(m.parameters())) == 1


# ---- optimizers ---------------------------------------------------------------------------------------------------


def _adamw_ref(p, grads, lr, betas, eps, wd, l2=False):
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for step, g in enumerate(grads, 1):
        if l2:
            g = g + wd * p
        else:
            p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        mh, vh = m / (1 - betas[0] ** step), v / (1 - betas[1] ** step)
        p = p - lr * mh / (np.sqrt(vh) + eps)
    return p


@pytest.mark.parametrize("cls", ["AdamW", "Adam"])
def test_param_groups_have_their_own_lr_and_weight_decay(cls):
    a, b = rng().standard_normal((3, 4)), rng().standard_normal(4)
    pa, pb = nn.Parameter(t(a, "float64")), nn.Parameter(t(b, "float64"))
    opt = getattr(it.optim, cls)([{"params": [pa], "weight_decay": 0.1}, {"params": [pb], "lr": 0.05}], lr=0.01)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.05]
    ga = [rng().standard_normal((3, 4)) for _ in range(3)]
    gb = [rng().standard_normal(4) for _ in range(3)]
    for x, y in zip(ga, gb, strict=True):
        pa.grad, pb.grad = t(x, "float64"), t(y, "float64")
        opt.step()
    wd_b = opt.param_groups[1]["weight_decay"]
    assert wd_b == (0.01 if cls == "AdamW" else 0.0)  # the defaults fill what a group leaves out
    l2 = cls == "Adam"
    assert_close(pa, _adamw_ref(a, ga, 0.01, (0.9, 0.999), 1e-8, 0.1, l2), "float64", rtol=1e-9)
    assert_close(pb, _adamw_ref(b, gb, 0.05, (0.9, 0.999), 1e-8, wd_b, l2), "float64", rtol=1e-9)
    opt.param_groups[1]["lr"] = float("nan")
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    opt.param_groups[1]["lr"] = 0.05
    opt.zero_grad(set_to_none=False)
    assert pa.grad is not None and not pa.grad.numpy().any()
    opt.zero_grad()
    assert pa.grad is None
    with pytest.raises(ValueError, match="more than one"):
        it.optim.AdamW([{"params": [pa]}, {"params": [pa]}])


def test_optimizer_state_dict_is_pytorch_shaped_and_pickles():
    p = nn.Parameter(t(f32(5)))
    opt = it.optim.AdamW([p], lr=0.1)
    p.grad = t(f32(5))
    opt.step()
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"} and sd["param_groups"][0]["params"] == [0]
    back = pickle.loads(pickle.dumps(sd))
    q = nn.Parameter(t(p.numpy()))
    opt2 = it.optim.AdamW([q], lr=0.5)
    opt2.load_state_dict({"state": back["state"], "param_groups": back["param_groups"]})  # PyTorch's keys only
    assert opt2.param_groups[0]["lr"] == 0.1 and opt2.step_count == 1
    g = t(f32(5))
    p.grad, q.grad = g, g
    opt.step()
    opt2.step()
    np.testing.assert_array_equal(p.numpy(), q.numpy())
    m = pickle.loads(pickle.dumps(nn.Linear(3, 2).to(DEVICE).state_dict()))
    assert m["weight"].device == it.device(DEVICE) and m["weight"].shape == (2, 3)


def test_grad_scaler_skips_overflow_and_adapts_the_scale():
    p = nn.Parameter(t(np.ones(3, np.float32)))
    opt = it.optim.SGD([p], lr=0.1)
    scaler = it.amp.GradScaler(init_scale=8.0, growth_interval=2)
    loss = (p * t(np.array([1.0, 2.0, 3.0], np.float32))).sum()
    scaler.scale(loss).backward()
    np.testing.assert_array_equal(p.grad.numpy(), [8.0, 16.0, 24.0])
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(p.numpy(), [0.9, 0.8, 0.7], rtol=1e-6)  # unscaled before the step
    p.grad = t(np.array([np.inf, 0, 0], np.float32))
    scaler.step(opt)
    scaler.update()
    np.testing.assert_allclose(p.numpy(), [0.9, 0.8, 0.7], rtol=1e-6)  # skipped
    assert scaler.get_scale() == 4.0
    for _ in range(2):
        p.grad = t(np.zeros(3, np.float32))
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 8.0


def test_autocast_names():
    a, b = t(f32(4, 8)), t(f32(8, 3))
    with it.autocast(device_type=DEVICE.split(":")[0], dtype="bfloat16"):
        assert (a @ b).dtype == "bfloat16"
        with it.autocast(DEVICE.split(":")[0], enabled=False):
            assert (a @ b).dtype == "float32"

    @it.autocast(DEVICE.split(":")[0], dtype="bfloat16")
    def f(x, y):
        return x @ y

    assert f(a, b).dtype == "bfloat16"


# ---- save, load, generate --------------------------------------------------------------------------------------


def test_save_load_round_trip_and_safetensors(tmp_path):
    model = nn.Linear(4, 3).to(DEVICE)
    bf = t(f32(5), "bfloat16")
    state = {
        "model": model.state_dict(),
        "opt": it.optim.AdamW(model.parameters()).state_dict(),
        "step": 7,
        "lr": float("nan"),
        "names": ("a", None, True),
        "bf": bf,
        "arr": np.arange(4),
        "grouped": {1: [bf, bf]},
    }
    it.save(state, tmp_path / "s.safetensors")
    back = it.load(tmp_path / "s.safetensors")
    assert back["step"] == 7 and math.isnan(back["lr"]) and back["names"] == ("a", None, True)
    assert back["bf"].dtype == "bfloat16" and back["bf"].device == it.device(DEVICE)
    np.testing.assert_array_equal(back["bf"].numpy(), bf.numpy())
    assert back["grouped"][1][0] is back["grouped"][1][1]  # shared tensors stay shared
    np.testing.assert_array_equal(back["model"]["weight"].numpy(), model.weight.numpy())
    np.testing.assert_array_equal(back["arr"], np.arange(4))
    assert it.load(tmp_path / "s.safetensors", map_location="cpu")["bf"].device == "cpu"
    from safetensors.numpy import load_file

    it.save({"model": model.state_dict()}, tmp_path / "m.safetensors")
    plain = load_file(str(tmp_path / "m.safetensors"))  # other tools read the tensors by their paths
    np.testing.assert_array_equal(plain["model.weight"], model.weight.numpy())
    with pytest.raises(TypeError, match="pickle"):
        it.save({"x": object()}, tmp_path / "bad.safetensors")


def test_generate_returns_tensors_and_follows_its_generator():
    from infinitrain.models import GPT2, GPT2Config

    model = GPT2(GPT2Config(block_size=32, vocab_size=11, padded_vocab_size=16, n_layer=1, n_head=2, n_embd=8), DEVICE)
    start = t(np.zeros((4, 1), np.int64))
    seed, other = (int(s) for s in rng().choice(2**31, size=2, replace=False))
    a = model.generate(start, 24, top_k=4, generator=it.Generator().manual_seed(seed))
    it.manual_seed(int(rng().integers(2**31)))  # the default generator's state must not matter
    b = model.generate(start, 24, top_k=4, generator=it.Generator().manual_seed(seed))
    c = model.generate(start, 24, top_k=4, generator=it.Generator().manual_seed(other))
    assert isinstance(a, it.Tensor) and a.shape == (4, 25) and a.device == it.device(DEVICE)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.numpy().max() < 11
    # 96 draws from the top 4 of a near-uniform distribution (an untrained model's): two seeds agree everywhere
    # with probability about 4^-96 if they are honoured; a generator that is ignored gives equal samples.
    assert not np.array_equal(a.numpy(), c.numpy())


# ---- idle threads ---------------------------------------------------------------------------------------------

_THREADS = """
import ctypes, os, sys

def threads():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

os.environ["OPENBLAS_NUM_THREADS"] = "1"
import numpy  # NumPy's own OpenBLAS (another library) reads it now: its pool stays off
before = threads()
os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[2]  # what a user may have set: a pool of that size, if started
if sys.argv[1] == "control":  # OpenBLAS loaded unguarded: its pool shows
    import importlib.util
    lib = os.path.join(importlib.util.find_spec("scipy_openblas32").submodule_search_locations[0], "lib")
    ctypes.CDLL(os.path.join(lib, "libscipy_openblas.so"), mode=ctypes.RTLD_GLOBAL)
else:
    import infinitrain as it
    a = it.randn(96, 96, device="cpu")
    (a @ a).sum().item()  # one op (an OpenBLAS sgemm)
print(before, threads())
"""


def _thread_counts(mode, n):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "-c", _THREADS, mode, str(n)], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    before, after = map(int, p.stdout.split())
    return before, after


def _cores():
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: OpenBLAS would start no pool either way (it caps its pool at the core count)")
    return min(cores, 8)


def test_openblas_pool_shows_in_the_thread_count():
    """The control for the next test: the same OpenBLAS loaded without a guard starts min(OPENBLAS_NUM_THREADS,
    cores) - 1 pool threads, and the count sees them."""
    n = _cores()
    before, after = _thread_counts("control", n)
    assert after - before == n - 1, f"OpenBLAS's pool should add {n - 1} threads, added {after - before}"


def test_import_and_an_op_start_no_idle_blas_threads():
    """`import infinitrain` and one op leave the process with the threads it had before (exactly: 0 new ones):
    OpenMP runs the kernels (OMP_NUM_THREADS=1 here: on the calling thread), the CPU runtime starts none, and
    OpenBLAS's pthread pool, which would idle since the kernels thread with OpenMP, is never started, whatever
    OPENBLAS_NUM_THREADS says (the control above shows such a pool is seen)."""
    n = _cores()
    before, after = _thread_counts("infinitrain", n)
    assert after == before, (
        f"import infinitrain and one op started {after - before} thread(s) (with OMP_NUM_THREADS=1 and "
        f"OPENBLAS_NUM_THREADS={n}): OpenBLAS's idle pool, unless something else now starts threads"
    )
