"""Several processes under the launcher (python -m infinitrain.run): every collective of a process group against
NumPy across ranks and dtypes, sub-groups, async calls, the rendezvous timeout, a worker killed mid-run and
signals passed on. On the cpu suite the tensors are cpu tensors over Gloo; on a provider's suite they are on its
device (sim's staged through host memory and Gloo).

Inputs are small nonzero integers, so every reduction is exact in every dtype and results compare with equality.
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from harness import DEVICE

TYPE = DEVICE.split(":")[0]


def _env(**extra):
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
        TEST_DEVICE=TYPE,
        TEST_SEED=str(np.random.default_rng().integers(1 << 30)),
        **extra,
    )


def launch(tmp_path, n, code, *flags, timeout=180, **env):
    """Runs `code` in n workers under the launcher; returns the CompletedProcess."""
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", *flags, str(script)]
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=timeout)


PRELUDE = """
import os, signal, sys, time
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
KIND = os.environ["TEST_DEVICE"]
DEV = "cpu" if KIND == "cpu" else f"{KIND}:{int(os.environ['LOCAL_RANK']) % it.runtime.device_count(KIND)}"
SEED = int(os.environ["TEST_SEED"])


def sample(r, tag, shape, op="sum"):
    '''Rank r's input: nonzero integers, |x| <= 3 for prod, else <= 8 (exact in bfloat16 and float16 sums).'''
    g = np.random.default_rng([SEED, r, tag])
    lim = 3 if op == "prod" else 8
    x = g.integers(1, lim + 1, shape) * g.choice([-1, 1], shape)
    return x.astype(np.float64)


def on(x, dtype):
    t = it.from_numpy(np.asarray(x, dtype=np.float32 if dtype in ("bfloat16", "float16") else dtype), device=DEV)
    return t.to(dtype) if dtype in ("bfloat16", "float16") else t


def host(t):
    return t.to("float64").numpy() if t.dtype in ("bfloat16", "float16") else t.numpy().astype(np.float64)
"""

COLLECTIVES = """
dist.init_process_group()
assert (dist.get_rank(), dist.get_world_size()) == (RANK, WORLD)
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}
checks = 0
for i, dtype in enumerate(("float32", "float64", "int64", "int32", "bfloat16", "float16")):
    for j, op in enumerate(("sum", "avg", "max", "min", "prod")):
        tag = 100 * i + j
        xs = np.stack([sample(r, tag, (5, 3), op) for r in range(WORLD)])
        want = np.sum(xs, 0) / WORLD if op == "avg" else REDUCE[op](xs, 0)
        if op == "avg" and dtype.startswith("int"):
            want = np.fix(np.sum(xs, 0) / WORLD)  # integers truncate toward zero
        t = on(xs[RANK], dtype)
        dist.all_reduce(t, op)
        assert np.array_equal(host(t), want), (dtype, op, host(t), want)
        for root in range(WORLD):
            t = on(xs[RANK], dtype)
            dist.reduce(t, root, op)
            assert np.array_equal(host(t), want if RANK == root else xs[RANK]), ("reduce", dtype, op, root)
        checks += 1 + WORLD
    xs = np.stack([sample(r, 7, (4, 2)) for r in range(WORLD)])
    for root in range(WORLD):
        t = on(xs[RANK], dtype)
        dist.broadcast(t, root)
        assert np.array_equal(host(t), xs[root]), ("broadcast", dtype, root)
    out = on(np.zeros((WORLD, 4, 2)), dtype)
    dist.all_gather_into_tensor(out, on(xs[RANK], dtype))
    assert np.array_equal(host(out), xs), ("all_gather_into_tensor", dtype)
    outs = [on(np.zeros((4, 2)), dtype) for _ in range(WORLD)]
    dist.all_gather(outs, on(xs[RANK], dtype))
    assert all(np.array_equal(host(o), xs[r]) for r, o in enumerate(outs)), ("all_gather", dtype)
    big = np.stack([sample(r, 9, (WORLD * 3,)) for r in range(WORLD)])
    out = on(np.zeros(3), dtype)
    dist.reduce_scatter_tensor(out, on(big[RANK], dtype), "sum")
    assert np.array_equal(host(out), big.sum(0)[RANK * 3 : RANK * 3 + 3]), ("reduce_scatter", dtype)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    dist.send(on(xs[RANK], dtype), nxt)  # every rank sends before it receives: sends must not wait
    got = dist.recv(on(np.zeros((4, 2)), dtype), prv)
    assert np.array_equal(host(got), xs[prv]), ("send/recv", dtype)
    checks += WORLD + 4
