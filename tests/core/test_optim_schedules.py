"""Optimizers and learning-rate schedules with PyTorch's names: RMSprop, Adagrad, SGD's dampening and maximize,
Adam's decoupled_weight_decay, AdamW's fused/foreach switches, and the lr_scheduler classes, against the update
formulas and schedules written out in float64 NumPy; and the train CLI's Schedule (InfiniTrain's definitions)."""

import math

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng
from infinitrain.optim.schedule import Schedule


def param(a):
    return it.nn.Parameter(it.tensor(np.asarray(a, dtype=np.float64), dtype="float64", device=DEVICE))


def run(opt_cls, steps=4, **kw):
    """Trains one parameter for `steps` steps on fixed random gradients; returns (param values, grads used)."""
    g = rng()
    p0 = g.standard_normal(6)
    grads = [g.standard_normal(6) for _ in range(steps)]
    p = param(p0)
    opt = opt_cls([p], **kw)
    for gr in grads:
        p.grad = it.tensor(gr, dtype="float64", device=DEVICE)
        opt.step()
    return p0, grads, p.numpy()


@pytest.mark.parametrize("centered, momentum, wd", [(False, 0.0, 0.0), (True, 0.0, 0.1), (False, 0.9, 0.0)])
def test_rmsprop(centered, momentum, wd):
    lr, alpha, eps = 0.01, 0.9, 1e-8
    p0, grads, got = run(
        it.optim.RMSprop, lr=lr, alpha=alpha, eps=eps, weight_decay=wd, momentum=momentum, centered=centered
    )
    p, v, ga, b = p0.copy(), np.zeros(6), np.zeros(6), np.zeros(6)
    for gr in grads:
        gr = gr + wd * p
        v = alpha * v + (1 - alpha) * gr * gr
        avg = v
        if centered:
            ga = alpha * ga + (1 - alpha) * gr
            avg = v - ga * ga
        step = gr / (np.sqrt(avg) + eps)
        if momentum:
            b = momentum * b + step
            step = b
        p = p - lr * step
    np.testing.assert_allclose(got, p, rtol=1e-12)


def test_adagrad():
    lr, decay, init, eps = 0.1, 0.01, 0.2, 1e-10
    p0, grads, got = run(it.optim.Adagrad, lr=lr, lr_decay=decay, initial_accumulator_value=init, eps=eps)
    p, s = p0.copy(), np.full(6, init)
    for k, gr in enumerate(grads, start=1):
        s = s + gr * gr
        p = p - lr / (1 + (k - 1) * decay) * gr / (np.sqrt(s) + eps)
    np.testing.assert_allclose(got, p, rtol=1e-12)


def test_sgd_dampening_and_maximize():
    lr, mom, damp = 0.1, 0.9, 0.3
    p0, grads, got = run(it.optim.SGD, lr=lr, momentum=mom, dampening=damp, maximize=True)
    p, b = p0.copy(), None
    for gr in grads:
        gr = -gr
        b = gr.copy() if b is None else mom * b + (1 - damp) * gr
        p = p - lr * b
    np.testing.assert_allclose(got, p, rtol=1e-12)
    with pytest.raises(ValueError, match="nesterov"):
        it.optim.SGD([param(np.ones(2))], lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)


def test_adam_decoupled_equals_adamw_and_switches_are_accepted():
    kw = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    _, _, a = run(lambda ps, **k: it.optim.Adam(ps, decoupled_weight_decay=True, **k), **kw)
    it.manual_seed(0)
    g = rng()
    p0, grads = g.standard_normal(6), [g.standard_normal(6) for _ in range(3)]
    outs = []
    for make in (
        lambda ps: it.optim.Adam(ps, decoupled_weight_decay=True, **kw),
        lambda ps: it.optim.AdamW(ps, fused=True, foreach=False, **kw),
        lambda ps: it.optim.AdamW(ps, fused=False, foreach=True, **kw),
    ):
        p = param(p0)
        opt = make([p])
        for gr in grads:
            p.grad = it.tensor(gr, dtype="float64", device=DEVICE)
            opt.step()
        outs.append(p.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], outs[2])
    p_max = param(p0)
    opt = it.optim.AdamW([p_max], maximize=True, **kw)
    p_neg = param(p0)
    opt_neg = it.optim.AdamW([p_neg], **kw)
    for gr in grads:
        p_max.grad = it.tensor(gr, dtype="float64", device=DEVICE)
        p_neg.grad = it.tensor(-gr, dtype="float64", device=DEVICE)
        opt.step()
        opt_neg.step()
    np.testing.assert_array_equal(p_max.numpy(), p_neg.numpy())


