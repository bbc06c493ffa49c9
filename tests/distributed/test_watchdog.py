"""The launcher's watchdog (python -m infinitrain.run --heartbeat_timeout): workers beat through the store from a
thread of their own; a rank that stops (SIGSTOP, a call that holds the GIL, a node gone) is named and the run
stopped, while ranks blocked in a collective or asleep, and ranks that finished, are left alone.

Workers run on the cpu over Gloo whatever the suite's device: the watchdog is the launcher's and the store's.
"""

import importlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from infinitrain import _C

_group = importlib.import_module("infinitrain.distributed.group")  # the package's `group` is a function

HUNG = 124  # infinitrain.run.HUNG_EXIT

PRELUDE = """
import ctypes, os, signal, sys, time
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist

RANK = int(os.environ["RANK"])
dist.init_process_group()
t = it.from_numpy(np.ones(1024, dtype=np.float32))
dist.all_reduce(t)  # the communicator is made: later collectives only wait on the peers
print(f"rank {RANK} pid {os.getpid()} ready", flush=True)
"""


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("INFINITRAIN_HEARTBEAT_S", None)  # the launcher's to set
    return dict(env, **extra)


def _pids(out):
    return {int(r): int(p) for r, p in re.findall(r"^rank (\d+) pid (\d+) ready$", out, re.M)}


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cleanup(pids):
    """Ends workers a failed test left behind (a stopped one needs SIGCONT to die of SIGTERM; SIGKILL does)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def launch(tmp_path, n, code, *flags, timeout=60):
    """Runs PRELUDE + code in n workers under the launcher; returns (returncode, stdout, stderr, seconds)."""
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + textwrap.dedent(code))
    cmd = [sys.executable, "-m", "infinitrain.run", f"--nproc_per_node={n}", "--master_port=0", "--stop_timeout=2"]
    p = subprocess.Popen(
        [*cmd, *flags, str(script)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    start = time.time()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        _cleanup(_pids(out).values())
        raise AssertionError(f"the launcher did not finish within {timeout} s:\n{out}\n{err}") from None
    return p.returncode, out, err, time.time() - start


def test_a_stopped_rank_is_named_not_the_ranks_waiting_for_it(tmp_path):
    """Ranks 0 and 2 enter an all_reduce first and wait there for rank 1, which stops itself a second later: were
    a collective to hold the GIL, theirs would be the heartbeats that stopped first, and they would be named."""
    code = """
    if RANK == 1:
        time.sleep(1.5)
        print("rank 1 stops", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    while True:
        dist.all_reduce(t)
    """
    rc, out, err, seconds = launch(tmp_path, 3, code, "--heartbeat_timeout=3")
    pids = _pids(out)
    try:
        assert rc == HUNG, out + err
        assert sorted(pids) == [0, 1, 2], out
        named = re.findall(r"rank (\d+) \(node 0, pid (\d+)\) sent no heartbeat for ([\d.]+) s", err)
        assert [(int(r), int(p)) for r, p, _ in named] == [(1, pids[1])], err
        # Named within the timeout and a check period or two of its last beat.
        assert 3 <= float(named[0][2]) < 5, err
        assert "stopped, hung or unreachable; stopping the other workers" in err, err
        assert "rank 1's last lines:\n  rank 1 pid" in err and "rank 1 stops" in err, err
        assert seconds < 30, seconds
        # Every worker is gone, the stopped one included.
        assert [pid for pid in pids.values() if _alive(pid)] == [], (pids, err)
    finally:
        _cleanup(pids.values())


@pytest.mark.parametrize("watchdog", [True, False])
def test_a_rank_holding_the_gil_is_named_unless_the_watchdog_is_off(tmp_path, watchdog):
    """A C call that keeps the GIL (ctypes.PyDLL does not release it) silences the heartbeat thread too."""
    code = f"""
    print("heartbeat interval", os.environ.get("INFINITRAIN_HEARTBEAT_S"), flush=True)
    if RANK == 0:
        ctypes.PyDLL(None).sleep({8 if watchdog else 4})
    dist.barrier()
    print(f"rank {{RANK}} done", flush=True)
    """
    rc, out, err, _ = launch(tmp_path, 2, code, f"--heartbeat_timeout={3 if watchdog else 0}")
    pids = _pids(out)
    try:
        if watchdog:
            assert rc == HUNG, out + err
            assert f"rank 0 (node 0, pid {pids[0]}) sent no heartbeat for" in err, err
            assert "rank 1 (node" not in err and "done" not in out, out + err
            assert "heartbeat interval 0.6" in out, out
        else:
            assert rc == 0 and "heartbeat" not in err, out + err
            assert out.count("heartbeat interval None") == 2 and out.count("done") == 2, out
        assert [pid for pid in pids.values() if _alive(pid)] == [], (pids, err)
    finally:
        _cleanup(pids.values())


def test_sleeping_waiting_and_finished_ranks_are_not_named(tmp_path):
    """Rank 0 sleeps past the timeout (time.sleep lets go of the GIL) while rank 1 waits for it in a recv; rank 2
    has finished long before: the run ends as it would without the watchdog, and nothing is printed at exit."""
    code = """
    if RANK == 2:
        sys.exit(0)
    if RANK == 0:
        time.sleep(5)
        dist.send(t, 1)
    else:
        dist.recv(t, 0)
    print(f"rank {RANK} done", flush=True)
    """
    rc, out, err, seconds = launch(tmp_path, 3, code, "--heartbeat_timeout=3")
    assert rc == 0 and err == "", out + err
    assert sorted(line for line in out.splitlines() if line.endswith("done")) == ["rank 0 done", "rank 1 done"], out
    assert "Traceback" not in out and "terminate" not in out, out


def test_a_node_that_vanished_is_named_by_node_0(tmp_path):
    """Two launchers on loopback, one worker each; node 1's launcher and worker are frozen together (a host gone):
    node 0's launcher, which watches every rank, names rank 1 with its node and pid and stops its own worker."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + "while True:\n    dist.all_reduce(t)\n")
    env = _env(INFINITRAIN_STORE_TOKEN="the secret of both nodes")
    procs, lines, frozen = [], queue.Queue(), []
    try:
        for node in (0, 1):
            cmd = [sys.executable, "-m", "infinitrain.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1"]
            cmd += [f"--master_port={port}", "--rdzv_timeout=30", "--stop_timeout=2", "--heartbeat_timeout=3"]
            pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(subprocess.Popen([*cmd, str(script)], env=env, **pipes))
        threading.Thread(target=lambda: [lines.put(x) for x in procs[1].stdout], daemon=True).start()
        deadline = time.time() + 30
        worker = None
        while worker is None and time.time() < deadline:
            try:
                m = re.match(r"rank 1 pid (\d+) ready", lines.get(timeout=1))
            except queue.Empty:
                continue
            worker = int(m.group(1)) if m else None
        assert worker is not None, "node 1's worker did not start"
        frozen += [procs[1].pid, worker]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        out, err = procs[0].communicate(timeout=30)
        assert procs[0].returncode == HUNG, out + err
        assert f"rank 1 (node 1, pid {worker}) sent no heartbeat for" in err, err
        assert "rank 0 (node" not in err, err
        rank0 = _pids(out)[0]
        assert not _alive(rank0), err
    finally:
        _cleanup(frozen)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


def test_the_heartbeat_thread(tmp_path):
    """Beats, marks itself done when stopped, and keeps quiet and stops promptly once its store is gone."""
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0, token="t")
    store = _C.TcpStore("127.0.0.1", server.port, False, 10.0, token="t")
    hb = _group._Heartbeat("127.0.0.1", server.port, "t", 5, 0.05)
    deadline = time.time() + 10
    while store.add("heartbeat/5", 0) < 3 and time.time() < deadline:
        time.sleep(0.05)
    assert store.add("heartbeat/5", 0) >= 3 and store.get("heartbeat/5/pid") == str(os.getpid()).encode()
    hb.stop()
    assert not hb._thread.is_alive() and store.check(["heartbeat/5/done"])

    hb = _group._Heartbeat("127.0.0.1", server.port, "t", 6, 0.05)
    while store.add("heartbeat/6", 0) < 2 and time.time() < deadline:
        time.sleep(0.05)
    del store, server  # the store's process finished
    time.sleep(0.5)
    start = time.time()
    hb.stop()
    assert not hb._thread.is_alive() and time.time() - start < 2 * _group._HEARTBEAT_CALL_S + 0.5


