"""PyTorch's nn layers and nn.functional forms beyond the transformer set: activations, losses, group norm,
convolutions, multi-head attention, containers, hooks, init and utils, against float64 NumPy references on fresh
random inputs (values and gradients)."""

import math

import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn as nn
import infinitrain.nn.functional as F
from harness import DEVICE, rng


def t(a, dtype="float64", requires_grad=False):
    return it.tensor(np.asarray(a, dtype=np.float64), dtype=dtype, device=DEVICE, requires_grad=requires_grad)


def f64(*shape, scale=1.0):
    return rng().standard_normal(shape) * scale


def check_grad(fn, fn_np, *arrays, rtol=1e-5, atol=1e-7):
    """fn's gradients (float64, with a random output weight) against central differences of fn_np."""
    ts = [t(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    w = f64(*out.shape)
    (out * t(w)).sum().backward()
    h = 1e-6
    for k, a in enumerate(arrays):
        num = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            p, m = [x.copy() for x in arrays], [x.copy() for x in arrays]
            p[k][idx] += h
            m[k][idx] -= h
            num[idx] = np.sum((fn_np(*p) - fn_np(*m)) * w) / (2 * h)
        np.testing.assert_allclose(ts[k].grad.numpy(), num, rtol=rtol, atol=atol)


def softplus_np(x, beta=1.0, threshold=20.0):
    return np.where(beta * x > threshold, x, np.log1p(np.exp(np.minimum(beta * x, threshold))) / beta)


ACTIVATIONS = [
    ("elu", lambda x: F.elu(x, 0.7), lambda x: np.where(x > 0, x, 0.7 * np.expm1(np.minimum(x, 0)))),
    ("logsigmoid", F.logsigmoid, lambda x: -softplus_np(-x)),
    ("mish", F.mish, lambda x: x * np.tanh(softplus_np(x))),
    ("softplus", lambda x: F.softplus(x, 2.0, 5.0), lambda x: softplus_np(x, 2.0, 5.0)),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    (
        "selu",
        F.selu,
        lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(np.minimum(x, 0))),
    ),
    ("softsign", F.softsign, lambda x: x / (1 + np.abs(x))),
    ("glu", F.glu, lambda x: x[..., :3] / (1 + np.exp(-x[..., 3:]))),
    ("gelu", F.gelu, lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
]


@pytest.mark.parametrize("name, fn, ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation(name, fn, ref):
    x = f64(4, 6, scale=2.0)
    x[np.abs(x) < 1e-3] = 0.5  # away from kinks
    np.testing.assert_allclose(fn(t(x)).numpy(), ref(x), rtol=1e-10, atol=1e-12)
    if name not in ("hardtanh",):
        check_grad(fn, ref, x)


def test_activation_modules_match_functions():
    x = t(f64(3, 4))
    pairs = [
        (nn.LeakyReLU(0.1), F.leaky_relu(x, 0.1)),
        (nn.ELU(0.5), F.elu(x, 0.5)),
        (nn.Softplus(2.0), F.softplus(x, 2.0)),
        (nn.Mish(), F.mish(x)),
        (nn.LogSigmoid(), F.logsigmoid(x)),
        (nn.LogSoftmax(dim=1), F.log_softmax(x, 1)),
        (nn.GLU(), F.glu(x)),
        (nn.Hardtanh(), F.hardtanh(x)),
    ]
    for module, want in pairs:
        np.testing.assert_array_equal(module(x).numpy(), want.numpy())


def _bce_np(p, y):
    return -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log(1 - p), -100))


def test_losses():
    g = rng()
    x, y = f64(5, 4), f64(5, 4)
    for red, agg in (("mean", np.mean), ("sum", np.sum), ("none", lambda a: a)):
        np.testing.assert_allclose(F.l1_loss(t(x), t(y), reduction=red).numpy(), agg(np.abs(x - y)), rtol=1e-12)
        d = np.abs(x - y)
        sl1 = np.where(d < 0.5, 0.5 * d**2 / 0.5, d - 0.25)
        np.testing.assert_allclose(F.smooth_l1_loss(t(x), t(y), reduction=red, beta=0.5).numpy(), agg(sl1), rtol=1e-12)
        hub = np.where(d < 0.8, 0.5 * d**2, 0.8 * (d - 0.4))
        np.testing.assert_allclose(F.huber_loss(t(x), t(y), reduction=red, delta=0.8).numpy(), agg(hub), rtol=1e-12)
    p = g.uniform(0.05, 0.95, (6, 3))
    yb = (g.random((6, 3)) < 0.5).astype(np.float64)
    np.testing.assert_allclose(F.binary_cross_entropy(t(p), t(yb)).numpy(), _bce_np(p, yb).mean(), rtol=1e-12)
    w = g.random(3)
    np.testing.assert_allclose(
        F.binary_cross_entropy(t(p), t(yb), weight=t(w), reduction="sum").numpy(), (_bce_np(p, yb) * w).sum()
    )
    logits = f64(6, 3, scale=30.0)  # large: the stable form must not overflow
    stable = (1 - yb) * logits + softplus_np(-logits)
    np.testing.assert_allclose(F.binary_cross_entropy_with_logits(t(logits), t(yb), reduction="none").numpy(), stable)
    pw = g.uniform(0.5, 2.0, 3)
    want = (1 - yb) * logits + (1 + (pw - 1) * yb) * softplus_np(-logits)
    got = F.binary_cross_entropy_with_logits(t(logits), t(yb), pos_weight=t(pw), reduction="none")
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)
    lp = np.log(g.dirichlet(np.ones(5), 4))
    q = g.dirichlet(np.ones(5), 4)
    kl = q * (np.log(q) - lp)
    np.testing.assert_allclose(F.kl_div(t(lp), t(q), reduction="batchmean").numpy(), kl.sum() / 4)
    np.testing.assert_allclose(F.kl_div(t(lp), t(q), reduction="sum").numpy(), kl.sum())
    np.testing.assert_allclose(F.kl_div(t(lp), t(np.log(q)), reduction="mean", log_target=True).numpy(), kl.mean())
    check_grad(
        lambda a: F.binary_cross_entropy_with_logits(a, t(yb), reduction="none"),
        lambda a: (1 - yb) * a + softplus_np(-a),
        f64(6, 3),
    )


