"""FP8 quantize ops on the GPT-2 XL / LLaMA-1B tensor shapes: microseconds a call (host-timed over 50 back-to-back
calls, so the small shapes include launch overhead) and the share of the bytes' time at PEAK GB/s, for fp8_quantize,
a plain 16-bit cast (what the card's copy kernels reach) and fp8_quantize_delayed_ with each of its outputs added
(t: the transposed copy, c: the column sums, u: the history push).

    source .device/env.sh && PYTHONPATH=<payload>/python python3.11 tools/bench/fp8_quantize.py [PEAK_GBPS] [DEVICE]
"""

import sys
import time

import numpy as np

import infinitrain as it
from infinitrain import dispatch

PEAK = float(sys.argv[1]) if len(sys.argv) > 1 else 3350.0  # H100 SXM's HBM3
DEV = sys.argv[2] if len(sys.argv) > 2 else "cuda"
SHAPES = [((8192, 1600), "bfloat16"), ((8192, 6400), "bfloat16"), ((8192, 4800), "bfloat16"),
          ((1600, 6400), "float32"), ((4800, 1600), "float32"), ((8192, 2048), "bfloat16"),
          ((8192, 8192), "bfloat16")]  # fmt: skip


def us_per_call(fn, n=50):
    fn()
    it.runtime.synchronize(DEV)
    t = time.perf_counter()
    for _ in range(n):
        fn()
    it.runtime.synchronize(DEV)
    return (time.perf_counter() - t) / n * 1e6


def row(shape, dtype, hist, scale):
    x = it.tensor(np.random.default_rng(0).standard_normal(shape).astype(np.float32), device=DEV).to(dtype)
    n, size = shape[0] * shape[1], 2 if dtype == "bfloat16" else 4
    s0 = scale[0].reshape(())
    quantize = us_per_call(lambda: dispatch.op("fp8_quantize")([x._t, s0._t], ["float8_e4m3fn"]))
    cast = us_per_call(lambda: x.to("float16" if dtype == "bfloat16" else "bfloat16"))
    cells = [f"quantize {quantize:6.1f} us ({n * (size + 1) / PEAK / 1e3 / quantize:4.0%})", f"cast {cast:6.1f} us"]
    for t, c, u in [(0, 0, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1)]:
        op, ins = dispatch.op("fp8_quantize_delayed_"), [x._t, hist._t, scale._t]
        us = us_per_call(lambda op=op, ins=ins, a=[0, 0, "float8_e5m2", t, c, u]: op(ins, a))
        cells.append(f"t{t}c{c}u{u} {us:6.1f} us ({n * (size + 1 + t) / PEAK / 1e3 / us:4.0%})")
    return f"{shape} {dtype}: " + " | ".join(cells)


def main():
    hist, scale = it.zeros(3, 16, device=DEV), it.ones(3, device=DEV)
    for shape, dtype in SHAPES:
        print(row(shape, dtype, hist, scale), flush=True)


if __name__ == "__main__":
    main()
