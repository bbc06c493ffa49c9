"""Trains the nanoGPT-style model in model.py with a training loop in the style of nanoGPT's train.py,
written against infinitrain as a PyTorch user writes one.

    .venv/bin/python examples/nanogpt/train.py --max_iters=200            # the Shakespeare corpus, bytes
    .venv/bin/python examples/nanogpt/train.py --input_bin=train.bin --device=sim:0 --dtype=bfloat16

(after `./bazelw run //python:develop`, or with the wheel installed). Checkpoints (--out_dir) are
it.save files (safetensors), resumed with --init_from=resume.
"""

import argparse
import math
import os
import time
from contextlib import nullcontext

import numpy as np
from model import GPT, GPTConfig  # noqa: I001 (this folder's model.py)

import infinitrain as it
from infinitrain.data import ByteTokenizer, TokenFile, default_corpus

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--input_bin", default="", help="llm.c token file (default: the Shakespeare corpus)")
p.add_argument("--out_dir", default="", help="checkpoint folder (empty: no checkpoints)")
p.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
p.add_argument("--device", default="cpu")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--block_size", type=int, default=128)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--learning_rate", type=float, default=1e-3)
p.add_argument("--min_lr", type=float, default=1e-4)
p.add_argument("--warmup_iters", type=int, default=10)
p.add_argument("--max_iters", type=int, default=200)
p.add_argument("--stop_after", type=int, default=0, help="stop (after saving) at this iteration, to resume later")
p.add_argument("--weight_decay", type=float, default=0.1)
p.add_argument("--grad_clip", type=float, default=1.0)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
p.add_argument("--eval_interval", type=int, default=100)
p.add_argument("--eval_iters", type=int, default=10)
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--sample_tokens", type=int, default=0, help="print a sample of this many tokens at the end")
args = p.parse_args()

it.manual_seed(args.seed)
device_type = args.device.split(":")[0]
ctx = nullcontext() if args.dtype == "float32" else it.autocast(device_type=device_type, dtype=args.dtype)

# Data: one token file, the last 10% held out.
path = args.input_bin or default_corpus()[0]
data = np.asarray(TokenFile(path)[:]).astype(np.int64)
split = int(0.9 * len(data))
splits = {"train": data[:split], "val": data[split:]}
gen = it.Generator().manual_seed(args.seed)  # batches come from their own stream, so resume sees the same ones


def get_batch(name):
    d = splits[name]
    ix = it.randint(len(d) - args.block_size - 1, (args.batch_size,), generator=gen).tolist()
    x = it.stack([it.from_numpy(d[i : i + args.block_size]) for i in ix])
    y = it.stack([it.from_numpy(d[i + 1 : i + 1 + args.block_size]) for i in ix])
    return x.to(args.device, non_blocking=True), y.to(args.device, non_blocking=True)


def next_train_batch():
    """The next training batch; remembers the generator's state before it, which a checkpoint stores, so a
    resumed run draws the batch that was fetched ahead but not yet used."""
    global batch_state
    batch_state = gen.get_state()
    return get_batch("train")


iter_num, best_val_loss = 0, 1e9
model_args = dict(
    n_layer=args.n_layer,
    n_head=args.n_head,
    n_embd=args.n_embd,
    block_size=args.block_size,
    vocab_size=int(data.max()) + 1,
    dropout=args.dropout,
)
ckpt_path = os.path.join(args.out_dir, "ckpt.safetensors") if args.out_dir else ""
checkpoint = None
if args.init_from == "resume":
    checkpoint = it.load(ckpt_path, map_location=args.device)
    model_args = checkpoint["model_args"]
model = GPT(GPTConfig(**model_args)).to(args.device)
optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (0.9, 0.95))
scaler = it.amp.GradScaler(device_type, enabled=(args.dtype == "float16"))
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    gen.set_state(checkpoint["generator"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    checkpoint = None
print(f"{model.get_num_params() / 1e6:.2f}M parameters on {args.device}, data {path} ({len(data)} tokens)")


@it.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for name in ("train", "val"):
        losses = it.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(name)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[name] = losses.mean().item()
    model.train()
    return out


def get_lr(i):
    if i < args.warmup_iters:
        return args.learning_rate * (i + 1) / (args.warmup_iters + 1)
    if i > args.max_iters:
        return args.min_lr
    ratio = (i - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - args.min_lr)


X, Y = next_train_batch()
t0 = time.time()
while iter_num < args.max_iters:
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if iter_num % args.eval_interval == 0 and iter_num > 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if ckpt_path and losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
    for _ in range(args.gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / args.gradient_accumulation_steps
        X, Y = next_train_batch()  # the next batch while this one's backward runs (on an asynchronous device)
        scaler.scale(loss).backward()
    if args.grad_clip != 0.0:
        scaler.unscale_(optimizer)
        it.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    t1 = time.time()
    print(f"iter {iter_num}: loss {loss.item() * args.gradient_accumulation_steps:.6f}, time {(t1 - t0) * 1000:.1f}ms")
    t0 = t1
    if ckpt_path and (iter_num % args.eval_interval == 0 or iter_num in (args.max_iters, args.stop_after)):
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "model_args": model_args,
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "generator": batch_state,
        }
        it.save(state, ckpt_path)
        print(f"saved {ckpt_path}")
    if iter_num == args.stop_after:
        break

if args.sample_tokens:
    model.eval()
    eot = ByteTokenizer.eot if model_args["vocab_size"] > ByteTokenizer.eot else 0
    start = it.full((1, 1), eot, dtype=it.long, device=args.device)
    out = model.generate(start, args.sample_tokens, temperature=0.8, top_k=40, generator=it.Generator(args.seed))
    print(ByteTokenizer().decode(out[0, 1:].tolist()))