def test_buffered_optimizer_state_round_trip():
    g = rng()
    p = param(g.standard_normal(5))
    opt = it.optim.RMSprop([p], lr=0.01, momentum=0.5)
    for _ in range(2):
        p.grad = it.tensor(g.standard_normal(5), dtype="float64", device=DEVICE)
        opt.step()
    state = opt.state_dict()
    q = param(p.numpy())
    opt2 = it.optim.RMSprop([q], lr=0.01, momentum=0.5)
    opt2.load_state_dict(state)
    gr = g.standard_normal(5)
    for o, t in ((opt, p), (opt2, q)):
        t.grad = it.tensor(gr, dtype="float64", device=DEVICE)
        o.step()
    np.testing.assert_array_equal(p.numpy(), q.numpy())


def lrs(sched, opt, n):
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return np.array(out)


def make_opt(lr=0.1):
    return it.optim.SGD([param(np.ones(2))], lr=lr, momentum=0.9)


def test_closed_form_schedules():
    base = 0.1
    n = 12
    e = np.arange(n + 1)
    cases = [
        (lambda o: it.optim.lr_scheduler.StepLR(o, 3, 0.5), base * 0.5 ** (e // 3)),
        (
            lambda o: it.optim.lr_scheduler.MultiStepLR(o, [2, 7], 0.1),
            base * 0.1 ** ((e >= 2).astype(int) + (e >= 7).astype(int)),
        ),
        (lambda o: it.optim.lr_scheduler.ExponentialLR(o, 0.9), base * 0.9**e),
        (lambda o: it.optim.lr_scheduler.ConstantLR(o, 0.5, 4), base * np.where(e < 4, 0.5, 1.0)),
        (
            lambda o: it.optim.lr_scheduler.LinearLR(o, 0.25, 1.0, 5),
            base * (0.25 + 0.75 * np.minimum(e, 5) / 5),
        ),
        (lambda o: it.optim.lr_scheduler.LambdaLR(o, lambda k: 1 / (k + 1)), base / (e + 1)),
        (
            lambda o: it.optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.01),
            0.01 + (base - 0.01) * (1 + np.cos(np.pi * e / 10)) / 2,
        ),
    ]
    for make, want in cases:
        opt = make_opt(base)
        np.testing.assert_allclose(lrs(make(opt), opt, n), want, rtol=1e-12)


def test_warm_restarts():
    opt = make_opt(0.1)
    s = it.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=0.0)
    got = lrs(s, opt, 10)
    pos = [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1]
    per = [3, 3, 3, 6, 6, 6, 6, 6, 6, 12, 12]
    want = [0.1 * (1 + math.cos(math.pi * p / q)) / 2 for p, q in zip(pos, per, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_one_cycle():
    opt = it.optim.SGD([param(np.ones(2))], lr=0.01, momentum=0.9)
    total, max_lr = 20, 1.0
    s = it.optim.lr_scheduler.OneCycleLR(opt, max_lr, total_steps=total, pct_start=0.25)
    got = lrs(s, opt, total - 1)
    init, final = max_lr / 25, max_lr / 25 / 1e4
    up = 0.25 * total - 1

    def cos(a, b, pct):
        return b + (a - b) / 2 * (math.cos(math.pi * pct) + 1)

    want = [
        cos(init, max_lr, k / up) if k <= up else cos(max_lr, final, (k - up) / (total - 1 - up)) for k in range(total)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.95)  # momentum back at its maximum at the end


def test_one_cycle_linear_anneal():
    """anneal_strategy="linear": each phase moves the learning rate in a straight line between its ends."""
    opt = it.optim.SGD([param(np.ones(2))], lr=0.01, momentum=0.9)
    total, max_lr = 20, 1.0
    s = it.optim.lr_scheduler.OneCycleLR(opt, max_lr, total_steps=total, pct_start=0.25, anneal_strategy="linear")
    got = lrs(s, opt, total - 1)
    init, final = max_lr / 25, max_lr / 25 / 1e4
    up = 0.25 * total - 1

    def line(a, b, pct):
        return a + (b - a) * pct

    want = [
        line(init, max_lr, k / up) if k <= up else line(max_lr, final, (k - up) / (total - 1 - up))
        for k in range(total)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_sequential_and_plateau():
    opt = make_opt(0.1)
    warm = it.optim.lr_scheduler.LinearLR(opt, 0.5, 1.0, 2)
    decay = it.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    s = it.optim.lr_scheduler.SequentialLR(opt, [warm, decay], milestones=[2])
    got = lrs(s, opt, 5)
    np.testing.assert_allclose(got, [0.05, 0.075, 0.1, 0.05, 0.025, 0.0125], rtol=1e-12)
    opt = make_opt(1.0)
    p = it.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1, cooldown=1, min_lr=0.2)
    seen = []
    for metric in [5, 4, 4, 4, 4, 4, 4, 4, 4]:
        p.step(metric)
        seen.append(opt.param_groups[0]["lr"])
    assert seen == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25]
    for _ in range(6):
        p.step(10)
    assert opt.param_groups[0]["lr"] == 0.2  # never below min_lr


@pytest.mark.parametrize("threshold_mode", ["rel", "abs"])
def test_plateau_max_mode_threshold(threshold_mode):
    """In max mode a metric counts as better only above best * (1 + threshold) (rel) or best + threshold (abs):
    with best 1.0 and threshold 0.1, 1.09 is a plateau step and 1.11 an improvement (worked out by hand)."""
    opt = make_opt(1.0)
    p = it.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="max", factor=0.5, patience=0, threshold=0.1, threshold_mode=threshold_mode
    )
    seen = []
    for metric in [1.0, 1.09, 1.11, 1.2, 1.3]:
        p.step(metric)
        seen.append(opt.param_groups[0]["lr"])
    # best: 1.0, 1.0 (bad), 1.11, 1.11 (bad: under 1.221 rel, 1.21 abs), 1.3
    assert seen == [1.0, 0.5, 0.5, 0.25, 0.25]
    assert p.best == 1.3


