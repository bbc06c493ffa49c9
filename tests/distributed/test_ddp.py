"""DistributedDataParallel under the launcher: 2 and 4 processes train tiny GPT-2 and LLaMA 3 exactly as one
process does on the global batch (fp32 losses within 1e-5 for 10 steps), gradient accumulation with no_sync
equals the plain global batch, the replicas stay equal, and a parameter without a gradient is an error unless
find_unused_parameters. On the cpu suite over Gloo, on a provider's suite on its device."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from harness import DEVICE, run_train, train_losses

TYPE = DEVICE.split(":")[0]

WORKER = """
import json, os, sys
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config

KIND, MODEL = os.environ["TEST_DEVICE"], os.environ["TEST_MODEL"]
STEPS, B, T, ACCUM = 10, int(os.environ["TEST_GLOBAL_B"]), 16, int(os.environ.get("TEST_ACCUM", "1"))
dist.init_process_group()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEV = "cpu" if KIND == "cpu" else f"{KIND}:{int(os.environ['LOCAL_RANK']) % it.runtime.device_count(KIND)}"

it.manual_seed(int(os.environ["TEST_SEED"]) + RANK)  # different on every rank: DDP broadcasts rank 0's
if MODEL == "gpt2":
    model = GPT2(GPT2Config(block_size=T, vocab_size=61, padded_vocab_size=64, n_layer=2, n_head=2, n_embd=32), DEV)
else:
    model = LLaMA3(LLaMA3Config(T, 61, 2, 4, 2, 32, ffn_dim_multiplier=1.0, multiple_of=16), DEV)
ddp = dist.DistributedDataParallel(model, bucket_cap_mb=float(os.environ.get("TEST_BUCKET_MB", "0.01")))
ZERO = int(os.environ.get("TEST_ZERO", "0"))
# eps 1e-6: with 1e-8, AdamW turns gradients that are rounding noise in exact arithmetic (the attention keys'
# bias) into lr-sized steps of either sign, and the curves of two exact-in-theory runs part by 1e-4 in 1 of 10.
HYPER = {"lr": 3e-3, "eps": 1e-6, "weight_decay": 0.1}
if ZERO:
    opt = dist.ZeroRedundancyOptimizer(
        model.parameters(), it.optim.AdamW, stage=ZERO, ddp=ddp if ZERO == 2 else None, **HYPER
    )
else:
    opt = it.optim.AdamW(model.parameters(), **HYPER)
gen = np.random.default_rng(int(os.environ["TEST_DATA_SEED"]))
corpus = np.tile(gen.integers(0, 61, 23), 100)  # a repeating pattern: something to learn in 10 steps
FIRST, SAVE_AT = 0, int(os.environ.get("TEST_SAVE_AT", "0"))
if os.environ.get("TEST_LOAD"):  # a checkpoint of another world size: parameters and the consolidated state
    saved = np.load(os.environ["TEST_LOAD"])
    FIRST = int(saved["step"])
    for n, p in model.named_parameters():
        p.copy_(it.from_numpy(saved["param." + n], device=DEV))
    tensors = {k[4:]: it.from_numpy(saved[k], device=DEV) for k in saved.files if k.startswith("opt.")}
    opt.load_state_dict({"tensors": tensors, "step": FIRST, "lr": HYPER["lr"]})
