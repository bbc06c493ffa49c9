"""Tensor, sequence and pipeline parallelism (infinitrain.parallel) under the launcher: each layout trains tiny
GPT-2 and LLaMA 3 (and on some layouts Mixtral, its experts split across the tensor-parallel ranks) for 10 steps
and its loss curve equals the single-device run's (fp32 within 1e-5, bf16 within 1e-2), Mixtral's balancing loss
too, and the experts no token reached in a step get no gradient, as on one device; Mixtral's expert-parallel
shards reload and merge into the single-device state; each pipeline schedule holds the activations it should
(measured); bad layouts are refused before any work. On the cpu suite the ranks talk over Gloo; on a provider's
suite their tensors are on its device.

Two launches (2 and 4 processes) run every layout of their size in turn, for both models; the single-device
reference is a plain model and optimizer in one process, on the same fresh random seeds."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from harness import DEVICE
from infinitrain.models import registry
from infinitrain.models.qwen3 import Qwen3Config

# Sharded by world size (tests/BUILD.bazel): each shard launches the world sizes of its tests.
pytestmark = pytest.mark.shard_by("n")

TYPE = DEVICE.split(":")[0]
STEPS, T, GLOBAL_B, MICRO = 10, 16, 4, 4

WORKER = r"""
import json, os, sys
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain import parallel
from infinitrain.models import GPT2, GPT2Config, LLaMA3, LLaMA3Config, Mixtral, MixtralConfig, registry

KIND, OUT = os.environ["TEST_DEVICE"], os.environ["TEST_OUT"]
STEPS, T, GLOBAL_B, MICRO = (int(v) for v in os.environ["TEST_SIZES"].split(","))
SEED, DATA_SEED = int(os.environ["TEST_SEED"]), int(os.environ["TEST_DATA_SEED"])
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
if WORLD > 1:
    dist.init_process_group()
RANK = dist.get_rank() if WORLD > 1 else 0
DEV = "cpu" if KIND == "cpu" else f"{KIND}:{int(os.environ.get('LOCAL_RANK', '0')) % it.runtime.device_count(KIND)}"
HYPER = {"lr": 3e-3, "eps": 1e-6, "weight_decay": 0.1}  # eps: see test_ddp.py


