"""User-written models, the same source under PyTorch and under infinitrain (a benchmark, not a test).

The models are written the way PyTorch users write theirs: a nanoGPT-style GPT (nn.Linear, nn.GELU() with its
default exact form, nn.LayerNorm, F.scaled_dot_product_attention on q/k/v split, viewed and transposed, dropout,
weight tying) and a LLaMA-style decoder (nn.RMSNorm, rotary embeddings by rotate-half, grouped-query attention,
a SwiGLU MLP). The only line that differs between the frameworks is the import:

    python3 tools/bench/user_models.py --framework torch --model gpt --size 124m --mode eager
    python3.11 tools/bench/user_models.py --framework infinitrain --model gpt --size 124m --mode compile

Each run trains on random tokens with bf16 autocast (on an accelerator), AdamW(fused=True) and gradient clipping,
and prints one JSON line: tokens/s, ms a step, peak memory, the first and last loss.
"""

import argparse
import importlib
import json
import math
import time

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--framework", choices=["torch", "infinitrain"], default="torch")
p.add_argument("--model", choices=["gpt", "llama"], default="gpt")
p.add_argument("--size", choices=["small", "124m"], default="small")
p.add_argument("--mode", choices=["eager", "compile"], default="eager")
p.add_argument("--batch", type=int, default=0, help="sequences a step (default: 64 small, 16 124m)")
p.add_argument("--device", default="cuda")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--threads", type=int, default=0, help="CPU threads (0: the framework's default)")
p.add_argument("--profile", action="store_true", help="print the framework's profile of one step")
args = p.parse_args()

torch = importlib.import_module(args.framework)  # `import torch` or `import infinitrain as torch`
nn = torch.nn
F = torch.nn.functional

SIZES = {  # (layers, heads, kv heads, width, sequence, vocab, default batch)
    "small": (6, 6, 2, 384, 256, 65, 64),
    "124m": (12, 12, 4, 768, 1024, 50304, 16),
}
n_layer, n_head, n_kv_head, n_embd, block_size, vocab_size, default_batch = SIZES[args.size]
batch = args.batch or default_batch


# ---- nanoGPT-style GPT -----------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(0.0)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([Block() for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(n_embd),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---- LLaMA-style decoder ---------------------------------------------------------------------------------------


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = n_embd // n_head
        self.wq = nn.Linear(n_embd, n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(n_head * self.head_dim, n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, n_head, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, n_kv_head, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, n_kv_head, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        hidden = 256 * ((int(2 * 4 * n_embd / 3) + 255) // 256)
        self.w1 = nn.Linear(n_embd, hidden, bias=False)
        self.w3 = nn.Linear(n_embd, hidden, bias=False)
        self.w2 = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(n_embd, eps=1e-5)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(n_embd, eps=1e-5)
        self.feed_forward = FeedForward()

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, n_embd)
        self.layers = nn.ModuleList([DecoderLayer() for _ in range(n_layer)])
        self.norm = nn.RMSNorm(n_embd, eps=1e-5)
        self.output = nn.Linear(n_embd, vocab_size, bias=False)
        hd = n_embd // n_head
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        t = torch.arange(block_size).float()
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---- the training step -----------------------------------------------------------------------------------------


def main():
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    on_accel = not device.startswith("cpu")
    torch.manual_seed(0)
    model = (GPT() if args.model == "gpt" else Llama()).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=on_accel)
    if args.mode == "compile":
        model = torch.compile(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab_size, (batch, block_size), generator=g).to(device)
    y = torch.randint(0, vocab_size, (batch, block_size), generator=g).to(device)
    amp = torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=on_accel)

    def step():
        with amp:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if on_accel:
            torch.cuda.synchronize()

    first = step().item()
    for _ in range(args.warmup - 1):
        step()
    sync()
    if on_accel:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    sync()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    last = loss.item()
    if args.profile:
        if args.framework == "torch":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                sync()
            print(prof.key_averages().table(sort_by="cuda_time_total" if on_accel else "cpu_time_total", row_limit=25))
        else:
            import infinitrain.profiler as itprof

            with itprof.profile() as prof:
                step()
                sync()
            print(prof.table(top=25))
    peak = torch.cuda.max_memory_allocated() / 2**30 if on_accel else float("nan")
    tokens = batch * block_size
    print(
        json.dumps(
            {
                "framework": args.framework,
                "model": args.model,
                "size": args.size,
                "mode": args.mode,
                "batch": batch,
                "params_m": round(n_params / 1e6, 1),
                "ms": round(ms, 2),
                "tokens_per_s": round(tokens / ms * 1e3),
                "peak_gb": round(peak, 2),
                "loss_first": round(first, 4),
                "loss_last": round(last, 4),
            }
        )
    )


main()