def test_sgd_nesterov_against_the_formula():
    """SGD with nesterov=True (PyTorch's form): b = g on the first step, then b = momentum * b + g; the step uses
    g + momentum * b (weight decay added to g first), written out in float64 NumPy."""
    lr, mom, wd = 0.1, 0.9, 0.01
    p0, grads, got = run(it.optim.SGD, steps=4, lr=lr, momentum=mom, nesterov=True, weight_decay=wd)
    p, b = p0.copy(), None
    for g in grads:
        g = g + wd * p
        b = g.copy() if b is None else mom * b + g
        p = p - lr * (g + mom * b)
    np.testing.assert_allclose(got, p, rtol=1e-12, atol=1e-14)


def test_learning_rate_schedules_follow_infinitrain():
    """The train CLI's Schedule: warmup from warmup_init, then each --lr_decay_style as InfiniTrain writes it
    (optim/schedule.py's docstring), min_lr after decay_iters; style none is lr throughout."""
    lr, lo = 1.0, 0.1
    W, D = 4, 14  # warmup 4 steps, decay over the next 10
    warm = [0.2 + (lr - 0.2) * s / W for s in range(W)]
    for style, after in (
        ("constant", [lr] * 10 + [lr] * 3),
        ("linear", [lr + (lo - lr) * t / 10 for t in range(10)] + [lo] * 3),
        ("cosine", [lo + 0.5 * (1 + math.cos(math.pi * t / 10)) * (lr - lo) for t in range(10)] + [lo] * 3),
        ("inverse-square-root", [max(lo, lr * math.sqrt(W / s)) for s in range(W, D + 1)] + [lo] * 2),
    ):
        sched = Schedule(lr, style=style, warmup_iters=W, warmup_init=0.2, min_lr=lo, decay_iters=D)
        assert [sched(s) for s in range(D + 3)] == pytest.approx(warm + after, rel=1e-12), style
    none = Schedule(lr, style="none", warmup_iters=W, min_lr=lo, decay_iters=D)
    assert [none(s) for s in range(D + 3)] == [lr] * (D + 3)
    with pytest.raises(ValueError, match="min_lr"):
        Schedule(lr, style="cosine", min_lr=2.0, decay_iters=D)
