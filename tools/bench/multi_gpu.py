"""The multi-GPU proof (not a test): on a machine with N >= 2 GPUs and a staged cuda payload, trains GPT-2 124M
in bf16 on one GPU and on N under every data and model-parallel scheme with the same global batch, a Mixtral
with its experts split, and PyTorch DDP (tools/bench/torch_models.py under torchrun) as the anchor, one after
another; writes each run's metrics and a table (loss vs the one-GPU curve, tokens/s, scaling) under --out.

    source .device/env.sh && export LD_LIBRARY_PATH=$PWD/.device/payload/cuda/lib:$LD_LIBRARY_PATH
    PYTHONPATH=$PWD/.device/payload/cuda/python python3.11 tools/bench/multi_gpu.py --nproc=2 --out=$OUT/mg
    python3.11 tools/bench/multi_gpu.py --device=cpu --nproc=2 --smoke --out=/tmp/mg   # the plumbing, on Gloo

Loss curves are compared step by step with bf16's tolerance (1e-2; the compare tool's); tokens/s is the median
after the first steps (warm-up). Scaling efficiency: N-GPU tokens/s / (N x one-GPU tokens/s).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LOSS_TOL = 1e-2
SKIP = 3  # warm-up steps left out of the throughput


def runs(n, smoke):
    """(name, processes, extra train flags, model flags): the schemes, each on the same global batch."""
    gpt2 = ["--model=gpt2-tiny"] if smoke else ["--model=gpt2"]
    mixtral = ["--model=mixtral", "--vocab_size=50257", "--num_experts=4"]
    mixtral += ["--n_layer=2"] if smoke else ["--n_layer=8", "--n_embd=512", "--n_head=8", "--n_kv_head=4"]
    out = [
        ("1 GPU", 1, [], gpt2),
        (f"DDP x{n}", n, [], gpt2),
        (f"ZeRO-1 x{n}", n, ["--zero_stage=1"], gpt2),
        (f"ZeRO-2 x{n}", n, ["--zero_stage=2"], gpt2),
        (f"ZeRO-3 x{n}", n, ["--zero_stage=3"], gpt2),
        ("TP=2 + SP", 2, ["--tensor_parallel=2", "--sequence_parallel"], gpt2),
        ("PP=2 (1F1B)", 2, ["--pipeline_parallel=2", "--pipeline_schedule=1f1b"], gpt2),
        ("Mixtral 1 GPU", 1, [], mixtral),
        ("Mixtral EP=2", 2, ["--tensor_parallel=2"], mixtral),
    ]
    return out


def _size(extra, name):
    for f in extra:
        if f.startswith(f"--{name}="):
            return int(f.split("=")[1])
    return 1


def train(args, name, nproc, extra, model, data, total):
    run_dir = os.path.join(args.out, name.replace(" ", "_").replace("=", "").replace("+", "").replace("(", "")
                           .replace(")", ""))  # fmt: skip
    os.makedirs(run_dir, exist_ok=True)
    # One micro-batch a step everywhere, the global batch split over the data-parallel replicas: the loader then
    # gives every run the same rows (accumulating micro-batches would read them in another order).
    replicas = nproc // (_size(extra, "tensor_parallel") * _size(extra, "pipeline_parallel"))
    rows = total // args.seq // replicas
    flags = [f"--device={args.device}", f"--input_bin={data}", *model, *extra, f"--batch_size={rows}"]
    flags += [f"--sequence_length={args.seq}", f"--total_batch_size={total}", f"--num_iteration={args.steps}"]
    flags += ["--dtype=bfloat16", "--sample_every=0", "--val_every=0", f"--metrics_file={run_dir}/metrics.jsonl"]
    flags += ["--lr_warmup_iters=2", "--seed=1234"]
    launcher = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={nproc}", "--master_port=0"]
    cmd = [*(launcher if nproc > 1 else [sys.executable]), "-m", "infinitrain.train", *flags]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    with open(os.path.join(run_dir, "log.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    if p.returncode:
        return {"name": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200], "s": time.time() - t0}
    steps = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "step":
                steps[r["step"]] = r
    order = sorted(steps)
    tps = [steps[s]["tokens_per_s"] for s in order if s > SKIP] or [steps[s]["tokens_per_s"] for s in order]
    return {
        "name": name,
        "procs": nproc,
        "losses": [steps[s]["train_loss"] for s in order],
        "tok_s": float(np.median(tps)),
        "mem_mib": max(steps[s]["mem_peak_mib"] for s in order),
        "s": time.time() - t0,
    }


def torch_ddp(args, n):
    """PyTorch DDP through torchrun (the machine's own python3), the same model and step as torch_models.py."""
    cmd = ["torchrun", f"--nproc_per_node={n}", os.path.join(HERE, "torch_models.py"), "--model=gpt2",
           f"--batch={args.micro}", f"--seq={args.seq}", "--mode=eager", "--ddp"]  # fmt: skip
    if args.device != "cuda":
        return {"name": f"PyTorch DDP x{n}", "error": "needs cuda"}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except FileNotFoundError:
        return {"name": f"PyTorch DDP x{n}", "error": "no torchrun here"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"name": f"PyTorch DDP x{n}", "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    r = json.loads(lines[-1])
    return {"name": f"PyTorch DDP x{n}", "procs": n, "tok_s": float(r["tokens_per_s"]), "mem_mib": r["peak_GB"] * 1e3}


def table(results, n):
    base = {r["name"]: r for r in results}
    one, mix = base.get("1 GPU"), base.get("Mixtral 1 GPU")
    rows = ["| run | processes | max loss diff vs 1 GPU | within 1e-2 | tok/s | scaling | peak MiB |",
            "|---|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for r in results:
        if "error" in r:
            rows.append(f"| {r['name']} | - | - | failed: {r['error']} | - | - | - |")
            continue
        ref = mix if r["name"].startswith("Mixtral") else one
        diff = ok = "-"
        if "losses" in r and ref and "losses" in ref and ref is not r:
            k = min(len(r["losses"]), len(ref["losses"]))
            d = float(np.max(np.abs(np.array(r["losses"][:k]) - np.array(ref["losses"][:k]))))
            diff, ok = f"{d:.2e}", "yes" if d <= LOSS_TOL else "NO"
        scaling = "-"
        if ref and "tok_s" in ref and r["procs"] > 1 and not r["name"].startswith(("TP", "PP", "Mixtral EP")):
            scaling = f"{r['tok_s'] / (r['procs'] * ref['tok_s']):.3f}"
        rows.append(f"| {r['name']} | {r['procs']} | {diff} | {ok} | {r['tok_s']:,.0f} | {scaling} | "
                    f"{r['mem_mib']:,.0f} |")  # fmt: skip
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--micro", type=int, default=8, help="rows per data-parallel rank and micro-batch")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--smoke", action="store_true", help="tiny models and batches: checks the plumbing")
    p.add_argument("--only", default="", help="comma-separated run names")
    args = p.parse_args()
    if args.smoke:
        args.micro, args.seq, args.steps = 2, 32, 4
    os.makedirs(args.out, exist_ok=True)
    from infinitrain.data import write_tokens

    data = os.path.join(args.out, "tokens.bin")
    write_tokens(data, np.random.default_rng(0).integers(0, 50257, 2_000_000 if not args.smoke else 20_000), "gpt2")
    n = args.nproc
    total = n * args.micro * args.seq  # the global batch of every run
    results = []
    for name, procs, extra, model in runs(n, args.smoke):
        if args.only and name not in args.only.split(","):
            continue
        r = train(args, name, procs, extra, model, data, total)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "losses"}), flush=True)
    results.append(torch_ddp(args, n))
    print(json.dumps(results[-1]), flush=True)
    text = table(results, n)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f)
    print(text)


if __name__ == "__main__":
    main()