# Sub-groups: even and odd ranks, each reducing on its own; non-members take no part.
evens, odds = dist.new_group(range(0, WORLD, 2)), dist.new_group(range(1, WORLD, 2))
mine = evens if RANK % 2 == 0 else odds
assert (evens is dist.NON_GROUP_MEMBER) == (RANK % 2 == 1) and dist.get_world_size(mine) == len(mine.ranks)
xs = np.stack([sample(r, 11, (6,)) for r in range(WORLD)])
t = on(xs[RANK], "float32")
dist.all_reduce(t, group=mine)
assert np.array_equal(host(t), xs[RANK % 2 :: 2].sum(0)), "sub-group all_reduce"
top = mine.ranks[-1]
t = on(xs[RANK], "float32")
dist.broadcast(t, top, group=mine)  # src is a global rank
assert np.array_equal(host(t), xs[top]), "sub-group broadcast"
assert dist.all_reduce(on(xs[RANK], "float32"), group=odds if RANK % 2 == 0 else evens) is None
# Async calls finish by wait(), in issue order.
ts = [on(xs[RANK] * (k + 1), "float32") for k in range(3)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
for k, (w, t) in enumerate(zip(works, ts)):
    w.wait()
    assert np.array_equal(host(t), xs.sum(0) * (k + 1)), "async all_reduce"
dist.barrier()
checks += 4
# Bad input: a clear ValueError.
for call, msg in [
    (lambda: dist.all_reduce(on(xs[RANK], "float32"), "mean"), "unknown reduce op"),
    (lambda: dist.broadcast(on(xs[RANK], "float32"), WORLD), "not in ProcessGroup"),
    (lambda: dist.all_reduce(np.zeros(3)), "expected an infinitrain Tensor"),
    (lambda: dist.all_gather_into_tensor(on(np.zeros(3), "float32"), on(xs[RANK], "float32")), "elements"),
    (lambda: dist.send(on(xs[RANK], "float32"), RANK), "the peer must be another rank"),
]:
    try:
        call()
    except ValueError as e:
        assert msg in str(e), (msg, e)
    else:
        raise AssertionError(f"no error: {msg}")
# A second group after destroy_process_group() meets under new keys (the store outlives the first).
dist.destroy_process_group()
dist.init_process_group()
time.sleep(0.3 * RANK)  # the ranks arrive apart: the barrier must still wait for the last
t0 = time.time()
dist.barrier()
t = on(xs[RANK], "float32")
dist.all_reduce(t)
assert np.array_equal(host(t), xs.sum(0)), "all_reduce after re-init"
assert RANK == WORLD - 1 or time.time() - t0 > 0.2 * (WORLD - 1 - RANK), "the barrier did not wait"
print(f"rank {RANK}: {checks} collectives ok", flush=True)
"""


@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_across_processes(tmp_path, n):
    p = launch(tmp_path, n, COLLECTIVES)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sum("collectives ok" in line for line in p.stdout.splitlines()) == n, p.stdout


def test_a_rank_that_sends_last_and_exits_still_delivers(tmp_path):
    """Sends complete when the receiver takes them: a sender that exits first must wait for that at exit."""
    code = """
    dist.init_process_group()
    xs = [on(np.arange(1 << 18) * (k + 1.0), "float32") for k in range(6)]
    ddp_like = [dist.default_group()]  # a live reference to the group, as a model's DDP wrapper holds
    if RANK == 0:
        for x in xs:
            dist.send(x, 1)
        print("rank 0 sent", flush=True)
    else:
        time.sleep(1.0)
        for k in range(6):
            got = dist.recv(on(np.zeros(1 << 18), "float32"), 0)
            assert np.array_equal(host(got), np.arange(1 << 18) * (k + 1.0)), k
        print("rank 1 received", flush=True)
    """
    p = launch(tmp_path, 2, code)
    assert p.returncode == 0 and "rank 1 received" in p.stdout, p.stdout + p.stderr


def test_a_killed_worker_stops_the_others(tmp_path):
    code = """
    dist.init_process_group()
    t = on(np.ones(1 << 16), "float32")
    dist.all_reduce(t)
    print(f"rank {RANK} running", flush=True)
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # the others block in a collective that rank 1 never joins
        dist.all_reduce(t)
    """
    start = time.time()
    p = launch(tmp_path, 3, code, "--stop_timeout=2")
    assert p.returncode == 128 + signal.SIGKILL, p.stdout + p.stderr
    assert "rank 1 (local rank 1" in p.stderr and "exited with code 137" in p.stderr and "rank 1 running" in p.stderr
    assert time.time() - start < 60


def test_rendezvous_timeout_names_the_missing_ranks(tmp_path):
    """Two workers of a world of three (no launcher: rank 0 serves the store): both give up naming rank 2."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + "dist.init_process_group(timeout=3)\n")
    env = _env(WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK="0")
    env.pop("INFINITRAIN_STORE_TOKEN", None)  # started as PyTorch users start ranks: loopback needs no secret
    procs = [
        subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(r)), stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]
    errs = [p.communicate(timeout=60)[1] for p in procs]
    for r, (p, err) in enumerate(zip(procs, errs, strict=True)):
        assert p.returncode != 0
        assert f"init_process_group: rank {r} waited 3 s" in err and "rank(s) 2 of 3 did not join" in err, err


def test_signals_reach_the_workers(tmp_path):
    code = """
    def stop(sig, frame):
        print(f"rank {RANK} got signal {sig}", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    print(f"rank {RANK} ready", flush=True)
    time.sleep(120)
    """
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    cmd = [sys.executable, "-m", "infinitrain.run", "--nproc_per_node=2", "--master_port=0", str(script)]
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = 0
    deadline = time.time() + 60
    lines = []
    while ready < 2 and time.time() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        ready += "ready" in line
    assert ready == 2, lines
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, out + err
    assert sorted(line for line in out.splitlines() if "got signal" in line) == [
        f"rank {r} got signal {int(signal.SIGTERM)}" for r in (0, 1)
    ], out


def test_launcher_flag_errors():
    for flags, msg in [
        (["--nproc_per_node=0"], "must be >= 1"),
        (["--nnodes=2", "--node_rank=2"], "--node_rank must be in [0, 2)"),
        (["--rdzv_endpoint=nohost"], "must be host:port"),
        (["--nnodes=2", "--master_port=0"], "only with one node"),
    ]:
        p = subprocess.run(
            [sys.executable, "-m", "infinitrain.run", *flags, "x.py"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and msg in p.stderr, (flags, p.stderr)
