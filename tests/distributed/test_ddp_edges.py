"""DistributedDataParallel's buckets in one process (a world of one rank): bucket_cap_mb is in MiB (2**20 bytes,
as PyTorch's), and each bucket is one all-reduce of its parameters' gradients, filled in reverse registration
order up to the cap."""

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
