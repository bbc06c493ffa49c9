"""ZeRO-3 (FullyShardedDataParallel with ZeroRedundancyOptimizer stage 3) under the launcher: 2 and 3 processes
train tiny GPT-2 and LLaMA 3 as one process does on the global batch (fp32 losses within 1e-5, with gradient
accumulation and clipping), each rank holding about 1/N of the parameters; a consolidated checkpoint resumes on
another number of ranks and on one plain process; the train CLI's --zero_stage=3 equals one process. On the cpu
suite over Gloo, on a provider's suite on its device."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from harness import DEVICE, rng, run_train, step_lines
from infinitrain import backends
from infinitrain.data import write_tokens

TYPE = DEVICE.split(":")[0]

WORKER = """
import json, os
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config

KIND, MODEL, MODE = os.environ["TEST_DEVICE"], os.environ["TEST_MODEL"], os.environ["TEST_MODE"]
STEPS, B, T, ACCUM = 8, 6, 16, 2
dist.init_process_group()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEV = "cpu" if KIND == "cpu" else f"{KIND}:{int(os.environ['LOCAL_RANK']) % it.runtime.device_count(KIND)}"

# Sharded initialisation (TEST_META): built on device "meta", each rank materialising what it owns, which needs the
# same seed on every rank ("skew": not, to be refused). Otherwise different on every rank: the wrapper takes rank 0's.
META = os.environ.get("TEST_META", "")
it.manual_seed(int(os.environ["TEST_SEED"]) + (RANK if META in ("", "skew") else 0))
BUILD = "meta" if META and not (META == "mixed" and RANK > 0) else DEV
if MODEL == "gpt2":
    model = GPT2(GPT2Config(block_size=T, vocab_size=61, padded_vocab_size=64, n_layer=3, n_head=2, n_embd=32), BUILD)
    blocks = list(model.h)
else:
    model = LLaMA3(LLaMA3Config(T, 61, 3, 4, 2, 32, ffn_dim_multiplier=1.0, multiple_of=16), BUILD)
    blocks = list(model.h)
WHOLE_BYTES = sum(p.numel() * 4 for p in model.parameters())
trainable = list(model.parameters())
if os.environ.get("TEST_LORA"):  # adapters on the blocks: the root (embeddings, head) frozen
    from infinitrain.models import lora
    lora.apply_lora(model, "c_attn", rank=2)
    trainable = lora.trainable_parameters(model)
total = sum(p.numel() for p in model.parameters())
HYPER = {"lr": 3e-3, "eps": 1e-6, "weight_decay": 0.1}
if MODE == "zero3":
    net = dist.FullyShardedDataParallel(model, blocks, device=DEV, prefetch=os.environ.get("TEST_PREFETCH") != "0")
    INIT_PEAK = it.runtime.max_memory_allocated("cpu")  # the host's peak while building and sharding
    PREFETCHED = []  # gathers that found their broadcasts already issued
    _gather = net._gather

    def counting_gather(unit):
        if unit.pending is not None:
            PREFETCHED.append(unit.name)
        _gather(unit)

    net._gather = counting_gather
    opt = dist.ZeroRedundancyOptimizer(trainable, it.optim.AdamW, stage=3, fsdp=net, **HYPER)
    held = sum(p.numel() for p in model.parameters())
    largest = max(net.shapes[id(p)][0] * int(np.prod(net.shapes[id(p)][1:])) for p in net.params)
    assert net.num_parameters() == total and held <= total / WORLD + largest, (held, total, largest)
else:
    net = model
    opt = it.optim.AdamW(trainable, **HYPER)
