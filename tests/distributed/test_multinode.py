"""Two "nodes" on one machine: network namespaces joined by a veth pair, each running the launcher with two
workers, so nothing may assume that the ranks share a host (the store, Gloo's addresses and the launchers'
failure handling go over the veth link). Needs root and iproute2; skipped with the reason otherwise."""

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from harness import DEVICE

TYPE = DEVICE.split(":")[0]


def _can_make_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2's ip (network namespaces)"
    name = f"itprobe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return "cannot create a network namespace here"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


REASON = _can_make_namespaces()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture
def two_nodes():
    """(namespace, address) of two nodes joined by a veth pair; removed afterwards."""
    tag = f"{os.getpid() % 10000}"
    subnet = 16 + os.getpid() % 200
    nodes = [(f"itnode{tag}a", f"10.231.{subnet}.1"), (f"itnode{tag}b", f"10.231.{subnet}.2")]
    veth = [f"itv{tag}a", f"itv{tag}b"]

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True)

    try:
        for ns, _ in nodes:
            ip("netns", "add", ns)
        ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for (ns, addr), dev in zip(nodes, veth, strict=True):
            ip("link", "set", dev, "netns", ns)
            ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", dev)
            ip("netns", "exec", ns, "ip", "link", "set", dev, "up")
            ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield nodes
    finally:
        for ns, _ in nodes:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


WORKER = """
import os
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist

dist.init_process_group(timeout=60)
r, n = dist.get_rank(), dist.get_world_size()
kind = os.environ["TEST_DEVICE"]
dev = "cpu" if kind == "cpu" else f"{kind}:{int(os.environ['LOCAL_RANK'])}"
t = it.from_numpy(np.arange(8, dtype=np.float32) * (r + 1), device=dev)
dist.all_reduce(t)
assert np.array_equal(t.numpy(), np.arange(8) * n * (n + 1) / 2), t.numpy()
out = it.empty(n, 2, dtype="int64", device=dev)
dist.all_gather_into_tensor(out, it.from_numpy(np.array([r, int(os.environ["GROUP_RANK"])]), device=dev))
assert out.numpy().tolist() == [[k, k // 2] for k in range(n)], out.numpy()
dist.send(it.from_numpy(np.full(3, r), device=dev), (r + 1) % n)
got = dist.recv(it.zeros(3, dtype="int64", device=dev), (r - 1) % n)
assert got.numpy().tolist() == [(r - 1) % n] * 3
if os.environ.get("TEST_FAIL") == str(r):
    raise SystemExit(7)
dist.barrier()
print(f"rank {r} of {n} on node {os.environ['GROUP_RANK']}: ok", flush=True)
"""


def _launch(nodes, tmp_path, **env):
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    master = nodes[0][1]
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TEST_DEVICE=TYPE, **env)
    full["INFINITRAIN_STORE_TOKEN"] = "the secret both nodes' launchers are given"
    procs = []
    for k, (ns, _) in enumerate(nodes):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "infinitrain.run", "--nnodes=2", f"--node_rank={k}"]
        cmd += ["--nproc_per_node=2", f"--master_addr={master}", "--master_port=29731", "--rdzv_timeout=60"]
        cmd += ["--stop_timeout=2", str(script)]
        procs.append(subprocess.Popen(cmd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [(p, *p.communicate(timeout=180)) for p in procs]


def test_two_nodes_train_collectives_together(two_nodes, tmp_path):
    start = time.time()
    results = _launch(two_nodes, tmp_path)
    # Both launchers end with their workers: node 1's must not wait out --rdzv_timeout (60 s) on node 0's
    # store once node 0 finished and took the store with it.
    assert time.time() - start < 40
    for p, out, err in results:
        assert p.returncode == 0, out + err
    lines = sorted(line for _, out, _ in results for line in out.splitlines() if line.endswith(": ok"))
    assert lines == [f"rank {r} of 4 on node {r // 2}: ok" for r in range(4)]


def test_a_failure_on_one_node_stops_the_other(two_nodes, tmp_path):
    results = _launch(two_nodes, tmp_path, TEST_FAIL="3")
    (p0, out0, err0), (p1, out1, err1) = results
    assert p1.returncode == 7 and "rank 3 (local rank 1" in err1, out1 + err1
    assert p0.returncode != 0 and "rank 3 (node 1) exited with code 7" in err0, out0 + err0