def test_loss_modules():
    g = rng()
    x, y = f64(5, 4), f64(5, 4)
    assert np.isclose(nn.L1Loss()(t(x), t(y)).item(), np.abs(x - y).mean())
    assert np.isclose(nn.SmoothL1Loss(beta=2.0)(t(x), t(y)).item(), F.smooth_l1_loss(t(x), t(y), beta=2.0).item())
    assert np.isclose(nn.HuberLoss(delta=0.5)(t(x), t(y)).item(), F.huber_loss(t(x), t(y), delta=0.5).item())
    p = g.uniform(0.05, 0.95, (5, 4))
    yb = (g.random((5, 4)) < 0.5).astype(np.float64)
    assert np.isclose(nn.BCELoss()(t(p), t(yb)).item(), _bce_np(p, yb).mean())
    assert np.isclose(nn.BCEWithLogitsLoss()(t(x), t(yb)).item(), ((1 - yb) * x + softplus_np(-x)).mean())
    lp = np.log(g.dirichlet(np.ones(5), 4))
    tgt = g.integers(0, 5, 4)
    tgt[1] = -100
    keep = tgt != -100
    assert np.isclose(nn.NLLLoss()(t(lp), it.tensor(tgt, device=DEVICE)).item(), -lp[keep, tgt[keep]].mean())
    q = g.dirichlet(np.ones(5), 4)
    assert np.isclose(nn.KLDivLoss(reduction="batchmean")(t(lp), t(q)).item(), (q * (np.log(q) - lp)).sum() / 4)


