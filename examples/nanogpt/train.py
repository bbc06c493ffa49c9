"""Trains the GPT of model.py with a loop in the shape of nanoGPT's train.py, written as PyTorch code: the imports
name infinitrain where PyTorch code names torch, and nothing else differs. One process, or data parallel under
the launcher (torchrun's shape):

    python examples/nanogpt/prepare.py input.txt data/
    python examples/nanogpt/train.py --data_dir=data --device=cuda --dtype=bfloat16 --compile
    python -m infinitrain.run --nproc_per_node=2 examples/nanogpt/train.py --data_dir=data --backend=gloo --device=cpu

Checkpoints (--out_dir) hold the model, the optimizer, the iteration and the batch generator's state; a run started
again with --init_from=resume continues exactly where it stopped.
"""

import argparse
import math
import os
import pickle
import time
from contextlib import nullcontext

import numpy as np
from model import GPT, GPTConfig  # noqa: I001 (this folder's model.py)

import infinitrain as torch
from infinitrain.distributed import destroy_process_group, init_process_group
from infinitrain.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--data_dir", default="data", help="train.bin, val.bin and meta.pkl from prepare.py")
p.add_argument("--out_dir", default="", help="checkpoint folder (empty: no checkpoints)")
p.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
p.add_argument("--backend", default="nccl", help="the process group's backend under the launcher")
p.add_argument("--compile", action="store_true")
p.add_argument("--batch_size", type=int, default=12)
p.add_argument("--block_size", type=int, default=64)
p.add_argument("--n_layer", type=int, default=4)
p.add_argument("--n_head", type=int, default=4)
p.add_argument("--n_embd", type=int, default=128)
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True)
p.add_argument("--learning_rate", type=float, default=1e-3)
p.add_argument("--min_lr", type=float, default=1e-4)
p.add_argument("--warmup_iters", type=int, default=10)
p.add_argument("--max_iters", type=int, default=200)
p.add_argument("--stop_after", type=int, default=0, help="stop (after saving) at this iteration, to resume later")
p.add_argument("--weight_decay", type=float, default=0.1)
p.add_argument("--beta2", type=float, default=0.99)
p.add_argument("--grad_clip", type=float, default=1.0)
p.add_argument("--gradient_accumulation_steps", type=int, default=1)
p.add_argument("--eval_interval", type=int, default=100)
p.add_argument("--eval_iters", type=int, default=10)
p.add_argument("--log_interval", type=int, default=1)
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--sample_tokens", type=int, default=0, help="print a sample of this many characters at the end")
args = p.parse_args()

# ---- processes and devices ----
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=args.backend)
    ddp_rank, ddp_local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}" if args.device == "cuda" else args.device
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    master = ddp_rank == 0
    assert args.gradient_accumulation_steps % world_size == 0 or args.gradient_accumulation_steps == 1
    grad_accum = max(1, args.gradient_accumulation_steps // world_size)
else:
    ddp_rank, world_size, master, device, grad_accum = 0, 1, True, args.device, args.gradient_accumulation_steps
torch.manual_seed(args.seed + ddp_rank)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
ctx = nullcontext() if args.dtype == "float32" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# ---- data: raw uint16 token files, read through memory maps ----
gen = torch.Generator().manual_seed(args.seed + ddp_rank)  # the batch stream, saved in checkpoints


def get_batch(split):
    data = np.memmap(os.path.join(args.data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - args.block_size, (args.batch_size,), generator=gen)
    x = torch.stack([torch.from_numpy(data[i : i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)) for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


with open(os.path.join(args.data_dir, "meta.pkl"), "rb") as f:
    meta = pickle.load(f)

# ---- model, optimizer, checkpoint ----
iter_num, best_val_loss = 0, 1e9
model_args = dict(
    n_layer=args.n_layer,
    n_head=args.n_head,
    n_embd=args.n_embd,
    block_size=args.block_size,
    bias=args.bias,
    vocab_size=meta["vocab_size"],
    dropout=args.dropout,
)
ckpt_path = os.path.join(args.out_dir, "ckpt.pt") if args.out_dir else ""
checkpoint = None
if args.init_from == "resume":
    checkpoint = torch.load(ckpt_path, map_location=device)
    model_args = checkpoint["model_args"]
model = GPT(GPTConfig(**model_args)).to(device)
optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (0.9, args.beta2), device_type)
scaler = torch.cuda.amp.GradScaler(enabled=(args.dtype == "float16"))
if checkpoint is not None:
    state_dict = checkpoint["model"]
    unwanted_prefix = "_orig_mod."  # a compiled model's keys
    for k in list(state_dict):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix) :]] = state_dict.pop(k)
    model.load_state_dict(state_dict)
    optimizer.load_state_dict(checkpoint["optimizer"])
    gen.set_state(checkpoint["generator"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    checkpoint = None
if master:
    print(f"{model.get_num_params() / 1e6:.2f}M parameters on {device}, {world_size} process(es)")
if args.compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            X, Y = get_batch(split)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at max_iters."""
    if it < args.warmup_iters:
        return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
    if it > args.max_iters:
        return args.min_lr
    ratio = (it - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.learning_rate - args.min_lr)


batch_state = gen.get_state()  # the generator before the batch in hand: a checkpoint resumes with that batch
X, Y = get_batch("train")
t0 = time.time()
running_mfu = -1.0
while iter_num < args.max_iters:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % args.eval_interval == 0 and iter_num > 0 and master:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        best_val_loss = min(best_val_loss, float(losses["val"]))
    for micro_step in range(grad_accum):
        if ddp:
            model.require_backward_grad_sync = micro_step == grad_accum - 1
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / grad_accum
        batch_state = gen.get_state()
        X, Y = get_batch("train")  # the next batch while this one's backward runs (on an asynchronous device)
        scaler.scale(loss).backward()
    if args.grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % args.log_interval == 0 and master:
        lossf = loss.item() * grad_accum
        if iter_num >= 5:
            mfu = raw_model.estimate_mfu(args.batch_size * grad_accum, dt)
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        print(f"iter {iter_num}: loss {lossf:.6f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%")
    if master and ckpt_path and (iter_num % args.eval_interval == 0 or iter_num in (args.max_iters, args.stop_after)):
        os.makedirs(args.out_dir, exist_ok=True)
        checkpoint = {
            "model": raw_model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "model_args": model_args,
            "iter_num": iter_num,
            "best_val_loss": best_val_loss,
            "generator": batch_state,
        }
        torch.save(checkpoint, ckpt_path)
        print(f"saving checkpoint to {args.out_dir}")
    if iter_num == args.stop_after:
        break

if args.sample_tokens and master:
    model.eval()
    start = torch.zeros((1, 1), dtype=torch.long, device=device)
    out = raw_model.generate(start, args.sample_tokens, temperature=0.8, top_k=40)
    print("".join(meta["itos"][i] for i in out[0].tolist()))
if ddp:
    destroy_process_group()
