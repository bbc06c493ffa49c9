"""CPU training speed against PyTorch eager: the same GPT-2 (tanh GELU, tied head, fused attention, AdamW,
gradient clipping) trained for some steps by infinitrain and by PyTorch, each in its own process with the
same thread count, alternating runs; prints median step times and the ratio. A benchmark, not a test.

    .venv/bin/python -m infinitrain.tools.torch_bench --torch_python=/tmp/torch-venv/bin/python --threads=2
    .venv/bin/python -m infinitrain.tools.torch_bench --side=ours --model=124m --threads=2 --steps=3 --profile

PyTorch comes from its own venv (pip install torch there; it is not a project dependency). This file runs
as a script under that interpreter too, so it imports infinitrain only on our side.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = {
    # name: (n_layer, n_head, n_embd, vocab (padded), block, batch, seq)
    "small": (4, 4, 128, 320, 128, 8, 128),  # the README's main job
    "124m": (12, 12, 768, 50304, 1024, 4, 256),  # GPT-2 124M
}


def _ours(model, steps, dtype, profile=False):
    import numpy as np

    import infinitrain as it
    from infinitrain.models import GPT2, GPT2Config

    L, H, C, V, block, B, T = MODELS[model]
    it.manual_seed(0)
    m = GPT2(GPT2Config(block_size=block, vocab_size=V, padded_vocab_size=V, n_layer=L, n_head=H, n_embd=C))
    opt = it.optim.AdamW(list(m.parameters()), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(0)
    x = it.from_numpy(rng.integers(0, V, (B, T)))
    y = it.from_numpy(rng.integers(0, V, (B, T)))

    def step():
        opt.zero_grad()
        with it.amp.autocast("cpu", dtype="bfloat16", enabled=dtype == "bfloat16"):
            _, loss = m(x, y)
        loss.backward()
        it.optim.clip_grad_norm_(list(m.parameters()), 1.0)
        opt.step()
        loss.item()

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if profile:  # one more step, its ops by time, on stderr (stdout carries the times)
        with it.profiler.profile() as prof:
            step()
        print(prof.table(top=20), file=sys.stderr)
    return times


def _torch(model, steps, dtype, threads, profile=False):
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    L, H, C, V, block, B, T = MODELS[model]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(block, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            for p in self.parameters():
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    torch.manual_seed(0)
    m = GPT()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        loss.item()

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if profile:  # one more step, PyTorch's ops by their own time, on stderr
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
    return times


def _worker(a):
    times = (
        _ours(a.model, a.steps, a.dtype, a.profile)
        if a.side == "ours"
        else _torch(a.model, a.steps, a.dtype, a.threads, a.profile)
    )
    print(json.dumps(times))


def _run(python, side, a, model, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS=str(threads))
    cmd = [python, os.path.abspath(__file__), "--side", side, "--model", model, "--steps", str(a.steps)]
    cmd += ["--threads", str(threads), "--dtype", a.dtype]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        sys.exit(f"{side} worker failed:\n{p.stderr[-3000:]}")
    times = json.loads(p.stdout.strip().splitlines()[-1])
    return statistics.median(times[a.warmup :])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch_python", help="a Python with torch installed")
    ap.add_argument("--models", default="small,124m")
    ap.add_argument("--threads", default=str(os.cpu_count()), help="comma-separated thread counts")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs per side; the best median counts")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--profile", action="store_true", help="with --side: print one step's ops by time")
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        a.threads = int(a.threads)
        return _worker(a)
    if not a.torch_python:
        sys.exit("--torch_python: a Python with torch (e.g. python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch)")
    print(f"{'model':6} {'threads':>7} {'dtype':>8} {'infinitrain ms':>15} {'torch ms':>9} {'ours/torch':>10}")
    for model in a.models.split(","):
        for threads in (int(t) for t in a.threads.split(",")):
            ours, theirs = [], []
            for _ in range(a.repeats):
                ours.append(_run(sys.executable, "ours", a, model, threads))
                theirs.append(_run(a.torch_python, "torch", a, model, threads))
            o, t = min(ours) * 1e3, min(theirs) * 1e3
            print(f"{model:6} {threads:>7} {a.dtype:>8} {o:>15.1f} {t:>9.1f} {o / t:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
