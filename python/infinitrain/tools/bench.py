"""Benchmarks (not tests): the per-op host overhead of the Python path and the
main job's training throughput.

    ./bazelw run //python:bench -- --device=cpu --steps=20
"""

import time

import numpy as np
from absl import app, flags

import infinitrain as it
from infinitrain import _C
from infinitrain.models import GPT2, GPT2Config

FLAGS = flags.FLAGS
flags.DEFINE_string("device", "cpu", "Device to measure.")
flags.DEFINE_integer("steps", 20, "Training steps to time (after 3 warm-up steps).")
flags.DEFINE_integer("op_iters", 20000, "Calls per op-overhead measurement.")


def per_call_us(fn, iters):
    for _ in range(100):
        fn()
    best = float("inf")
    for _ in range(5):  # best of 5: the least-disturbed run
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def op_overhead(device, iters):
    a = it.randn(4, device=device)
    b = it.randn(4, device=device)
    ag = it.randn(4, device=device, requires_grad=True)
    add = _C.op("add")
    rows = [
        ("_C.op('add')([a, b], [])  (dispatcher floor)", per_call_us(lambda: add([a._t, b._t], []), iters)),
        ("a + b  (no grad)", per_call_us(lambda: a + b, iters)),
        ("a + b  (records a graph node)", per_call_us(lambda: ag + b, iters)),
        ("a * 2.0  (scalar op)", per_call_us(lambda: a * 2.0, iters)),
        ("F.linear 4x4  (no grad)", per_call_us(lambda: it.functional.linear(a.reshape(1, 4), b.reshape(1, 4)), iters)),
    ]
    return rows


def train_throughput(device, steps):
    it.manual_seed(0)
    B, T = 8, 128
    model = GPT2(GPT2Config(T, 257, 320, 4, 4, 128), device)
    opt = it.optim.AdamW(list(model.parameters()), lr=1e-3)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 257, size=(B, T + 1))
    x, y = it.from_numpy(data[:, :-1], device=device), it.from_numpy(data[:, 1:], device=device)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        loss.item()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    return model.num_parameters(), B * T, med


def main(argv):
    del argv
    device = _C.parse_device(FLAGS.device)
    print(f"device {device}")
    print("| per-op host overhead | us per call |")
    print("|---|---|")
    for name, us in op_overhead(device, FLAGS.op_iters):
        print(f"| {name} | {us:.2f} |")
    n, tokens, med = train_throughput(device, FLAGS.steps)
    print()
    print("| main job (GPT-2 4x128, B=8, T=128, AdamW) | value |")
    print("|---|---|")
    print(f"| parameters | {n / 1e6:.2f}M |")
    print(f"| median step | {med * 1000:.1f} ms |")
    print(f"| throughput | {tokens / med:.0f} tok/s |")


if __name__ == "__main__":
    app.run(main)
