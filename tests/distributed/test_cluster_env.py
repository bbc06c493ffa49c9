"""Runs started by a cluster's launcher instead of infinitrain.run: Slurm's and Open MPI's variables read into
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (distributed/cluster.py), checked on
random layouts; and the train CLI in two processes given only srun's or mpirun's variables, whose curve equals
the same run under infinitrain.run. Workers run on the cpu over Gloo whatever the suite's device."""

import random
import socket
import subprocess
import sys

import numpy as np
import pytest

from harness import child_env, rng, step_lines
from infinitrain.data import write_tokens
from infinitrain.distributed import cluster

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def slurm_env(g, nodes, per_node, node, local, job):
    counts = ",".join(f"{c}(x{n})" if n > 1 else str(c) for c, n in per_node)
    width = int(g.integers(1, 4))
    first = int(g.integers(0, 50))
    return {
        "SLURM_PROCID": str(node * per_node[0][0] + local),  # nodes before this one hold per_node[0][0] each
        "SLURM_NTASKS": str(sum(c * n for c, n in per_node)),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_STEP_NODELIST": f"gpu[{first:0{width}d}-{first + nodes - 1:0{width}d}]",
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": "0",
    }, f"gpu{first:0{width}d}"


def test_slurm_variables_on_random_layouts():
    g = rng()
    for _ in range(50):
        nodes, per = int(g.integers(2, 9)), int(g.integers(1, 9))
        node, local, job = int(g.integers(0, nodes)), int(g.integers(0, per)), int(g.integers(1, 10**7))
        env, host = slurm_env(g, nodes, [(per, nodes)], node, local, job)
        place = cluster.apply(env)
        assert place.source == "slurm"
        assert {k: env[k] for k in LAUNCHER_VARS} == {
            "RANK": str(node * per + local), "WORLD_SIZE": str(nodes * per), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(per), "MASTER_ADDR": host, "MASTER_PORT": str(20000 + job % 10000),
        }  # fmt: skip
    # Uneven nodes: the local world is this node's count.
    env, _ = slurm_env(g, 3, [(4, 2), (3, 1)], 2, 1, 7)
    env["SLURM_PROCID"] = "9"
    assert cluster.apply(env).local_world_size == 3 and env["RANK"] == "9" and env["WORLD_SIZE"] == "11"
    # One node: the store stays on loopback; what the user set wins.
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NNODES": "1", "MASTER_PORT": "1234"}
    env["SLURM_STEP_ID"] = "3"
    cluster.apply(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["LOCAL_WORLD_SIZE"]) == ("127.0.0.1", "1234", "2")
    # infinitrain.run's (or torchrun's) variables come first.
    env = {"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}
    assert cluster.apply(env) is None and env["RANK"] == "0"
    assert cluster.apply({}) is None
    # A batch script's own process (no job step) is no rank: plain python there trains alone.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "5"}
    assert cluster.apply(env) is None and "RANK" not in env
    # mpirun inside a Slurm allocation: its processes inherit the allocation's Slurm variables; Open MPI's decide.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0", "OMPI_COMM_WORLD_RANK": "3"}
    env.update(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="3", OMPI_COMM_WORLD_LOCAL_SIZE="4")
    assert cluster.apply(env).source == "open-mpi" and (env["RANK"], env["WORLD_SIZE"]) == ("3", "4")
    # srun's step task count wins over the allocation's.
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "1"}
    env["SLURM_NNODES"] = "1"
    assert cluster.apply(env).world_size == 2


def test_host_lists_and_task_counts():
    assert cluster.first_host("node[07-09,12],gpu1") == "node07"
    assert cluster.first_host("rack[2-3]-n[001-004]") == "rack2-n001"
    assert cluster.first_host("a1,b[1-2]") == "a1"
    assert cluster.tasks_per_node("4(x2),3") == [4, 4, 3]
    assert cluster.tasks_per_node("8") == [8]
    for bad in ("x", "4(x)", "4,,2"):
        with pytest.raises(ValueError, match="tasks per node"):
            cluster.tasks_per_node(bad)
    with pytest.raises(ValueError, match="node list"):
        cluster.first_host("[1-2]")


