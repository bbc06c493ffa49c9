"""bfloat16 GEMM and attention timings on the CPU under each INFINITRAIN_CPU_BF16_GEMM path, each path in its own
process (the switch is read once per process) with the same thread count, alternating rounds; prints the best
time of every case per path. A benchmark, not a test.

    PYTHONPATH=python .venv/bin/python -m infinitrain.tools.gemm_bench --threads=1,2 --paths=widen,sbgemm
"""

import argparse
import json
import os
import subprocess
import sys
import time

GEMMS = [(1024, 768, 3072), (4096, 768, 768), (1024, 3072, 768)]  # (M, K, N)
SDPA = [(8, 4, 128, 32), (4, 12, 256, 64)]  # (B, H, T, D), causal


def _best_ms(op, inputs, attrs, reps):
    op(inputs, attrs)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        op(inputs, attrs)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _worker(reps):
    import numpy as np

    import infinitrain as it
    from infinitrain import _C

    rng = np.random.default_rng(0)

    def bf16(*shape):
        return it.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(it.bfloat16)._t

    matmul, linear, sdpa, sdpa_bwd = (_C.op(n) for n in ("matmul", "linear", "sdpa", "sdpa_backward"))
    out = {}
    for m, k, n in GEMMS:
        a, b, w = bf16(m, k), bf16(k, n), bf16(n, k)
        out[f"matmul [{m},{k}]@[{k},{n}]"] = _best_ms(matmul, [a, b], [0, 0], reps)
        out[f"linear [{m},{k}]->{n}"] = _best_ms(linear, [a, w], [], reps)
    for B, H, T, D in SDPA:
        q, k, v, g = (bf16(B, H, T, D) for _ in range(4))
        attrs = [1, D**-0.5]
        o, lse = sdpa([q, k, v], attrs)
        out[f"sdpa causal [{B},{H},{T},{D}] fwd"] = _best_ms(sdpa, [q, k, v], attrs, reps)
        out[f"sdpa causal [{B},{H},{T},{D}] bwd"] = _best_ms(sdpa_bwd, [g, q, k, v, o, lse], attrs, reps)
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default=str(os.cpu_count()), help="comma-separated thread counts")
    ap.add_argument("--paths", default="widen,sbgemm", help="INFINITRAIN_CPU_BF16_GEMM values to compare")
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per path; the best counts")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per case in a run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return _worker(a.reps)
    paths = a.paths.split(",")
    for threads in (int(t) for t in a.threads.split(",")):
        best = {p: {} for p in paths}
        for _ in range(a.rounds):
            for p in paths:
                env = dict(os.environ, OMP_NUM_THREADS=str(threads), INFINITRAIN_CPU_BF16_GEMM=p)
                cmd = [sys.executable, "-m", "infinitrain.tools.gemm_bench", "--worker", "--reps", str(a.reps)]
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if r.returncode:
                    sys.exit(f"{p} worker failed:\n{r.stderr[-3000:]}")
                for case, ms in json.loads(r.stdout.strip().splitlines()[-1]).items():
                    best[p][case] = min(ms, best[p].get(case, float("inf")))
        print(f"threads={threads}  " + "  ".join(f"{p + ' ms':>12}" for p in paths))
        for case in best[paths[0]]:
            print(f"{case:34}" + "".join(f"{best[p][case]:>14.2f}" for p in paths), flush=True)


if __name__ == "__main__":
    main()
