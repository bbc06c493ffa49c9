"""DistributedDataParallel and ZeroRedundancyOptimizer in one process (a world of one rank): bucket_cap_mb is in MiB
(2**20 bytes, as PyTorch's), each bucket one all-reduce filled in reverse registration order up to the cap; a
consolidated ZeRO state, through JSON as a checkpoint stores it, resumes with its hyperparameters, bit for bit."""

import json

import numpy as np
import pytest

import infinitrain as it
import infinitrain.distributed as dist
from harness import DEVICE, rng
from infinitrain import _C, nn
from infinitrain.distributed import ddp as ddp_module


@pytest.fixture
def world_of_one():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group(world_size=1, rank=0, store=_C.TcpStore("127.0.0.1", 0, True, 10.0))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cap_mb, sizes", [(1.0, [3, 1]), (0.5, [1, 1, 1, 1]), (2.0, [4])])
def test_bucket_cap_is_in_mib(world_of_one, monkeypatch, cap_mb, sizes):
    """Four float32 parameters of 0.3 MiB each: a 1 MiB cap holds three per all-reduce, a 0.5 MiB cap one, a 2 MiB
    cap all four; the gradients come back as computed (the average over one rank)."""
    n = (3 << 20) // 40  # 0.3 MiB of float32
    m = nn.Module()
    for i in range(4):
        setattr(m, f"p{i}", nn.Parameter(it.zeros(n, device=DEVICE)))
    dist.DistributedDataParallel(m, bucket_cap_mb=cap_mb)  # its gradient hooks keep it alive
    reduced = []

    def counting(t, *args, **kwargs):
        reduced.append(t.numel())
        return real(t, *args, **kwargs)

    real = ddp_module.all_reduce
    monkeypatch.setattr(ddp_module, "all_reduce", counting)
    w = rng().standard_normal((4, n)).astype(np.float32)
    loss = sum((getattr(m, f"p{i}") * it.tensor(w[i], device=DEVICE)).sum() for i in range(4))
    loss.backward()
    assert reduced == [k * n for k in sizes]
    for i in range(4):
        np.testing.assert_array_equal(getattr(m, f"p{i}").grad.numpy(), w[i])


def _zero(params):
    groups = [
        {"params": params[:2], "lr": 1e-2, "betas": (0.8, 0.95), "weight_decay": 0.1},
        {"params": params[2:], "lr": 3e-3, "betas": (0.7, 0.9), "weight_decay": 0.0},
    ]
    return dist.ZeroRedundancyOptimizer(groups, it.optim.AdamW)


def test_zero_state_resumes_through_json(world_of_one):
    """A ZeRO optimizer's consolidated state, its parameter groups through JSON (betas come back a list), loads
    into one made with other hyperparameters: the groups' lr, betas and weight_decay come back (betas a tuple), and
    the next steps equal the uninterrupted run's bit for bit."""
    g = rng()
    p0 = [g.standard_normal(s).astype(np.float32) for s in ((3, 4), (4,), (5,), (2, 2))]
    grads = [[g.standard_normal(a.shape).astype(np.float32) for a in p0] for _ in range(5)]

    def params(values):
        return [nn.Parameter(it.tensor(v, device=DEVICE)) for v in values]

    def steps(opt, ps, gs):
        for step in gs:
            for p, gr in zip(ps, step, strict=True):
                p.grad = it.tensor(gr, device=DEVICE)
            opt.step()

    ref = params(p0)
    opt = _zero(ref)
    steps(opt, ref, grads[:3])
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict()
    saved = {**state, "param_groups": json.loads(json.dumps(state["param_groups"]))}
    resumed = params([p.numpy() for p in ref])
    opt2 = _zero(resumed)
    for pg in opt2.param_groups:  # other hyperparameters until the state is loaded
        pg.update(lr=1.0, betas=(0.5, 0.5), weight_decay=0.5)
    opt2.load_state_dict(saved)
    for pg, want in zip(opt2.param_groups, opt.param_groups, strict=True):
        assert (pg["lr"], pg["betas"], pg["weight_decay"]) == (want["lr"], want["betas"], want["weight_decay"])
        assert isinstance(pg["betas"], tuple)
    steps(opt, ref, grads[3:])
    steps(opt2, resumed, grads[3:])
    for a, b in zip(ref, resumed, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
