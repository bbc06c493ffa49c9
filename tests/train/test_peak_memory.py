"""The peak-memory split bench_gpu prints: weights, gradients and optimizer state counted from the tensors."""

import infinitrain as it
from harness import DEVICE
from infinitrain.runs import memory


def test_memory_by_category_counts_weights_grads_and_adam_moments():
    model = it.nn.Sequential(it.nn.Linear(96, 80), it.nn.Linear(80, 8, bias=False)).to(DEVICE)
    params = list(model.parameters())
    opt = it.optim.AdamW(params, lr=1e-3)
    model(it.randn(4, 96, device=DEVICE)).sum().backward()
    opt.step()
    n = 96 * 80 + 80 + 80 * 8
    peak = 10**9  # 1 GB: the rest is what the three parts leave of it
    got = memory.by_category(params, opt, peak)
    want = {"weights": 4 * n, "grads": 4 * n, "optimizer": 8 * n, "activations_and_workspace": 10**9 - 16 * n}
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert abs(got[k] * 1e9 - v) < 1e-3, k