losses = []
for step in range(STEPS):
    starts = gen.integers(0, corpus.size - T - 1, (ACCUM, B))
    if step < FIRST:
        continue  # the data stream of the run being resumed
    if SAVE_AT and step == SAVE_AT:
        if ZERO:
            opt.consolidate_state_dict(to=0)
        if RANK == 0:
            state = opt.state_dict()
            arrays = {"param." + n: p.numpy() for n, p in model.named_parameters()}
            arrays.update({"opt." + k: t.numpy() for k, t in state["tensors"].items()})
            np.savez(os.environ["TEST_OUT"] + ".npz", step=SAVE_AT, **arrays)
        break
    tokens = corpus[starts[..., None] + np.arange(T + 1)]
    rows = slice(RANK * B // WORLD, (RANK + 1) * B // WORLD)  # this rank's share of the global batch
    opt.zero_grad()
    total = 0.0
    for k in range(ACCUM):
        x = it.from_numpy(tokens[k, rows, :-1], device=DEV)
        y = it.from_numpy(tokens[k, rows, 1:], device=DEV)
        with ddp.no_sync() if k < ACCUM - 1 else __import__("contextlib").nullcontext():
            _, loss = ddp(x, y)
            (loss * (1.0 / ACCUM)).backward()
        total += loss.item() / ACCUM
    if ZERO:
        opt.clip_grad_norm_(1.0)
    else:
        it.optim.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    t = it.from_numpy(np.array([total]), device=DEV)
    dist.all_reduce(t, "avg")
    losses.append(float(t.numpy()[0]))
if RANK == 0:
    with open(os.environ["TEST_OUT"], "w") as f:
        json.dump({"losses": losses}, f)
# Every replica holds the same parameters.
for n, p in model.named_parameters():
    q = p.detach().clone()
    dist.broadcast(q, 0)
    assert np.array_equal(q.numpy(), p.numpy()), n
print(f"rank {RANK} ok", flush=True)
"""


def run(tmp_path, n, model, name, **env):
    script = tmp_path / "ddp_worker.py"
    script.write_text(textwrap.dedent(WORKER))
    out = tmp_path / f"{name}.json"
    full = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        TEST_DEVICE=TYPE,
        TEST_MODEL=model,
        TEST_OUT=str(out),
        **{k: str(v) for k, v in env.items()},
    )
    cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", str(script)]
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out) as f:
        return json.load(f)


def launch(tmp_path, name, code, n=2, timeout=120, **env):
    """Runs `code` in n workers under the launcher on the device under test; returns the CompletedProcess."""
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TEST_DEVICE=TYPE, **env)
    cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", str(script)]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout)


def seeds():
    g = np.random.default_rng()
    return {"TEST_SEED": int(g.integers(1 << 20)), "TEST_DATA_SEED": int(g.integers(1 << 20))}


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n", [2, 4])
def test_ddp_equals_one_process_on_the_global_batch(tmp_path, model, n):
    s = seeds()
    one = run(tmp_path, 1, model, "one", TEST_GLOBAL_B=4, **s)
    many = run(tmp_path, n, model, "many", TEST_GLOBAL_B=4, **s)
    np.testing.assert_allclose(many["losses"], one["losses"], rtol=0, atol=1e-5)
    assert one["losses"][-1] < one["losses"][0]
    # (Parameters are not compared: gradients that are rounding noise in exact arithmetic, such as the attention
    # keys' bias, become lr-sized AdamW steps of either sign. The workers check that the replicas agree.)


def test_no_sync_accumulation_equals_the_global_batch(tmp_path):
    """2 ranks x 2 micro-batches, the first under no_sync, against 1 process with the same 2 micro-batches."""
    s = seeds()
    one = run(tmp_path, 1, "gpt2", "one", TEST_GLOBAL_B=4, TEST_ACCUM=2, **s)
    many = run(tmp_path, 2, "gpt2", "many", TEST_GLOBAL_B=4, TEST_ACCUM=2, TEST_BUCKET_MB=25, **s)
    np.testing.assert_allclose(many["losses"], one["losses"], rtol=0, atol=1e-5)


UNUSED = """
import os
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist

dist.init_process_group()
KIND = os.environ["TEST_DEVICE"]
DEV = "cpu" if KIND == "cpu" else f"{KIND}:0"


class Heads(it.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = it.nn.Linear(4, 3, device=DEV)
        self.b = it.nn.Linear(4, 3, device=DEV)
        self.c = it.nn.Linear(4, 3, device=DEV)

    def forward(self, x, head):
        return getattr(self, head)(x)


model = Heads()
find = os.environ["TEST_FIND_UNUSED"] == "1"
ddp = dist.DistributedDataParallel(model, find_unused_parameters=find)
rank = dist.get_rank()
xs = [np.random.default_rng(r).standard_normal((5, 4)) for r in range(2)]
x = it.from_numpy(xs[rank].astype(np.float32), device=DEV)
try:
    ddp(x, "b" if rank == 0 else "a").sum().backward()  # b reached on rank 0, a on rank 1, c nowhere
except RuntimeError as e:
    print("error:", e, flush=True)
    raise SystemExit(0)
# d sum(x W^T + b) / dW = ones(3) x sum of x's rows; averaged over 2 ranks, one of which reached the head.
for head, r in (("b", 0), ("a", 1)):
    m = getattr(model, head)
    np.testing.assert_allclose(m.weight.grad.numpy(), np.outer(np.ones(3), xs[r].sum(0)) / 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.bias.grad.numpy(), np.full(3, 5 / 2), rtol=1e-6)
print("reached averaged; c.grad", model.c.weight.grad, model.c.bias.grad, flush=True)
"""


@pytest.mark.parametrize("find", [False, True])
def test_unused_parameters(tmp_path, find):
    """Without find_unused_parameters a parameter no gradient reached is named; with it, a parameter reached on
    some rank is averaged with zeros for the others, and one reached on none keeps no gradient (PyTorch's)."""
    p = launch(tmp_path, "unused", UNUSED, TEST_FIND_UNUSED="1" if find else "0")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(("error:", "reached"))]
    assert len(lines) == 2, p.stdout
    for ln in lines:
        if find:
            assert ln == "reached averaged; c.grad None None", ln
        else:
            assert "no gradient reached" in ln and "find_unused_parameters=True" in ln, ln


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_equals_one_process_and_reshards_its_checkpoint(tmp_path, stage):
    """ZeRO-1/2 on 2 ranks equals plain AdamW on one process; its consolidated state saved at step 5 resumes
    on 3 ranks (other owners) and on 1 process (a plain AdamW) to the uninterrupted curve."""
    s = seeds()
    one = run(tmp_path, 1, "gpt2", "one", TEST_GLOBAL_B=6, **s)
    two = run(tmp_path, 2, "gpt2", "two", TEST_GLOBAL_B=6, TEST_ZERO=stage, **s)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=0, atol=1e-5)
    run(tmp_path, 2, "gpt2", "saved", TEST_GLOBAL_B=6, TEST_ZERO=stage, TEST_SAVE_AT=5, **s)
    ckpt = tmp_path / "saved.json.npz"
    assert any(k.startswith("opt.m.") for k in np.load(ckpt).files)
    three = run(tmp_path, 3, "gpt2", "three", TEST_GLOBAL_B=6, TEST_ZERO=stage, TEST_LOAD=ckpt, **s)
    plain = run(tmp_path, 1, "gpt2", "plain", TEST_GLOBAL_B=6, TEST_LOAD=ckpt, **s)
    np.testing.assert_allclose(three["losses"], one["losses"][5:], rtol=0, atol=1e-5)
    np.testing.assert_allclose(plain["losses"], one["losses"][5:], rtol=0, atol=1e-5)


def _cli(tmp_path, name, n, *flags):
    """The train CLI (n > 1: under the launcher); returns the train losses of its metrics file."""
    metrics = tmp_path / f"{name}.jsonl"
    p = run_train(*flags, f"--metrics_file={metrics}", nproc=n, device=TYPE, cwd=tmp_path)
    return train_losses(metrics), p.stdout


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_train_cli_under_the_launcher_equals_one_process(tmp_path, zero):
    """2 processes of batch 2 (with accumulation 2) against 1 process of batch 4; then a checkpoint of the
    2-process run resumes to the same curve."""
    from infinitrain.data.tokens import write_tokens

    g = np.random.default_rng()
    write_tokens(tmp_path / "train.bin", np.tile(g.integers(0, 60, 37), 300))
    flags = [f"--input_bin={tmp_path / 'train.bin'}", "--model=gpt2", "--n_layer=2", "--n_embd=32", "--n_head=2"]
    flags += ["--vocab_size=64", "--sequence_length=16", "--learning_rate=1e-2", "--total_batch_size=128"]
    flags += [f"--seed={int(g.integers(1000))}"]
    one, _ = _cli(tmp_path, "one", 1, *flags, "--batch_size=4", "--num_iteration=6")
    ckpt = tmp_path / "ckpt"
    two, out = _cli(tmp_path, "two", 2, *flags, "--batch_size=2", f"--zero_stage={zero}", "--num_iteration=3",
                    f"--save={ckpt}")  # fmt: skip
    assert "rank 0 of 2 processes" in out and out.count("train loss") == 3  # rank 0 alone prints
    more, _ = _cli(tmp_path, "more", 2, *flags, "--batch_size=2", f"--zero_stage={zero}", "--num_iteration=6",
                   f"--load={ckpt}")  # fmt: skip
    np.testing.assert_allclose(two + more, one, rtol=0, atol=1e-5)
    assert one[-1] < one[0]


CONSOLIDATE = """
import os, time
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist

dist.init_process_group()
KIND = os.environ["TEST_DEVICE"]
DEV = "cpu" if KIND == "cpu" else f"{KIND}:0"
it.manual_seed(5)
model = it.nn.Sequential(*[it.nn.Linear(64, 64, device=DEV) for _ in range(6)])
ddp = dist.DistributedDataParallel(model)  # its gradient hooks tie the group into reference cycles
opt = dist.ZeroRedundancyOptimizer(model.parameters(), it.optim.AdamW, lr=1e-3, stage=2, ddp=ddp)
ddp(it.ones(4, 64, device=DEV)).sum().backward()
opt.step()
if dist.get_rank() == 0:
    time.sleep(1.0)  # the others send and exit before rank 0 takes their state
opt.consolidate_state_dict(to=0)
if dist.get_rank() == 0:
    tensors = opt.state_dict()["tensors"]
    assert len(tensors) == 2 * 12 and all(np.abs(t.numpy()).max() > 0 for k, t in tensors.items() if k[0] == "m")
    print("consolidated", len(tensors), flush=True)
"""


def test_consolidation_outlives_the_senders_exit(tmp_path):
    """The ranks that send their optimizer state may exit at once: their sends finish at exit."""
    p = launch(tmp_path, "consolidate", CONSOLIDATE, n=3)
    assert p.returncode == 0 and "consolidated 24" in p.stdout, p.stdout + p.stderr


EDGES = """
import os
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain.nn import recompute

dist.init_process_group()
R, W = dist.get_rank(), dist.get_world_size()
KIND = os.environ["TEST_DEVICE"]
DEV = "cpu" if KIND == "cpu" else f"{KIND}:0"


def net():
    it.manual_seed(1)
    return it.nn.Sequential(*[it.nn.Linear(8, 8, device=DEV) for _ in range(3)])


def data(r):
    g = np.random.default_rng(100 + r)
    return it.from_numpy(g.standard_normal((4, 8)).astype(np.float32), device=DEV)


# Single-process reference: the mean of every rank's gradient.
ref = net()
for r in range(W):
    (ref(data(r)).square().mean() * (1.0 / W)).backward()
want = {n: p.grad.numpy() for n, p in ref.named_parameters()}

# 1. Activation recompute (a backward inside backward) under DDP: reduced once, at the outer backward's end.
model = net()
ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4)
recompute.enable(model, list(model))
ddp(data(R)).square().mean().backward()
for n, p in model.named_parameters():
    np.testing.assert_allclose(p.grad.numpy(), want[n], rtol=1e-5, atol=1e-7, err_msg="recompute " + n)

# 2. A backward that failed half-way does not leave DDP waiting for a reduction that never comes.
model = net()
ddp = dist.DistributedDataParallel(model, bucket_cap_mb=1e-4)
def boom(g):
    raise RuntimeError("boom")
out = ddp(data(R))
h = out.square().mean()
list(model)[0].weight.register_hook(boom)
try:
    h.backward()
except RuntimeError as e:
    assert "boom" in str(e)
list(model)[0].weight._hooks = None
model.zero_grad()
ddp(data(R)).square().mean().backward()
for n, p in model.named_parameters():
    np.testing.assert_allclose(p.grad.numpy(), want[n], rtol=1e-5, atol=1e-7, err_msg="after failure " + n)

# 3. ZeRO-2: a second synchronized backward before step() would mix reduced and local sums: refused.
model = net()
ddp = dist.DistributedDataParallel(model)
opt = dist.ZeroRedundancyOptimizer(model.parameters(), it.optim.AdamW, lr=1e-3, stage=2, ddp=ddp)
ddp(data(R)).square().mean().backward()
try:
    ddp(data(R)).square().mean().backward()
except RuntimeError as e:
    assert "call the optimizer's step() first" in str(e), e
else:
    raise AssertionError("no error")
opt.step()
opt.zero_grad()
ddp(data(R)).square().mean().backward()  # fine after step()
print(f"rank {R}: edges ok", flush=True)
"""


def test_ddp_edges_recompute_failed_backward_zero2_double_backward(tmp_path):
    p = launch(tmp_path, "edges", EDGES)
    assert p.returncode == 0 and p.stdout.count("edges ok") == 2, p.stdout + p.stderr
