"""Benchmark (not a test): LoRA against full fine-tuning of the same model, in trainable parameters,
optimizer state, peak device memory during training steps and step time.

    PYTHONPATH=python .venv/bin/python -m infinitrain.tools.lora_bench --model=qwen3 --steps=3

Peak memory is the device allocator's peak of allocated bytes over the timed steps (weights, gradients,
optimizer moments and activations together), after one warm-up step.
"""

import argparse
import time

import numpy as np

import infinitrain as it
from infinitrain import _C
from infinitrain.models import registry


def run(args, rank):
    it.manual_seed(0)
    model = registry.build_model(
        args.model,
        args.vocab_size,
        args.sequence_length,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_kv_head=args.n_kv_head,
        n_embd=args.n_embd,
        device=args.device,
    )
    params = registry.setup_lora(model, args.model, rank, args.lora_alpha, args.lora_target_modules)
    opt = it.optim.AdamW(params, lr=1e-4)
    data = np.random.default_rng(0).integers(0, args.vocab_size, (args.batch_size, args.sequence_length + 1))
    x = it.from_numpy(data[:, :-1], device=args.device)
    y = it.from_numpy(data[:, 1:], device=args.device)

    def step():
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # warm-up: the optimizer's moments exist from here on
    _C.reset_peak_memory(args.device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    state = sum(t.numel() * (8 if t.dtype == "float64" else 4) for t in opt._state_tensors_live().values())
    return {
        "total": model.num_parameters(),
        "trainable": sum(p.numel() for p in params),
        "state_mib": state / 2**20,
        "peak_mib": _C.memory_stats(args.device)["peak_allocated"] / 2**20,
        "ms": ms,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3", choices=list(registry.FAMILIES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n_layer", type=int, default=8)
    ap.add_argument("--n_head", type=int, default=8)
    ap.add_argument("--n_kv_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=512)
    ap.add_argument("--vocab_size", type=int, default=8192)
    ap.add_argument("--sequence_length", type=int, default=128)
    ap.add_argument("--batch_size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora_rank", type=int, default=8)
    ap.add_argument("--lora_alpha", type=float, default=16.0)
    ap.add_argument("--lora_target_modules", default="")
    args = ap.parse_args(argv)
    full, adapted = run(args, 0), run(args, args.lora_rank)
    targets = args.lora_target_modules or registry.FAMILIES[args.model].lora_targets
    print(
        f"{args.model}: {args.n_layer} layers, n_embd {args.n_embd}, vocab {args.vocab_size}, "
        f"batch {args.batch_size}x{args.sequence_length}, {full['total'] / 1e6:.1f}M parameters, "
        f"device {args.device}; LoRA rank {args.lora_rank} on {targets}\n"
    )
    print("| | trainable parameters | optimizer state | peak memory | step time |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("full fine-tuning", full), (f"LoRA r={args.lora_rank}", adapted)):
        print(
            f"| {name} | {r['trainable'] / 1e6:.3f}M | {r['state_mib']:.1f} MiB | {r['peak_mib']:.1f} MiB "
            f"| {r['ms']:.0f} ms |"
        )
    print(
        f"\nLoRA / full: optimizer state {adapted['state_mib'] / full['state_mib']:.4f}x, "
        f"peak memory {adapted['peak_mib'] / full['peak_mib']:.2f}x"
    )


if __name__ == "__main__":
    main()