gen = np.random.default_rng(int(os.environ["TEST_DATA_SEED"]))
corpus = np.tile(gen.integers(0, 61, 23), 100)
FIRST, SAVE_AT = 0, int(os.environ.get("TEST_SAVE_AT", "0"))
gathered = net.gathered if MODE == "zero3" else __import__("contextlib").nullcontext
if os.environ.get("TEST_LOAD"):  # a consolidated checkpoint of another world size
    saved = np.load(os.environ["TEST_LOAD"])
    FIRST = int(saved["step"])
    state = {n: saved["param." + n] for n, _ in model.named_parameters()}
    if MODE == "zero3":  # each rank copies in only what it owns, checked against the whole shapes
        _, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        bad = dict(state, **{n: state[n][:1] for n in list(state)[:1]})
        try:
            model.load_state_dict(bad, strict=False)
            raise AssertionError("a wrong shape was loaded")
        except ValueError as e:
            assert "the module expects" in str(e), e
    else:
        for n, p in model.named_parameters():
            p.copy_(it.from_numpy(state[n], device=DEV))
    tensors = {k[4:]: it.from_numpy(saved[k], device=DEV) for k in saved.files if k.startswith("opt.")}
    opt.load_state_dict({"tensors": tensors, "step": FIRST, "lr": HYPER["lr"]})