def test_open_mpi_variables():
    g = rng()
    for _ in range(20):
        world = int(g.integers(1, 17))
        rank = int(g.integers(0, world))
        env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world)}
        env.update(OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(world))
        assert cluster.apply(env).source == "open-mpi"
        assert {k: env[k] for k in LAUNCHER_VARS} == {
            "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        }  # fmt: skip
    several = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    several["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4"
    with pytest.raises(ValueError, match="set MASTER_ADDR to the first one's address"):
        cluster.apply(dict(several))
    cluster.apply(env := dict(several, MASTER_ADDR="10.1.2.3"))
    assert env["MASTER_ADDR"] == "10.1.2.3" and env["LOCAL_WORLD_SIZE"] == "4"


STEP = {"SLURM_STEP_ID": "0"}


@pytest.mark.parametrize(
    "env,message",
    [
        ({"SLURM_PROCID": "x", "SLURM_NTASKS": "2", **STEP}, "SLURM_PROCID='x': expected an integer >= 0"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0", **STEP}, "SLURM_NTASKS='0': expected an integer >= 1"),
        (
            {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "0", "SLURM_NTASKS": "2", **STEP},
            "SLURM_STEP_NUM_TASKS='0': expected an integer >= 1",
        ),
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2", "SLURM_NNODES": "1", **STEP}, "rank 2 of 2"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2", **STEP}, "no node list"),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x2)", **STEP},
            "name 2",
        ),
        ({"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='-1'"),
    ],
)
def test_unreadable_variables_are_named(env, message):
    with pytest.raises(ValueError, match="") as e:
        cluster.detect(env)
    assert message in str(e.value), str(e.value)


# ---- the train CLI started as srun and mpirun start it ----------------------------------------------------------

TINY = ["--n_layer=1", "--n_embd=32", "--n_head=2", "--vocab_size=64", "--sequence_length=16", "--batch_size=2"]
TINY += ["--sample_every=0", "--val_every=0", "--device=cpu", "--num_iteration=4"]


def free_slurm_port():
    """A free port that Slurm's rule (20000 + job id mod 10000) names, and that job id."""
    for _ in range(200):
        port = random.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port, 10000 * random.randrange(1, 100) + port - 20000
    pytest.skip("no free port in 20000-29999")


def spawn(n, flags, variables):
    """n train CLI processes with variables(rank) as their only launcher environment; their outputs."""
    procs = []
    for r in range(n):
        env = child_env(**variables(r), INFINITRAIN_CCL_TIMEOUT_S="60")
        for name in (*LAUNCHER_VARS, "INFINITRAIN_STORE_TOKEN", "INFINITRAIN_STORE_SERVED"):
            env.pop(name, None)
        cmd = [sys.executable, "-m", "infinitrain.train", *flags]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-2000:] + err[-3000:]
    return outs


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, np.tile(rng().integers(0, 60, size=29), 60), kind="gpt2")
    return str(path)


def test_srun_and_mpirun_start_the_train_cli_as_infinitrain_run_does(corpus):
    flags = [f"--input_bin={corpus}", *TINY]
    cmd = [sys.executable, "-m", "infinitrain.run", "--nproc_per_node=2", "--master_port=0", "-m", "infinitrain.train"]
    p = subprocess.run([*cmd, *flags], capture_output=True, text=True, env=child_env(), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    expected = step_lines(p.stdout)
    assert sorted(expected) == [1, 2, 3, 4]
    port, job = free_slurm_port()
    slurm = spawn(2, flags, lambda r: {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                       "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2", "SLURM_NNODES": "1",
                                       "SLURM_JOB_NODELIST": "node01", "SLURM_JOB_ID": str(job),
                                       "SLURM_STEP_ID": "0"})  # fmt: skip
    assert step_lines(slurm[0][0]) == expected and "2 processes" in slurm[0][0], slurm[0][0][-2000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mpi = spawn(2, flags, lambda r: {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                                     "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                                     "MASTER_PORT": str(port)})  # fmt: skip
    assert step_lines(mpi[0][0]) == expected, mpi[0][0][-2000:]