def test_cross_entropy_and_nll_with_class_weights():
    g = rng()
    logits = f64(7, 5)
    tgt = g.integers(0, 5, 7)
    tgt[2] = -100
    w = g.uniform(0.2, 2.0, 5)
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    keep = tgt != -100
    rows = -lp[keep, tgt[keep]] * w[tgt[keep]]
    want = rows.sum() / w[tgt[keep]].sum()
    tt = it.tensor(tgt, device=DEVICE)
    np.testing.assert_allclose(F.cross_entropy(t(logits), tt, weight=t(w)).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(nn.CrossEntropyLoss(weight=t(w))(t(logits), tt).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(F.nll_loss(t(lp), tt, weight=t(w)).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(
        F.cross_entropy(t(logits), tt, weight=t(w), reduction="sum").numpy(), rows.sum(), rtol=1e-12
    )
    # Label smoothing with weights: (1 - eps) * the weighted NLL + eps * the weighted mean over classes.
    eps = 0.1
    smooth = -(lp * w).sum(1) / 5
    total = ((1 - eps) * (-lp[np.arange(7), np.where(keep, tgt, 0)] * w[np.where(keep, tgt, 0)]) + eps * smooth)[keep]
    got = F.cross_entropy(t(logits), tt, weight=t(w), label_smoothing=eps)
    np.testing.assert_allclose(got.numpy(), total.sum() / w[tgt[keep]].sum(), rtol=1e-12)


def test_cosine_similarity_pairwise_distance_normalize():
    a, b = f64(4, 6), f64(4, 6)
    cos = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    np.testing.assert_allclose(F.cosine_similarity(t(a), t(b)).numpy(), cos, rtol=1e-12)
    np.testing.assert_allclose(F.cosine_similarity(t(a), t(b[:1]), dim=1).numpy().shape, (4,))
    np.testing.assert_allclose(F.pairwise_distance(t(a), t(b)).numpy(), np.linalg.norm(a - b + 1e-6, axis=1))
    np.testing.assert_allclose(F.normalize(t(a), p=1.0, dim=1).numpy(), a / np.abs(a).sum(1, keepdims=True))
    check_grad(
        lambda x, y: F.cosine_similarity(x, y),
        lambda x, y: (x * y).sum(1) / np.sqrt((x * x).sum(1) * (y * y).sum(1)),
        a,
        b,
    )


def test_pad_modes():
    x = f64(2, 3, 5)
    for mode, np_mode in (("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")):
        got = F.pad(t(x), (2, 1), mode=mode)
        np.testing.assert_array_equal(got.numpy(), np.pad(x, ((0, 0), (0, 0), (2, 1)), mode=np_mode))
    got = F.pad(t(x), (1, 2, 0, 1), value=3.5)
    np.testing.assert_array_equal(got.numpy(), np.pad(x, ((0, 0), (0, 1), (1, 2)), constant_values=3.5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_weight_of_another_dtype(reduction):
    """A class weight of another dtype than the log-probabilities (float64 for float32 here) is taken in the
    input's dtype: the loss and the input's gradient stay float32, and equal the float64 reference on the
    float32-rounded inputs within float32 rounding."""
    g = rng()
    lp = np.log(g.dirichlet(np.ones(5), size=6))
    tgt = g.integers(0, 5, 6)
    w = g.uniform(0.2, 2.0, 5)
    lp32, w32 = lp.astype(np.float32).astype(np.float64), w.astype(np.float32).astype(np.float64)
    rows = -lp32[np.arange(6), tgt] * w32[tgt]
    want = {"mean": rows.sum() / w32[tgt].sum(), "sum": rows.sum(), "none": rows}[reduction]
    x = t(lp, "float32", requires_grad=True)
    out = F.nll_loss(x, it.tensor(tgt, device=DEVICE), weight=t(w, "float64"), reduction=reduction)
    assert out.dtype == "float32"
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    out.sum().backward()
    assert x.grad.dtype == "float32"


def test_softmax_and_log_softmax_default_to_the_last_dim():
    """Without dim, F.softmax and F.log_softmax both normalise over the last dim (for any rank), so log_softmax(x)
    is log(softmax(x)); against float64 NumPy on a 3-d input."""
    x = f64(2, 3, 4)
    lse = np.log(np.exp(x).sum(-1, keepdims=True))
    np.testing.assert_allclose(F.log_softmax(t(x)).numpy(), x - lse, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.softmax(t(x)).numpy(), np.exp(x - lse), rtol=1e-12, atol=1e-12)


def test_constant_pad_refuses_negative_amounts():
    """Constant padding takes amounts >= 0 on either side (zero adds nothing, as np.pad); a negative one, even -1 on
    one side, is refused rather than cropping or padding something else."""
    x = f64(2, 3)
    np.testing.assert_array_equal(F.pad(t(x), (0, 0, 0, 1)).numpy(), np.pad(x, ((0, 1), (0, 0))))
    for pad in ((-1, 0), (0, -1), (-1, -1), (1, 1, -1, 0), (0, 0, 2, -1)):
        with pytest.raises(NotImplementedError, match="negative padding"):
            F.pad(t(x), pad)


def test_group_norm():
    x = f64(3, 6, 4, 5)
    w, b = f64(6), f64(6)
    xs = x.reshape(3, 2, -1)
    norm = (xs - xs.mean(-1, keepdims=True)) / np.sqrt(xs.var(-1, keepdims=True) + 1e-5)
    want = norm.reshape(x.shape) * w[None, :, None, None] + b[None, :, None, None]
    np.testing.assert_allclose(F.group_norm(t(x), 2, t(w), t(b)).numpy(), want, rtol=1e-10, atol=1e-12)
    m = nn.GroupNorm(3, 6, device=DEVICE, dtype="float64")
    assert m.weight.shape == (6,) and np.allclose(m(t(x)).numpy(), F.group_norm(t(x), 3).numpy())
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(4, 6)


def _conv2d_np(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for oc in range(o):
        gi = oc // og
        for i in range(ho):
            for j in range(wo):
                patch = xp[
                    :,
                    gi * cg : (gi + 1) * cg,
                    i * stride[0] : i * stride[0] + dil[0] * (kh - 1) + 1 : dil[0],
                    j * stride[1] : j * stride[1] + dil[1] * (kw - 1) + 1 : dil[1],
                ]
                out[:, oc, i, j] = (patch * w[oc]).sum((1, 2, 3))
    return out + (0 if b is None else b[None, :, None, None])


@pytest.mark.parametrize(
    "stride, pad, dil, groups", [((1, 1), (0, 0), (1, 1), 1), ((2, 1), (1, 2), (1, 1), 1), ((1, 2), (1, 0), (2, 1), 2)]
)
def test_conv2d(stride, pad, dil, groups):
    x = f64(2, 4, 7, 8)
    w = f64(6, 4 // groups, 3, 2)
    b = f64(6)
    got = F.conv2d(t(x), t(w), t(b), stride, pad, dil, groups)
    np.testing.assert_allclose(got.numpy(), _conv2d_np(x, w, b, stride, pad, dil, groups), rtol=1e-10, atol=1e-10)
    xs, ws = f64(1, 2, 4, 4), f64(2, 2 // groups if groups == 1 else 1, 2, 2)
    g = groups if groups == 1 else 2
    check_grad(
        lambda a, k: F.conv2d(a, k, None, stride, pad, dil, g),
        lambda a, k: _conv2d_np(a, k, None, stride, pad, dil, g),
        xs,
        ws,
    )


def test_conv1d_and_modules():
    x = f64(2, 3, 9)
    w = f64(4, 3, 3)
    want = _conv2d_np(x[:, :, None, :], w[:, :, None, :], None, (1, 2), (0, 1), (1, 1), 1)[:, :, 0, :]
    np.testing.assert_allclose(F.conv1d(t(x), t(w), stride=2, padding=1).numpy(), want, rtol=1e-10, atol=1e-12)
    same = F.conv1d(t(x), t(w), padding="same")
    assert same.shape == (2, 4, 9)
    m = nn.Conv2d(3, 5, 3, padding=1, device=DEVICE, dtype="float64")
    y = f64(1, 3, 6, 6)
    ref = _conv2d_np(y, m.weight.numpy(), m.bias.numpy(), (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(m(t(y)).numpy(), ref, rtol=1e-10, atol=1e-12)
    bound = 1 / math.sqrt(3 * 9)
    assert np.abs(m.bias.numpy()).max() <= bound and np.abs(m.weight.numpy()).max() <= bound
    c1 = nn.Conv1d(3, 2, 2, bias=False, device=DEVICE, dtype="float64")
    assert c1.bias is None and c1(t(x)).shape == (2, 2, 8)


@pytest.mark.parametrize("cls, in_channels, groups, kernel", [(nn.Conv2d, 6, 2, (3, 2)), (nn.Conv1d, 4, 1, 3)])
def test_conv_default_init_spans_pytorchs_bound(cls, in_channels, groups, kernel):
    """PyTorch's default init draws weight and bias from U(-b, b), b = 1 / sqrt(fan_in), fan_in = in_channels /
    groups * kernel elements: every value lies within b, and with thousands of draws the largest comes within 5%
    of it (the chance of missing is 0.95**2048)."""
    out = 2048
    m = cls(in_channels, out, kernel, groups=groups, device=DEVICE, dtype="float64")
    bound = 1 / math.sqrt(in_channels // groups * math.prod(np.atleast_1d(kernel)))
    for p in (m.weight.numpy(), m.bias.numpy()):
        assert 0.95 * bound < np.abs(p).max() <= bound


def _mha_np(q, k, v, w_in, b_in, w_out, b_out, heads, mask=None):
    e = q.shape[-1]
    d = e // heads
    qp, kp, vp = q @ w_in[:e].T + b_in[:e], k @ w_in[e : 2 * e].T + b_in[e : 2 * e], v @ w_in[2 * e :].T + b_in[2 * e :]
    L, N, _ = q.shape
    S = k.shape[0]
    qh = qp.reshape(L, N, heads, d).transpose(1, 2, 0, 3)
    kh = kp.reshape(S, N, heads, d).transpose(1, 2, 0, 3)
    vh = vp.reshape(S, N, heads, d).transpose(1, 2, 0, 3)
    s = qh @ kh.transpose(0, 1, 3, 2) / math.sqrt(d)
    if mask is not None:
        s = np.where(mask, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ vh).transpose(2, 0, 1, 3).reshape(L, N, e)
    return o @ w_out.T + b_out, p.mean(1)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention(need_weights):
    E, H, L, S, N = 8, 2, 5, 6, 3
    m = nn.MultiheadAttention(E, H, device=DEVICE, dtype="float64")
    with it.no_grad():
        m.in_proj_bias.copy_(t(f64(3 * E)))
        m.out_proj.bias.copy_(t(f64(E)))
    q, k, v = f64(L, N, E), f64(S, N, E), f64(S, N, E)
    out, w = m(t(q), t(k), t(v), need_weights=need_weights)
    args = (m.in_proj_weight.numpy(), m.in_proj_bias.numpy(), m.out_proj.weight.numpy(), m.out_proj.bias.numpy(), H)
    want, want_w = _mha_np(q, k, v, *args)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-10, atol=1e-12)
    if need_weights:
        np.testing.assert_allclose(w.numpy(), want_w, rtol=1e-10, atol=1e-12)
    else:
        assert w is None
    mask = rng().random((L, S)) < 0.3
    mask[:, 0] = False  # every query keeps a key
    out_m, _ = m(t(q), t(k), t(v), attn_mask=it.tensor(mask, device=DEVICE), need_weights=need_weights)
    np.testing.assert_allclose(out_m.numpy(), _mha_np(q, k, v, *args, mask=mask)[0], rtol=1e-10, atol=1e-12)
    pad = np.zeros((N, S), dtype=bool)
    pad[:, -2:] = True
    out_p, _ = m(t(q), t(k), t(v), key_padding_mask=it.tensor(pad, device=DEVICE), need_weights=need_weights)
    np.testing.assert_allclose(
        out_p.numpy(), _mha_np(q, k, v, *args, mask=pad[:, None, None, :])[0], rtol=1e-10, atol=1e-12
    )
    mb = nn.MultiheadAttention(E, H, batch_first=True, device=DEVICE, dtype="float64")
    xb = f64(N, L, E)
    ob, _ = mb(t(xb), t(xb), t(xb))
    args_b = (
        mb.in_proj_weight.numpy(),
        mb.in_proj_bias.numpy(),
        mb.out_proj.weight.numpy(),
        mb.out_proj.bias.numpy(),
        H,
    )
    xs = xb.transpose(1, 0, 2)
    np.testing.assert_allclose(ob.numpy(), _mha_np(xs, xs, xs, *args_b)[0].transpose(1, 0, 2), rtol=1e-10, atol=1e-12)
    out.sum().backward()
    assert m.in_proj_weight.grad is not None and m.out_proj.weight.grad is not None


def test_containers_flatten_hooks():
    pl = nn.ParameterList([nn.Parameter(t(f64(2))), t(f64(3))])
    assert len(pl) == 2 and all(isinstance(p, nn.Parameter) for p in pl)
    pd = nn.ParameterDict({"a": t(f64(2))})
    pd["b"] = t(f64(4))
    assert set(pd.keys()) == {"a", "b"} and "b" in pd

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps, self.pd = pl, pd

    assert sorted(n for n, _ in M().named_parameters()) == ["pd.a", "pd.b", "ps.0", "ps.1"]
    x = t(f64(2, 3, 4))
    assert nn.Flatten()(x).shape == (2, 12) and nn.Unflatten(1, (3, 2))(t(f64(4, 6))).shape == (4, 3, 2)
    lin = nn.Linear(4, 2, device=DEVICE, dtype="float64")
    seen = []
    h1 = lin.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    h2 = lin.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out * 0)
    y = lin(t(np.ones((3, 4))))
    assert seen == [(3, 2)] and np.all(y.numpy() == 0)
    h1.remove()
    h2.remove()
    y = lin(t(np.ones((3, 4))))
    np.testing.assert_allclose(y.numpy(), np.ones((3, 4)) @ lin.weight.numpy().T + lin.bias.numpy())


def test_init_and_utils():
    w = it.empty(64, 32, dtype="float64", device=DEVICE)
    nn.init.trunc_normal_(w, std=0.5, a=-0.6, b=0.6)
    assert w.numpy().min() >= -0.6 and w.numpy().max() <= 0.6
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(w.numpy().std() - math.sqrt(2 / 32)) < 0.03
    nn.init.xavier_uniform_(w)
    assert np.abs(w.numpy()).max() <= math.sqrt(6 / 96) + 1e-12
    ps = [nn.Parameter(t(f64(3, 2))), nn.Parameter(t(f64(4)))]
    vec = nn.utils.parameters_to_vector(ps)
    np.testing.assert_array_equal(vec.numpy(), np.concatenate([p.numpy().reshape(-1) for p in ps]))
    new = f64(10)
    nn.utils.vector_to_parameters(t(new), ps)
    np.testing.assert_array_equal(ps[0].numpy().reshape(-1), new[:6])
    for p in ps:
        p.grad = t(f64(*p.shape, scale=5.0))
    nn.utils.clip_grad_value_(ps, 0.5)
    assert all(np.abs(p.grad.numpy()).max() <= 0.5 for p in ps)
    with pytest.raises(ValueError, match="elements"):
        nn.utils.vector_to_parameters(t(f64(11)), ps)


def test_embedding_pytorch_arguments():
    w = f64(5, 3)
    e = nn.Embedding(5, 3, _weight=t(w))
    np.testing.assert_array_equal(e(it.tensor([4, 0], device=DEVICE)).numpy(), w[[4, 0]])
    frozen = nn.Embedding(5, 3, _freeze=True, device=DEVICE)
    assert not frozen.weight.requires_grad
    with pytest.raises(NotImplementedError, match="max_norm"):
        nn.Embedding(5, 3, max_norm=1.0)


def test_embedding_padding_idx_range():
    """padding_idx is accepted in [-num_embeddings, num_embeddings), as in PyTorch: -n names row 0 (whose weight
    starts at zero), while -n - 1 and n are rejected rather than wrapped."""
    n = int(rng().integers(2, 9))
    e = nn.Embedding(n, 3, padding_idx=-n, device=DEVICE, dtype="float64")
    assert e.padding_idx == 0
    w = e.weight.numpy()
    np.testing.assert_array_equal(w[0], 0.0)
    assert np.all(w[1:] != 0.0)
    assert nn.Embedding(n, 3, padding_idx=-1, device=DEVICE).padding_idx == n - 1
    for bad in (-n - 1, n):
        with pytest.raises(ValueError, match="out of range"):
            nn.Embedding(n, 3, padding_idx=bad, device=DEVICE)


def test_add_rms_norm_default_eps_is_pytorchs():
    """add_rms_norm without eps normalises with eps = 1e-5: (x + y) / sqrt(mean((x + y)^2) + 1e-5) * weight, in
    float64 against NumPy, on rows small enough that eps matters."""
    g = rng()
    x, y = g.standard_normal((3, 8)) * 1e-3, g.standard_normal((3, 8)) * 1e-3
    w = g.standard_normal(8)
    t = [it.tensor(a, device=DEVICE) for a in (x, y, w)]
    from infinitrain import functional

    s, out = functional.add_rms_norm(*t)
    h = x + y
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(s.numpy(), h, rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-9)


def test_eval_mode_restores_each_modules_own_mode_also_on_error():
    from infinitrain.nn.utils import eval_mode

    net = nn.Sequential(nn.Linear(3, 3, device=DEVICE), nn.Dropout(0.5), nn.Linear(3, 2, device=DEVICE))
    net[1].eval()  # one submodule already in eval mode: it stays so
    with eval_mode(net):
        assert not any(m.training for m in net.modules())
    assert [m.training for m in net.modules()] == [True, True, False, True]
    with pytest.raises(RuntimeError, match="inside"), eval_mode(net):
        raise RuntimeError("inside")
    assert [m.training for m in net.modules()] == [True, True, False, True]