losses = []
for step in range(STEPS):
    starts = gen.integers(0, corpus.size - T - 1, (ACCUM, B))
    if step < FIRST:
        continue
    if SAVE_AT and step == SAVE_AT:
        if MODE == "zero3":
            opt.consolidate_state_dict(to=0)
        with gathered():
            if RANK == 0:
                state = opt.state_dict()
                arrays = {"param." + n: p.numpy() for n, p in model.named_parameters()}
                arrays.update({"opt." + k: t.numpy() for k, t in state["tensors"].items()})
                np.savez(os.environ["TEST_OUT"] + ".npz", step=SAVE_AT, **arrays)
        break
    tokens = corpus[starts[..., None] + np.arange(T + 1)]
    rows = slice(RANK * B // WORLD, (RANK + 1) * B // WORLD)
    opt.zero_grad()
    loss_sum = 0.0
    for k in range(ACCUM):
        x = it.from_numpy(tokens[k, rows, :-1], device=DEV)
        y = it.from_numpy(tokens[k, rows, 1:], device=DEV)
        _, loss = net(x, y)
        (loss * (1.0 / ACCUM)).backward()
        loss_sum += loss.item() / ACCUM
    if MODE == "zero3":
        opt.clip_grad_norm_(1.0)
        # Between steps a rank holds only what it owns: the blocks and the root were freed after backward.
        assert all(p.numel() == 0 for p in net.params if not net.owns(p)), "a gathered parameter was kept"
    else:
        it.optim.clip_grad_norm_(trainable, 1.0)
    opt.step()
    t = it.from_numpy(np.array([loss_sum]), device=DEV)
    dist.all_reduce(t, "avg")
    losses.append(float(t.numpy()[0]))
if RANK == 0:
    with open(os.environ["TEST_OUT"], "w") as f:
        json.dump({"losses": losses, "init_peak": globals().get("INIT_PEAK"), "whole_bytes": WHOLE_BYTES,
                   "prefetched": len(globals().get("PREFETCHED", []))}, f)
print(f"rank {RANK} ok", flush=True)
"""


def run(tmp_path, n, model, name, mode="zero3", check=True, **env):
    script = tmp_path / "zero3_worker.py"
    script.write_text(textwrap.dedent(WORKER))
    out = tmp_path / f"{name}.json"
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TEST_DEVICE=TYPE)
    full.update(TEST_MODEL=model, TEST_MODE=mode, TEST_OUT=str(out), **{k: str(v) for k, v in env.items()})
    cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", str(script)]
    p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)
    if not check:
        return p
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out) as f:
        return json.load(f)


def seeds():
    g = np.random.default_rng()
    return {"TEST_SEED": int(g.integers(1 << 20)), "TEST_DATA_SEED": int(g.integers(1 << 20))}


@pytest.mark.parametrize("model,lora", [("gpt2", ""), ("llama3", ""), ("gpt2", "1")])
@pytest.mark.parametrize("n", [2, 3])
def test_zero3_equals_one_process_on_the_global_batch(tmp_path, model, lora, n):
    s = seeds()
    one = run(tmp_path, 1, model, "one", mode="plain", TEST_LORA=lora, **s)
    sharded = run(tmp_path, n, model, "sharded", TEST_LORA=lora, **s)
    np.testing.assert_allclose(sharded["losses"], one["losses"], rtol=0, atol=1e-5, err_msg=str(s))


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_sharded_initialisation_equals_one_process(tmp_path, model):
    """Built on device "meta", each of 2 ranks materialising only what it owns: the curve of one process built
    whole from the same seed (so the shards hold exactly its initial values), and on the cpu no rank's host memory
    ever held the whole model, as the build on the host does."""
    s = seeds()
    one = run(tmp_path, 1, model, "one", mode="plain", **s)
    meta = run(tmp_path, 2, model, "meta", TEST_META="1", **s)
    np.testing.assert_allclose(meta["losses"], one["losses"], rtol=0, atol=1e-5, err_msg=str(s))
    if TYPE == "cpu":
        host = run(tmp_path, 2, model, "host", **s)
        assert host["init_peak"] >= host["whole_bytes"], host
        assert meta["init_peak"] <= 0.75 * meta["whole_bytes"], meta


@pytest.mark.parametrize("kind", ["llmc", "hf"])
def test_train_cli_zero_stage_3_starts_from_a_file_as_one_process(tmp_path, kind):
    """--init_from an llm.c file or a Hugging Face folder with a tied head, each rank reading only the tensors it
    owns: the curve of one process from the same file."""
    import infinitrain as it
    from infinitrain.models import GPT2, GPT2Config, Qwen3, Qwen3Config

    g = rng()
    if kind == "llmc":
        model = GPT2(GPT2Config(block_size=16, vocab_size=61, padded_vocab_size=64, n_layer=2, n_head=2, n_embd=32))
    else:
        model = Qwen3(Qwen3Config(16, 61, 2, 4, 2, 24, head_dim=8, intermediate_size=40, tie_word_embeddings=True))
    for p in model.parameters():  # far from a fresh init
        p.copy_(it.from_numpy(g.standard_normal(p.shape) * 0.3))
    path = tmp_path / "init"
    model.save_llmc(path) if kind == "llmc" else model.save_pretrained(path)
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(g.integers(0, 60, size=29), 60), kind="gpt2")
    base = [f"--input_bin={corpus}", f"--model={'gpt2' if kind == 'llmc' else 'qwen3'}", f"--init_from={path}"]
    base += ["--sequence_length=16", "--sample_every=0", "--val_every=0", "--total_batch_size=64", "--num_iteration=3"]
    one = step_lines(run_train(*base, "--batch_size=4", device="cpu").stdout)
    two = step_lines(run_train(*base, "--batch_size=2", "--zero_stage=3", nproc=2, device="cpu").stdout)
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for s in one:
        assert abs(float(one[s][0]) - float(two[s][0])) <= 1e-5, (s, one, two)


@pytest.mark.parametrize(
    "how,says",
    [("skew", "the ranks built different models on device 'meta'"), ("mixed", "some ranks built the model on")],
)
def test_sharded_initialisation_refuses_ranks_that_built_differently(tmp_path, how, says):
    """Seeds that differ by rank, or rank 0 on meta and rank 1 on its device: every rank stops with the reason
    (no rank waits in a collective the others never reach)."""
    p = run(tmp_path, 2, "gpt2", how, TEST_META=how, check=False, **seeds())
    assert p.returncode != 0 and says in p.stderr, p.stderr[-2000:]


def test_zero3_prefetch_gathers_the_next_block_early_with_the_same_curve(tmp_path):
    """With prefetch each block's gather is issued while the block before it (in backward: after it) runs: every
    block but the first to run in each pass finds its broadcasts under way; the curve is the same bit for bit."""
    s = seeds()
    on = run(tmp_path, 2, "gpt2", "on", **s)
    off = run(tmp_path, 2, "gpt2", "off", TEST_PREFETCH="0", **s)
    assert on["losses"] == off["losses"], (on, off)
    steps, accum, blocks = 8, 2, 3  # the worker's STEPS, ACCUM and GPT-2's layers
    assert off["prefetched"] == 0 and on["prefetched"] == steps * accum * 2 * (blocks - 1), (on, off)


def test_zero3_checkpoint_resumes_on_other_world_sizes(tmp_path):
    s = seeds()
    whole = run(tmp_path, 2, "gpt2", "whole", **s)
    run(tmp_path, 2, "gpt2", "saved", TEST_SAVE_AT=4, **s)
    ckpt = tmp_path / "saved.json.npz"
    three = run(tmp_path, 3, "gpt2", "three", TEST_LOAD=ckpt, **s)
    plain = run(tmp_path, 1, "gpt2", "plain", mode="plain", TEST_LOAD=ckpt, **s)
    for resumed in (three, plain):
        np.testing.assert_allclose(resumed["losses"], whole["losses"][4:], rtol=0, atol=1e-5, err_msg=str(s))


TINY = ["--model=gpt2", "--n_layer=2", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16"]
TINY += ["--sample_every=0", "--val_every=0", "--total_batch_size=128", "--num_iteration=4", "--device=cpu"]


def test_train_cli_zero_stage_3_equals_one_process(tmp_path):
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(rng().integers(0, 60, size=29), 60), kind="gpt2")
    base = [f"--input_bin={corpus}", *TINY]
    one = step_lines(run_train(*base, "--batch_size=4", device="cpu").stdout)
    three = run_train(*base, "--batch_size=2", "--zero_stage=3", f"--save={tmp_path / 'ck'}", nproc=2, device="cpu")
    assert "ZeRO-3" in three.stdout, three.stdout
    sharded = step_lines(three.stdout)
    assert sorted(one) == sorted(sharded) == [1, 2, 3, 4]
    for s in one:
        assert abs(float(one[s][0]) - float(sharded[s][0])) <= 1e-5, (s, one, sharded)
    # Its checkpoint is a plain one (consolidated on rank 0): extended from it, every rank resharding it, the run
    # goes on as under DDP from the same file.
    more = ["--batch_size=2", f"--load={tmp_path / 'ck'}", "--num_iteration=6"]
    resumed = run_train(*base, *more, "--zero_stage=3", nproc=2, device="cpu")
    assert "resumed from" in resumed.stdout and sorted(step_lines(resumed.stdout)) == [5, 6], resumed.stdout
    ddp = step_lines(run_train(*base, *more, nproc=2, device="cpu").stdout)
    for s in (5, 6):
        assert abs(float(ddp[s][0]) - float(step_lines(resumed.stdout)[s][0])) <= 1e-5, (s, ddp, resumed.stdout)


def test_train_cli_zero_stage_3_with_lora_autocast_and_evaluation(tmp_path):
    """LoRA adapters (the frozen base weights sharded too), bf16 autocast and evaluation on every rank: the curve
    and the validation loss as under DDP within bf16's tolerance; the adapters saved gathered."""
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(rng().integers(0, 60, size=29), 60), kind="gpt2")
    base = [f"--input_bin={corpus}", f"--input_val_bin={corpus}", *TINY, "--batch_size=2", "--lora_rank=2"]
    base = [f for f in base if not f.startswith("--val_every")] + ["--val_every=2", "--val_batches=2"]
    base += ["--dtype=bfloat16", "--lora_target_modules=c_attn,c_fc"]
    ddp = run_train(*base, nproc=2, device="cpu").stdout
    out = run_train(*base, "--zero_stage=3", f"--lora_save_path={tmp_path / 'ad'}", nproc=2, device="cpu").stdout
    a, b = step_lines(ddp), step_lines(out)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert abs(float(a[s][0]) - float(b[s][0])) <= 1e-2, (s, a, b)
    val = [[float(v) for v in re.findall(r"val loss ([0-9.]+)", o)] for o in (ddp, out)]
    assert len(val[0]) == len(val[1]) == 2 and np.allclose(val[0], val[1], atol=1e-2), val
    assert sorted(os.listdir(tmp_path / "ad")) == ["adapter_config.json", "adapter_model.safetensors"]


