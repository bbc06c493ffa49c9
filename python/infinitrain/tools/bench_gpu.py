"""GPU benchmark (not a test): GPT-2 124M or a LLaMA 3 of comparable size,
random init and tokens, bf16 autocast, AdamW, gradient clipping, the same
step as tools/bench/torch_models.py so the two can be compared on one card;
--fp8 runs the linear layers in FP8 (infinitrain.fp8).

    python3 -m infinitrain.tools.bench_gpu --device=cuda --model=gpt2 --batch=16

Prints one JSON line: tokens/s, ms/step, MFU against 989 TFLOP/s, peak memory.
"""

import json
import time

import numpy as np
from absl import app, flags

import infinitrain as it
from infinitrain import fp8
from infinitrain.compiler import fusing
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config
from infinitrain.runs import memory as runs_memory

FLAGS = flags.FLAGS
flags.DEFINE_string("device", "cuda", "Device to measure.")
flags.DEFINE_enum(
    "model",
    "gpt2",
    ["gpt2", "llama3", "gpt2-xl", "llama3-1b"],
    "Model: 124M shapes, GPT-2 XL, or LLaMA 3.2-1B's shape.",
)
flags.DEFINE_integer("batch", 16, "Sequences per step.")
flags.DEFINE_integer("seq", 1024, "Tokens per sequence.")
flags.DEFINE_integer("steps", 20, "Timed steps.")
flags.DEFINE_integer("warmup", 5, "Untimed steps first.")
flags.DEFINE_float("peak_tflops", 989.0, "Dense bf16 peak of the card, for MFU.")
flags.DEFINE_string("profile", "", "Also profile one step: print the top ops and write a Chrome trace here.")
flags.DEFINE_integer("top", 15, "Ops in the profile table.")
flags.DEFINE_bool("fp8", False, "The linear layers in FP8 (infinitrain.fp8.convert, delayed scaling).")


def build(model, seq, device):
    if model in ("gpt2", "gpt2-xl"):
        shape = dict(n_layer=12, n_head=12, n_embd=768) if model == "gpt2" else dict(n_layer=48, n_head=25, n_embd=1600)
        cfg = GPT2Config(block_size=seq, vocab_size=50257, padded_vocab_size=50304, **shape)
        return GPT2(cfg, device), cfg.vocab_size
    if model == "llama3":
        shape = dict(vocab_size=32000, n_layer=12, n_head=12, n_kv_head=4, n_embd=768, ffn_dim_multiplier=1.0)
    else:  # LLaMA 3.2-1B's shape (FFN 8192), its head untied as this model family has it
        shape = dict(vocab_size=128256, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_dim_multiplier=1.5)
    cfg = LLaMA3Config(block_size=seq, multiple_of=256, use_scaled_rope=False, **shape)
    return LLaMA3(cfg, device), cfg.vocab_size


def flops_per_token(model, n_params, seq):
    """6 N for the matmuls plus attention's 12 L T d (forward and backward), as llm.c and nanoGPT count."""
    cfg = model.config
    return 6 * n_params + 12 * cfg.n_layer * seq * cfg.n_embd


def main(argv):
    del argv
    device = it.runtime.parse_device(FLAGS.device)
    it.manual_seed(0)
    model, vocab = build(FLAGS.model, FLAGS.seq, device)
    if FLAGS.fp8:
        fp8.convert(model)
    params = list(model.parameters())
    opt = it.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = np.random.default_rng(0).integers(0, vocab, size=(FLAGS.batch, FLAGS.seq + 1))
    x = it.from_numpy(data[:, :-1], device=device)
    y = it.from_numpy(data[:, 1:], device=device)

    def step():
        opt.zero_grad()
        with it.amp.autocast(device, dtype="bfloat16"), fusing():  # as the Trainer runs models
            _, loss = model(x, y)
        loss.backward()
        it.optim.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    for _ in range(FLAGS.warmup):
        step().item()
    it.runtime.synchronize(device)
    it.runtime.reset_peak_memory_stats(device)
    times = []
    for _ in range(FLAGS.steps):
        t0 = time.perf_counter()
        loss = step()
        loss.item()
        times.append(time.perf_counter() - t0)
    med = float(np.median(times))
    if FLAGS.profile:
        with it.profiler.profile() as prof:
            step().item()
        print(prof.table(top=FLAGS.top))
        prof.export_chrome_trace(FLAGS.profile)
    n_params = model.num_parameters()
    memory = runs_memory.by_category(params, opt, it.runtime.max_memory_allocated(device))
    tokens = FLAGS.batch * FLAGS.seq
    mfu = flops_per_token(model, n_params, FLAGS.seq) * tokens / med / (FLAGS.peak_tflops * 1e12)
    print(
        json.dumps(
            {
                "framework": "infinitrain",
                "model": FLAGS.model,
                "fp8": FLAGS.fp8,
                "batch": FLAGS.batch,
                "seq": FLAGS.seq,
                "params_M": round(n_params / 1e6, 2),
                "ms_per_step": round(med * 1000, 2),
                "tokens_per_s": round(tokens / med),
                "mfu": round(mfu, 4),
                "peak_GB": round(it.runtime.max_memory_allocated(device) / 1e9, 2),
                "memory_GB": {k: round(v, 2) for k, v in memory.items()},
                "loss": round(loss.item(), 4),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    app.run(main)