def test_a_worker_exits_cleanly_whatever_its_heartbeat_is_doing(tmp_path):
    """The heartbeat is stopped before the interpreter finalizes: a daemon thread that comes back from a store call
    then aborts the process (std::terminate), which beating without pause made happen in 4 exits of 10."""
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0, token="t")
    store = _C.TcpStore("127.0.0.1", server.port, False, 10.0, token="t")
    script = tmp_path / "worker.py"
    script.write_text("import infinitrain.distributed as dist, time\ndist.init_process_group()\ntime.sleep(0.1)\n")
    env = _env(
        RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(server.port),
        INFINITRAIN_STORE_SERVED="1",
        INFINITRAIN_STORE_TOKEN="t",
        INFINITRAIN_HEARTBEAT_S="1e-9",
    )
    for _ in range(8):
        store.delete_key("heartbeat/0/done")
        p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr == "", (p.returncode, p.stderr)
        assert store.check(["heartbeat/0/done"]) and store.add("heartbeat/0", 0) > 10


def test_heartbeat_flag_errors():
    for flag in ("--heartbeat_timeout=-1", "--heartbeat_timeout=0.5"):
        p = subprocess.run(
            [sys.executable, "-m", "infinitrain.run", flag, "x.py"], env=_env(), capture_output=True, text=True
        )
        assert p.returncode == 2 and "--heartbeat_timeout must be 0 (off) or at least 1 second" in p.stderr, p.stderr