def test_train_cli_refuses_zero_stage_3_where_it_cannot_work(tmp_path):
    corpus = tmp_path / "train.bin"
    write_tokens(corpus, np.tile(rng().integers(0, 60, size=29), 60), kind="gpt2")
    flags = [f"--input_bin={corpus}", "--model=mixtral", "--vocab_size=64", "--sequence_length=16", "--batch_size=2"]
    p = run_train(*flags, "--zero_stage=3", "--num_iteration=1", nproc=2, device="cpu", check=False)
    assert p.returncode == 2 and "--zero_stage=3 is not implemented for mixture-of-experts models" in p.stderr, p.stderr
    p = run_train(*TINY, f"--input_bin={corpus}", "--zero_stage=3", "--tensor_parallel=2", nproc=2, check=False)
    assert p.returncode == 2 and "--zero_stage=3 shards whole models" in p.stderr, p.stderr
    p = run_train(*TINY, f"--input_bin={corpus}", "--zero_stage=3", "--precision_check=steps=1", nproc=2, check=False)
    assert p.returncode == 2 and "--precision_check with --zero_stage=3 is not implemented" in p.stderr, p.stderr


SIM_WORKER = """
import json, os
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain import backends
from infinitrain.models import GPT2, GPT2Config

backends.register("sim")
dist.init_process_group()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEV = f"sim:{RANK}"
it.manual_seed(7)
cfg = GPT2Config(block_size=16, vocab_size=500, padded_vocab_size=512, n_layer=8, n_head=8, n_embd=512)
model = GPT2(cfg, "meta" if WORLD > 1 else "cpu")  # sharded initialisation: each rank makes only its shard
gen = np.random.default_rng(3)
losses = []
try:
    if WORLD > 1:
        net = dist.FullyShardedDataParallel(model, list(model.h), device=DEV)
        opt = dist.ZeroRedundancyOptimizer(model.parameters(), it.optim.AdamW, stage=3, fsdp=net, lr=1e-3)
    else:
        model.to(DEV)  # the whole model on one device: its memory cannot hold it with AdamW's moments
        net, opt = model, it.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        tokens = gen.integers(0, 500, (4, 17))
        rows = slice(RANK * 4 // WORLD, (RANK + 1) * 4 // WORLD)
        x, y = (it.from_numpy(a, device=DEV) for a in (tokens[rows, :-1], tokens[rows, 1:]))
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = it.from_numpy(np.array([loss.item()]), device=DEV)
        dist.all_reduce(t, "avg")
        losses.append(float(t.numpy()[0]))
except MemoryError as e:
    losses = f"out of memory: {e}"
if RANK == 0:
    with open(os.environ["TEST_OUT"], "w") as f:
        peaks = {"peak": it.runtime.max_memory_allocated(DEV), "host_peak": it.runtime.max_memory_allocated("cpu")}
        json.dump({"losses": losses, **peaks}, f)
"""