def build(model, seed=None):
    it.manual_seed(SEED if seed is None else seed)
    if model == "gpt2":
        cfg = GPT2Config(block_size=T, vocab_size=61, padded_vocab_size=64, n_layer=4, n_head=4, n_embd=32)
        return GPT2(cfg, DEV)
    if model == "mixtral":  # 4 experts, top-2, with the router's balancing loss
        cfg = MixtralConfig(T, 61, 4, 4, 2, 32, intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        m = Mixtral(cfg, DEV)
        # The first router starts at zero: its logits tie, top-2 takes experts 0 and 1 for every token, so experts 2
        # and 3 get no gradient in the first step (the optimizer must skip them, on every rank of every layout).
        with it.no_grad():
            m.layers[0].mlp.gate.weight.zero_()
        return m
    return LLaMA3(LLaMA3Config(T, 61, 4, 4, 2, 32, ffn_dim_multiplier=1.0, multiple_of=16), DEV)


def batches():
    gen = np.random.default_rng(DATA_SEED)
    corpus = np.tile(gen.integers(0, 61, 23), 100)  # a repeating pattern: something to learn in 10 steps
    for _ in range(STEPS):
        starts = gen.integers(0, corpus.size - T - 1, (MICRO, GLOBAL_B))
        yield corpus[starts[..., None] + np.arange(T + 1)]


def reference(model, dtype, replicas=1):
    # replicas > 1: each micro-batch's rows in that many parts, each its own micro-batch, as data parallelism
    # sees them (Mixtral's balancing loss is not linear in the rows)
    m = build(model)
    opt = it.optim.AdamW(m.parameters(), **HYPER)
    losses, auxes, unreached = [], [], []
    b = GLOBAL_B // replicas
    for tokens in batches():
        opt.zero_grad()
        total = 0.0
        for k in range(MICRO):
            aux = []
            for d in range(replicas):
                rows = tokens[k, d * b : (d + 1) * b]
                x, y = (it.from_numpy(a, device=DEV) for a in (rows[:, :-1], rows[:, 1:]))
                with it.amp.autocast(DEV, dtype="bfloat16", enabled=dtype == "bfloat16"):
                    _, loss = m(x, y)
                (loss * (1.0 / (MICRO * replicas))).backward()
                total += loss.item() / (MICRO * replicas)
                if model == "mixtral":
                    aux.append(m.aux_loss.item())
        it.optim.clip_grad_norm_(m.parameters(), 1.0)
        unreached.append([n for n, p in m.named_parameters() if p.grad is None])
        opt.step()
        losses.append(total)
        if model == "mixtral":  # the balancing loss of each replica's part of the last micro-batch
            auxes.append(aux)
    if model == "mixtral" and replicas == 1 and dtype == "float32":  # the state the merged shards must equal
        state = {f"model.{n}": p.numpy() for n, p in m.named_parameters()}
        state.update({f"optim.{k}": v.numpy() for k, v in opt.state_dict()["tensors"].items()})
        np.savez(f"{OUT}.{model}.npz", **state)
    return {"losses": losses, "aux": auxes, "names": [n for n, _ in m.named_parameters()], "unreached": unreached}


def parallel_run(model, run):
    layout = parallel.make_layout(WORLD, run.get("tp", 1), run.get("pp", 1), run.get("vpp", 1), run.get("sp", False),
                                  run.get("schedule", "1f1b"))
    full = build(model)
    plan = registry.family_of_model(full).tensor_parallel
    parallel.check_model(layout, plan, full.config, T, MICRO)  # before any communication
    grid = parallel.Grid(layout, DEV)
    pm = parallel.ParallelModel(full, layout, plan, grid, sequence_length=T)
    del full
    engine = parallel.Engine(pm, grid)
    params = list(pm.parameters())
    if run.get("zero"):
        opt = dist.ZeroRedundancyOptimizer(params, it.optim.AdamW, process_group=grid.dp, stage=1, **HYPER)
    else:
        opt = it.optim.AdamW(params, **HYPER)
    B = GLOBAL_B // layout.dp
    rows = slice(grid.dp_rank * B, (grid.dp_rank + 1) * B)
    losses, stats, auxes, unreached = [], None, [], []
    for tokens in batches():
        opt.zero_grad()
        mbs = [tuple(it.from_numpy(a, device=DEV) for a in (tokens[k, rows, :-1], tokens[k, rows, 1:]))
               for k in range(MICRO)]
        with it.amp.autocast(DEV, dtype="bfloat16", enabled=run.get("dtype") == "bfloat16"):
            loss = engine.forward_backward(mbs)
        engine.finish_gradients(1.0)
        unreached.append([n for n, p in pm.shard_parameters() if p.grad is None])
        opt.step()
        losses.append(loss.item())
        stats = stats or dict(engine.stats)
        if model == "mixtral" and grid.last:  # the balancing loss of this replica's last micro-batch
            auxes.append(pm.chunks[-1].aux_loss.item())
    # Replicas of one part (data-parallel peers; tensor-parallel copies of replicated parameters) stay equal.
    if layout.dp > 1:
        for name, p in pm.shard_parameters():
            q = p.detach().clone()
            dist.broadcast(q, grid.dp.ranks[0], grid.dp)
            assert np.array_equal(q.numpy(), p.numpy()), name
    if run.get("save") and model == "mixtral":
        save_and_reload(model, run, layout, grid, pm, opt)
    return {"losses": losses, "stats": stats, "stage": grid.stage, "tp_rank": grid.tp_rank, "split": pm.split,
            "aux": auxes, "dp_rank": grid.dp_rank, "unreached": unreached}


def save_and_reload(model, run, layout, grid, pm, opt):
    # Each rank writes its shard (the main file: rank 0's, with the layout); a fresh model of this layout from
    # other weights loads its shard back.
    from infinitrain.parallel import shards

    main = f"{OUT}.{run['name']}-{model}.ckpt"
    tensors, meta = shards.shard_tensors(pm, opt.state_dict(), grid)
    it.checkpoint.save(shards.shard_path(main, meta["index"]), tensors, {"shard": meta,
                       "layout": shards.layout_meta(layout)})  # fmt: skip
    dist.barrier()
    back, _ = it.checkpoint.load(shards.shard_path(main, meta["index"]))
    other = parallel.ParallelModel(build(model, SEED + 1), layout, pm.plan, grid, sequence_length=T)
    other.load_shard_state_dict({k[len("model."):]: v for k, v in back.items() if k.startswith("model.")})
    for name, p in pm.shard_parameters():
        assert np.array_equal(other.shard_state_dict()[name].numpy(), p.numpy()), name


results = {}
for item in json.loads(os.environ["TEST_RUNS"]):
    key = item["name"] + "/" + item["model"]
    if WORLD == 1:
        results[key] = reference(item["model"], item.get("dtype", "float32"), item.get("replicas", 1))
    else:
        results[key] = parallel_run(item["model"], item)
with open(f"{OUT}.rank{RANK}.json", "w") as f:
    json.dump(results, f)
print(f"rank {RANK} ok", flush=True)
"""

# name -> layout (every run of one launch has the same world size); moe: Mixtral too (its experts split across
# the tensor-parallel ranks), save: its shards are written, reloaded and merged
LAYOUTS = {
    2: {
        "tp2": {"tp": 2, "moe": True},
        "tp2-sp": {"tp": 2, "sp": True, "moe": True, "save": True},
        "pp2-gpipe": {"pp": 2, "schedule": "gpipe"},
        "pp2-1f1b": {"pp": 2, "moe": True},
        "pp2-vpp2": {"pp": 2, "vpp": 2},
    },
    4: {
        "tp4": {"tp": 4},
        "tp4-sp": {"tp": 4, "sp": True, "moe": True},
        "pp4-gpipe": {"pp": 4, "schedule": "gpipe"},
        "pp4-1f1b": {"pp": 4},
        "tp2-sp-pp2": {"tp": 2, "sp": True, "pp": 2},
        "tp2-sp-pp2-vpp2": {"tp": 2, "sp": True, "pp": 2, "vpp": 2, "moe": True, "save": True},
        "dp2-tp2-zero1": {"tp": 2, "zero": True, "moe": True},
        "tp2-sp-pp2-bf16": {"tp": 2, "sp": True, "pp": 2, "dtype": "bfloat16"},
    },
}
MODELS = ("gpt2", "llama3")


def _models(layout):
    return MODELS + ("mixtral",) if layout.get("moe") else MODELS


def _ref_key(n, layout, model):
    """The reference run a layout's curve must equal: Mixtral's data-parallel runs have their own (each replica's
    rows are a micro-batch of the balancing loss)."""
    dtype = layout.get("dtype", "float32")
    dp = n // (layout.get("tp", 1) * layout.get("pp", 1))
    return f"{dtype}-dp{dp}/{model}" if model == "mixtral" and dp > 1 else f"{dtype}/{model}"


CASES = [(n, name, model) for n, runs in LAYOUTS.items() for name in runs for model in _models(runs[name])]


def _launch(tmp, n, runs, seeds):
    script = tmp / "parallel_worker.py"
    script.write_text(WORKER)
    out = tmp / f"world{n}"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        TEST_DEVICE=TYPE,
        TEST_OUT=str(out),
        TEST_SIZES=f"{STEPS},{T},{GLOBAL_B},{MICRO}",
        TEST_RUNS=json.dumps(runs),
        INFINITRAIN_CCL_TIMEOUT_S="120",
        # One thread everywhere, as the launcher gives its workers: the CPU kernels' sums then split alike in the
        # reference and the layouts (Mixtral's routing must not flip on a near-tie between the two).
        OMP_NUM_THREADS="1",
        **{k: str(v) for k, v in seeds.items()},
    )
    env.pop("WORLD_SIZE", None)
    if n == 1:
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", str(script)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]
    return [json.loads((tmp / f"world{n}.rank{r}.json").read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs[n]: the per-rank results of one launch of world size n (1: the single-device references), launched
    when a test first needs it, so a shard runs only the world sizes of its tests."""
    g = np.random.default_rng()
    # Fresh seeds each run; a failure's message names them, and setting them in the environment replays it.
    seeds = {k: int(os.environ.get(k) or g.integers(1 << 20)) for k in ("TEST_SEED", "TEST_DATA_SEED")}
    tmp = tmp_path_factory.mktemp("parallel")
    ref_runs = [{"name": d, "model": m, "dtype": d} for d in ("float32", "bfloat16") for m in MODELS]
    ref_runs += [{"name": "float32", "model": "mixtral"}, {"name": "float32-dp2", "model": "mixtral", "replicas": 2}]

    class Launches(dict):
        def __missing__(self, n):
            if n == "tmp":
                return tmp
            if n == "seeds":
                return " ".join(f"{k}={v}" for k, v in seeds.items())
            if n == 1:
                self[1] = _launch(tmp, 1, ref_runs, seeds)
            else:
                layouts = LAYOUTS[n]
                items = [dict(layout, name=name, model=m) for name, layout in layouts.items() for m in _models(layout)]
                self[n] = _launch(tmp, n, items, seeds)
            return self[n]

    return Launches()


@pytest.mark.parametrize("n,name,model", CASES, ids=[f"{name}-{model}" for _, name, model in CASES])
def test_layout_equals_single_device(runs, n, name, model):
    dtype = LAYOUTS[n][name].get("dtype", "float32")
    ref_run = runs[1][0][_ref_key(n, LAYOUTS[n][name], model)]
    ref = ref_run["losses"]
    for rank, res in enumerate(runs[n]):
        got, where = res[f"{name}/{model}"], f"rank {rank}, {runs['seeds']}"
        atol = 1e-5 if dtype == "float32" else 1e-2
        np.testing.assert_allclose(got["losses"], ref, rtol=0, atol=atol, err_msg=where)
        if model == "mixtral" and got["aux"]:  # the last stage: the balancing loss itself
            want = [a[got["dp_rank"]] for a in ref_run["aux"]]
            np.testing.assert_allclose(got["aux"], want, rtol=0, atol=1e-5, err_msg=where)
    # The parameters no backward reached in a step (Mixtral's experts without a token) are the single-device
    # run's: they keep no gradient, so the optimizer leaves them alone (a zero one would move them).
    for step, want in enumerate(ref_run["unreached"]):
        got = sorted({p for res in runs[n] for p in res[f"{name}/{model}"]["unreached"][step]})
        assert got == sorted(want), (step, runs["seeds"])
    if model == "mixtral":  # the worker's zero router made this happen in the first step
        assert ".mlp.experts.3." in " ".join(ref_run["unreached"][0])
    assert ref[-1] < ref[0] - 0.5  # it learned: the comparison is between curves that move


@pytest.mark.parametrize("n,name", [(n, name) for n, ls in LAYOUTS.items() for name in ls if ls[name].get("save")])
def test_expert_parallel_shards_merge_into_the_single_device_state(runs, n, name):
    """Mixtral's per-rank shards (experts held whole by one rank each; the worker reloaded them into its layout)
    merge into the single-device model's parameters and optimizer state after the same steps."""
    from infinitrain.parallel import shards

    ref = runs[1][0]["float32/mixtral"]
    assert runs[n]  # the launch of this world size wrote the shards
    want = np.load(runs["tmp"] / "world1.mixtral.npz")
    model, optim = shards.merge(str(runs["tmp"] / f"world{n}.{name}-mixtral.ckpt"), ref["names"])
    assert sorted(model) == sorted(ref["names"]) and any(".mlp.experts.3." in k for k in model)
    for k, v in model.items():
        np.testing.assert_allclose(v, want[f"model.{k}"], rtol=0, atol=1e-5, err_msg=f"{k}, {runs['seeds']}")
    assert sorted(optim) == sorted(k[len("optim.") :] for k in want.files if k.startswith("optim."))
    for k, v in optim.items():
        np.testing.assert_allclose(v, want[f"optim.{k}"], rtol=1e-4, atol=1e-7, err_msg=f"{k}, {runs['seeds']}")


@pytest.mark.parametrize("n", [2, 4])
def test_schedules_hold_the_activations_they_should(runs, n):
    """1F1B holds at most pp - stage micro-batches, GPipe all of them: counted, and measured in the step's peak
    memory, whose difference between the schedules is the activations of the micro-batches GPipe holds more."""
    pp = n
    for model in MODELS:
        for res in runs[n]:
            g, f = res[f"pp{pp}-gpipe/{model}"], res[f"pp{pp}-1f1b/{model}"]
            s, gs, fs = g["stage"], g["stats"], f["stats"]
            assert gs["in_flight"] == MICRO, (model, s, gs)
            assert fs["in_flight"] == min(pp - s, MICRO), (model, s, fs)
            act = gs["act_bytes"]  # one micro-batch's activations on this stage, as one forward left them
            assert act > 0 and fs["act_bytes"] == act, (model, s, gs, fs)
            assert gs["peak_bytes"] >= MICRO * act, (model, s, gs)
            more = MICRO - fs["in_flight"]
            diff = gs["peak_bytes"] - fs["peak_bytes"]
            if more == 0:
                assert abs(diff) <= 0.05 * gs["peak_bytes"], (model, s, gs, fs)
            else:
                assert 0.6 * more * act <= diff <= 1.15 * more * act, (model, s, more, act, diff)


# ---- without processes ----


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_schedules_run_and_keep_channel_order(name):
    """Every stage's ops, run with buffered sends, find their messages in order and finish (no deadlock)."""
    from infinitrain.parallel import schedules as S

    for pp in (1, 2, 3, 4, 8):
        for vpp in (1, 2, 3) if pp > 1 else (1,):
            for micro in range(1, 13):
                if name == "1f1b" and vpp > 1 and micro % pp:
                    continue
                S.simulate(name, pp, vpp, micro)
    assert [S.in_flight(S.schedule("1f1b", 4, 1, s, 8)) for s in range(4)] == [4, 3, 2, 1]
    assert [S.in_flight(S.schedule("gpipe", 4, 1, s, 8)) for s in range(4)] == [8] * 4


def test_in_line_rendezvous_sends_deadlock_1f1b_which_is_why_devices_send_on_their_own_streams():
    """A device CCL's send waits for its receive (NCCL's rendezvous). Issued in line on the compute stream, 1F1B's
    steady state has two neighbours each sending to the other before receiving: deadlock from 2 micro-batches on.
    The engine sends on a stream per channel, so a send holds up no receive: the buffered model of `simulate`."""
    from infinitrain.parallel import schedules as S

    for pp in (2, 3, 4):
        S.simulate_in_line("1f1b", pp, 1, 1)  # one micro-batch: forward then backward, no crossing
        S.simulate_in_line("gpipe", pp, 1, 6)  # every forward, then every backward: no crossing either
        for micro in (2, 5, 8):
            with pytest.raises(RuntimeError, match="deadlock with in-line sends"):
                S.simulate_in_line("1f1b", pp, 1, micro)
            S.simulate("1f1b", pp, 1, micro)


def test_a_bad_schedule_is_caught():
    """The simulator fails a schedule whose stages disagree: it can fail."""
    from infinitrain.parallel import schedules as S

    real = S.schedule
    try:
        # Stage 1 runs its backwards newest first: it waits for a gradient that was never sent yet, while the
        # last stage's order expects the oldest first.
        S.schedule = lambda n, pp, vpp, s, m: (
            [op for op in real(n, pp, vpp, s, m) if op[0] == "F"] + [("B", 0, i) for i in reversed(range(m))]
            if s == 0
            else real(n, pp, vpp, s, m)
        )
        with pytest.raises(RuntimeError, match="holds|deadlock"):
            S.simulate("gpipe", 2, 1, 3)
    finally:
        S.schedule = real


def _gpt2(**kw):
    from infinitrain.models import GPT2Config

    return GPT2Config(**{"block_size": 16, "vocab_size": 61, "padded_vocab_size": 64, "n_layer": 4, "n_head": 4,
                         "n_embd": 32, **kw})  # fmt: skip


def _llama(**kw):
    from infinitrain.models import LLaMA3Config

    return LLaMA3Config(**{"block_size": 16, "vocab_size": 61, "n_layer": 4, "n_head": 4, "n_kv_head": 2,
                           "n_embd": 32, "ffn_dim_multiplier": 1.0, "multiple_of": 16, **kw})  # fmt: skip


def _mixtral(**kw):
    from infinitrain.models import MixtralConfig

    return MixtralConfig(**{"block_size": 16, "vocab_size": 61, "n_layer": 4, "n_head": 4, "n_kv_head": 2,
                            "n_embd": 32, "intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
                            **kw})  # fmt: skip


@pytest.mark.parametrize(
    "make,cfg,seq,micro,message",
    [
        (dict(world=3, tp=2), _gpt2(), 16, 4, "world size 3 is not a multiple of tensor_parallel x pipeline"),
        (dict(world=8, tp=2, pp=3), _gpt2(), 16, 4, "world size 8 is not a multiple"),
        (dict(world=8, tp=8), _gpt2(), 16, 4, "n_head=4 is not divisible by tensor_parallel=8"),
        (dict(world=3, tp=3), _llama(n_head=6, n_kv_head=2, n_embd=48), 16, 4, "n_kv_head=2 and tensor_parallel=3"),
        (dict(world=8, pp=8), _gpt2(), 16, 8, "n_layer=4 is fewer than the 8 pipeline stages"),
        (dict(world=4, pp=2, vpp=4), _llama(), 16, 4, "n_layer=4 is fewer than the 8 pipeline stages"),
        (dict(world=2, tp=2, sp=True), _gpt2(), 15, 4, "sequence_length=15 is not divisible"),
        (dict(world=4, pp=2, vpp=2), _gpt2(), 16, 3, "multiple of pipeline_parallel=2"),
        (dict(world=2, sp=True), _gpt2(), 16, 4, "it needs tp > 1"),
        (dict(world=2, vpp=2), _gpt2(), 16, 4, "it needs pipeline_parallel > 1"),
        (dict(world=2, tp=2), _mixtral(num_experts=3), 16, 4, "num_experts=3 is not divisible by tensor_parallel=2"),
        (dict(world=4, tp=4), _mixtral(num_experts=6), 16, 4, "each rank holds whole experts"),
        (dict(world=2, tp=2), _mixtral(tie_word_embeddings=True), 16, 4, "need an untied output head"),
        (dict(world=2, tp=2), Qwen3Config(64, 64, 2, 2, 2, 32, 16, 64), 16, 4, "not implemented for Qwen3"),
    ],
)
def test_bad_layouts_are_refused(make, cfg, seq, micro, message):
    from infinitrain import parallel

    with pytest.raises(parallel.LayoutError, match=message):
        layout = parallel.make_layout(**make)
        parallel.check_model(layout, registry.family_of_config(cfg).tensor_parallel, cfg, seq, micro)


def test_good_layouts_pass_the_checks():
    from infinitrain import parallel

    for make, cfg in (
        (dict(world=8, tp=4, pp=2), _llama()),
        (dict(world=8, tp=2, pp=2, vpp=2, sp=True), _gpt2()),
        (dict(world=8, tp=4, pp=2, sp=True), _mixtral(num_experts=8)),
    ):
        layout = parallel.make_layout(**make)
        parallel.check_model(layout, registry.family_of_config(cfg).tensor_parallel, cfg, 16, 4)
        assert layout.world == 8


def test_balanced_split():
    from infinitrain.parallel import split_layers

    assert split_layers([10] * 4, 2) == [2, 2]
    assert split_layers([10] * 4, 2, first_extra=25) == [1, 3]
    sizes = split_layers([10] * 8, 4, last_extra=15)  # the head weighs 1.5 layers: the last chunk gets one
    assert sum(sizes) == 8 and sizes[-1] == 1 and max(sizes[:-1]) == 3, sizes
    with pytest.raises(ValueError, match="cannot fill"):
        split_layers([10] * 2, 3)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_to_keeps_this_ranks_chunk(dim):
    """scatter_to's forward is local: rank r of n keeps chunk r of n along dim (np.split), and a dim that n does
    not divide is refused. It reads only the group's size and rank, so a stand-in group serves (no collective)."""
    from types import SimpleNamespace

    import infinitrain as it
    from infinitrain.parallel import mappings

    x = np.random.default_rng().standard_normal((4, 6, 8))
    xt = it.tensor(x, device=DEVICE)
    for n in (2, 3, 4):
        for r in range(n):
            group = SimpleNamespace(size=n, rank=r)
            if x.shape[dim] % n:
                with pytest.raises(ValueError, match=f"not divisible by {n} ranks"):
                    mappings.scatter_to(xt, group, dim)
                continue
            np.testing.assert_array_equal(mappings.scatter_to(xt, group, dim).numpy(), np.split(x, n, axis=dim)[r])
