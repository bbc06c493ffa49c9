"""The PyTorch side of the GPU benchmark: GPT-2 and LLaMA 3 written the way a
PyTorch user writes them (nanoGPT style), trained on random tokens with bf16
autocast and fused AdamW. Runs under the GPU machine's own python3 with torch.

    python3 tools/bench/torch_models.py --model gpt2 --batch 16 --mode eager
    modes: eager (scaled_dot_product_attention), naive (attention by matmul and
    softmax), compile (torch.compile of the eager model)

Prints one JSON line: tokens/s, ms/step, peak memory.
"""

import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn


class GPT2Block(nn.Module):
    def __init__(self, d, h, naive):
        super().__init__()
        self.h, self.naive = h, naive
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, q, k, v):
        if not self.naive:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.shape[-2]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def init_weights(m):
    # GPT-2's initialisation, as infinitrain's models (PyTorch's default N(0, 1) embeddings put the first loss
    # near 80 through the tied head; speed does not depend on it, the printed loss does).
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


class GPT2(nn.Module):
    def __init__(self, vocab=50304, T=1024, layers=12, heads=12, d=768, naive=False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(GPT2Block(d, heads, naive) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.apply(init_weights)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class LlamaBlock(nn.Module):
    def __init__(self, d, h, kv, hidden, naive):
        super().__init__()
        self.h, self.kv, self.naive = h, kv, naive
        hd = d // h
        self.norm_1, self.norm_2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.wq, self.wk, self.wv = (
            nn.Linear(d, d, bias=False),
            nn.Linear(d, kv * hd, bias=False),
            nn.Linear(d, kv * hd, bias=False),
        )
        self.wo = nn.Linear(d, d, bias=False)
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hd = C // self.h
        h = self.norm_1(x)
        q = self.wq(h).view(B, T, self.h, hd)
        k = self.wk(h).view(B, T, self.kv, hd)
        v = self.wv(h).view(B, T, self.kv, hd)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm_2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(x, cos, sin):
    # Interleaved pairs (x[2i], x[2i+1]), as infinitrain's rope.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2).type_as(x)


class Llama(nn.Module):
    def __init__(self, vocab=32000, T=1024, layers=12, heads=12, kv=4, d=768, hidden=2048, naive=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, kv, hidden, naive) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        ang = torch.arange(T)[:, None] * (500000.0 ** (-torch.arange(0, hd, 2) / hd))[None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.apply(init_weights)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


# The shapes of infinitrain.tools.bench_gpu's --model choices.
SHAPES = {
    "gpt2": (GPT2, {}),
    "llama3": (Llama, {}),
    "gpt2-xl": (GPT2, dict(layers=48, heads=25, d=1600)),
    "llama3-1b": (Llama, dict(vocab=128256, layers=16, heads=32, kv=8, d=2048, hidden=8192)),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=list(SHAPES), default="gpt2")
    p.add_argument("--mode", choices=["eager", "naive", "compile"], default="eager")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ddp", action="store_true", help="under torchrun: DistributedDataParallel over the processes")
    a = p.parse_args()
    torch.manual_seed(0)
    dev, world = "cuda", 1
    if a.ddp:  # under torchrun: one GPU a process, gradients averaged by DDP; tokens/s counts every rank's
        torch.distributed.init_process_group("nccl")
        world = torch.distributed.get_world_size()
        dev = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(dev)
    family, shape = SHAPES[a.model]
    model = family(T=a.seq, naive=a.mode == "naive", **shape).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev]) if a.ddp else model
    step_fn = torch.compile(net) if a.mode == "compile" else net
    vocab = 50257 if family is GPT2 else shape.get("vocab", 32000)
    torch.manual_seed(int(os.environ.get("RANK", "0")))  # each rank its own rows
    data = torch.randint(0, vocab, (a.batch, a.seq + 1), device=dev)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        loss.item()
        times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "framework": "pytorch",
        "mode": a.mode,
        "model": a.model,
        "batch": a.batch,
        "seq": a.seq,
        "params_M": round(n_params / 1e6, 2),
        "ms_per_step": round(med * 1000, 2),
        "tokens_per_s": round(world * a.batch * a.seq / med),
        "world": world,
        "peak_GB": round(torch.cuda.max_memory_allocated() / 1e9, 2),
        "loss": round(loss.item(), 4),
        "torch": torch.__version__,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result), flush=True)
    if a.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