@pytest.mark.skipif(
    TYPE != "cpu" or "sim" not in backends.available(), reason="needs the sim provider beside the cpu (memory limit)"
)
def test_a_model_too_large_for_one_device_trains_sharded_across_four():
    """GPT-2 of 25.5M parameters: 408 MB with its gradient and AdamW's moments, on sim devices of 192 MiB each: one
    device runs out of memory; four under ZeRO-3 (initialised sharded: each rank materialises its shard on its
    device) train it, each at about 140 MB at most, the host never holding the model (102 MB)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "w.py")
        with open(script, "w") as f:
            f.write(SIM_WORKER)
        results = {}
        for n in (1, 4):
            out = os.path.join(d, f"{n}.json")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TEST_OUT=out)
            env.update(INFINITRAIN_SIM_MEMORY="192M", INFINITRAIN_SIM_DEVICES="4")
            cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", script]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stdout + p.stderr
            with open(out) as f:
                results[n] = json.load(f)
    assert isinstance(results[1]["losses"], str) and "out of memory" in results[1]["losses"], results[1]
    assert len(results[4]["losses"]) == 3 and all(np.isfinite(results[4]["losses"])), results[4]
    assert results[4]["peak"] <= 192 << 20, results[4]
    assert results[4]["host_peak"] < 25_490_432 * 4 / 2, results[4]  # under half the model's 102 MB
