"""The launcher: `python -m infinitrain.run [flags] script.py [args]`, torchrun-shaped.

Starts --nproc_per_node workers on this node, each with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR and MASTER_PORT set, for infinitrain.distributed.init_process_group(). The launcher of
node 0 serves the rendezvous store on MASTER_ADDR:MASTER_PORT; every launcher is a client of it too, so that a
failure on one node stops the others. When a worker fails, the launcher stops the rest (SIGTERM, then SIGKILL
after --stop_timeout seconds), prints the failing rank's last lines and exits with its exit code. SIGINT and
SIGTERM are passed on to the workers (a second SIGINT kills them). Unless OMP_NUM_THREADS is set, each worker
gets OMP_NUM_THREADS=1 when there are several per node (as torchrun does): set it to give them more.

The watchdog: once init_process_group() has connected, each worker adds to a counter in the store every
--heartbeat_timeout/5 seconds (at most 5) from a thread of its own. A rank whose counter stops moving for
--heartbeat_timeout seconds (a stopped process, one wedged holding the GIL, a host gone) is named, the workers are
stopped as for a failure, and the launcher exits with HUNG_EXIT (124, as timeout(1)): well before the collective
timeout would end the run without saying whom the others waited for. A rank is watched from its first heartbeat to
its exit (ranks that never call init_process_group are not); node 0's launcher watches every rank, so that a node
that vanished with its launcher is named too, the others their own.

The store listens on --master_addr only (loopback by default; --store_bind_addr=0.0.0.0 for every interface) and
serves only processes that present the run's secret: a single-node launcher makes one and hands it to its workers
as INFINITRAIN_STORE_TOKEN; with several nodes the user sets INFINITRAIN_STORE_TOKEN, the same on every node.
"""

import argparse
import collections
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

TAIL = 20
TOKEN_ENV = "INFINITRAIN_STORE_TOKEN"
HEARTBEAT_ENV = "INFINITRAIN_HEARTBEAT_S"  # the interval the workers beat at (infinitrain.distributed reads it)
HUNG_EXIT = 124
USAGE_EXIT = 2  # a worker refused its arguments: the same command would fail the same way, so it is not restarted
RESTART_ENV = "INFINITRAIN_RESTART_COUNT"


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m infinitrain.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=int, default=1, help="workers on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0, help="this node's rank in [0, nnodes)")
    p.add_argument("--master_addr", "--master-addr", default="127.0.0.1", help="address of node 0")
    p.add_argument(
        "--master_port", "--master-port", type=int, default=29500, help="port of the store on node 0 (0: a free one)"
    )
    p.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default=None, help="host:port, instead of the two above")
    p.add_argument(
        "--store_bind_addr",
        "--store-bind-addr",
        default=None,
        help="the address node 0's store listens on (default: --master_addr; 0.0.0.0: every interface)",
    )
    p.add_argument("--rdzv_timeout", type=float, default=300.0, help="seconds to wait for every rank to join")
    p.add_argument("--stop_timeout", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument(
        "--heartbeat_timeout",
        "--heartbeat-timeout",
        type=float,
        default=60.0,
        help="seconds without a heartbeat after which a rank is named hung and the run stopped (0: no watchdog)",
    )
    p.add_argument(
        "--max_restarts",
        "--max-restarts",
        type=int,
        default=0,
        help="after a worker fails or hangs, stop all and start them again, up to this many times (one node)",
    )
    p.add_argument("-m", "--module", action="store_true", help="run the script argument as a module (python -m)")
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    if a.nproc_per_node < 1 or a.nnodes < 1:
        p.error(f"--nproc_per_node and --nnodes must be >= 1, got {a.nproc_per_node} and {a.nnodes}")
    if not 0 <= a.node_rank < a.nnodes:
        p.error(f"--node_rank must be in [0, {a.nnodes}), got {a.node_rank}")
    if a.rdzv_endpoint:
        host, _, port = a.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            p.error(f"--rdzv_endpoint must be host:port, got {a.rdzv_endpoint!r}")
        a.master_addr, a.master_port = host, int(port)
    if not 0 <= a.master_port < 65536 or (a.master_port == 0 and a.nnodes > 1):
        p.error(f"--master_port must be in [1, 65535] (0, a free port, only with one node), got {a.master_port}")
    if not a.rdzv_timeout > 0:
        p.error("--rdzv_timeout must be positive")
    if a.max_restarts < 0:
        p.error(f"--max_restarts must be >= 0, got {a.max_restarts}")
    if a.max_restarts and a.nnodes > 1:
        p.error("--max_restarts with several nodes is not implemented yet (the nodes would have to agree on a round)")
    if not (a.heartbeat_timeout == 0 or a.heartbeat_timeout >= 1):  # below a second, a busy host looks hung
        p.error(f"--heartbeat_timeout must be 0 (off) or at least 1 second, got {a.heartbeat_timeout:g}")
    return a


class Worker:
    def __init__(self, rank, local_rank, cmd, env):
        self.rank, self.local_rank = rank, local_rank
        self.tail = collections.deque(maxlen=TAIL)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()
        self.exited_at = None  # when it exited: the first failure is reported, not the others it brought down
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self):
        self.proc.wait()
        self.exited_at = time.monotonic()

    def _pump(self):
        """Passes the worker's output through line by line, keeping the last lines for a failure report."""
        out = sys.stdout.buffer
        for line in iter(self.proc.stdout.readline, b""):
            self.tail.append(line.decode(errors="replace").rstrip("\n"))
            out.write(line)
            out.flush()

    def signal(self, sig):
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def _warn_if_loopback(name):
    """A host name that resolves to loopback here (Debian's /etc/hosts maps the host's own name to 127.0.1.1)
    would leave the store out of the other nodes' reach."""
    try:
        ipaddress.ip_address(name)
        return  # an address given as such is meant
    except ValueError:
        pass
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        return  # the store reports it
    if name != "localhost" and ipaddress.ip_address(addr).is_loopback:
        sys.stderr.write(
            f"infinitrain.run: warning: --master_addr={name} is {addr} here, a loopback address other nodes cannot "
            "reach; give node 0's own address, or --store_bind_addr=0.0.0.0 to listen on every interface\n"
        )


def _exit_code(rc):
    return 128 - rc if rc < 0 else rc  # killed by signal s: 128 + s, as a shell reports it


def _heartbeat_interval(timeout):
    """How often workers beat: five times a timeout (a late beat or two is no alarm), within [0.5 s, 5 s]."""
    return min(5.0, max(0.5, timeout / 5))


class Watchdog:
    """Reads the heartbeat counters of `ranks` (store.add(key, 0) reads without waiting) and names the rank whose
    counter stopped first, once it has not moved for `timeout` seconds. A rank is watched from its first beat until
    it finished: finished() (a local worker exited) or heartbeat/<rank>/done (set by the worker at exit and by its
    launcher when it exits)."""

    def __init__(self, store, ranks, timeout):
        self.store, self.ranks, self.timeout = store, list(ranks), timeout
        self.period = min(1.0, _heartbeat_interval(timeout) / 2)
        self.seen = {}  # rank -> (count, when the launcher saw it move)
        self.done = set()
        self.checked = None

    def finished(self, rank):
        self.done.add(rank)
        self.seen.pop(rank, None)

    def stale(self, now):
        """(rank, seconds since it last beat) or None; raises the store's errors."""
        if self.checked is not None and now - self.checked < self.period:
            return None
        if self.checked is not None and now - self.checked > max(2.0, 3 * self.period):
            # This launcher was held up itself (a suspended host, say): the beats it missed are no evidence.
            self.seen = {r: (n, now) for r, (n, _) in self.seen.items()}
        self.checked = now
        for r in self.ranks:
            if r not in self.done:
                n = self.store.add(f"heartbeat/{r}", 0)
                if n and self.seen.get(r, (0,))[0] != n:
                    self.seen[r] = (n, now)
        for t, r in sorted((t, r) for r, (_, t) in self.seen.items() if now - t >= self.timeout):
            if not self.store.check([f"heartbeat/{r}/done"]):
                return r, now - t
            self.finished(r)
        return None


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    from infinitrain import _C  # after parsing: --help needs no native core

    world = a.nnodes * a.nproc_per_node
    token = os.environ.get(TOKEN_ENV)
    if not token:
        if a.nnodes > 1:
            # Other nodes' launchers cannot learn a secret made here: the user hands the same one to all.
            sys.stderr.write(
                f"infinitrain.run: --nnodes={a.nnodes} needs {TOKEN_ENV} set to the same secret on every node "
                f"(e.g. export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_hex(16))'))\n"
            )
            return 2
        token = secrets.token_hex(16)
    serve = a.node_rank == 0
    bind = a.store_bind_addr or a.master_addr
    if serve and a.nnodes > 1 and not a.store_bind_addr:
        _warn_if_loopback(a.master_addr)
    workers = []  # this round's
    received = []

    def forward(sig, _frame):
        received.append(sig)
        for w in workers:
            w.signal(signal.SIGKILL if sig == signal.SIGINT and received.count(signal.SIGINT) > 1 else sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        port = a.master_port
        for restart in range(a.max_restarts + 1):
            # A new store each round: no key of the last round's rendezvous, collectives or heartbeats survives.
            try:
                store = _C.TcpStore(bind if serve else a.master_addr, port, serve, a.rdzv_timeout, token=token)
            except (OSError, RuntimeError, TimeoutError, ValueError) as e:  # a refused token is an OSError
                sys.stderr.write(f"infinitrain.run: cannot reach or serve the store at {a.master_addr}:{port}: {e}\n")
                return 1
            port = store.port  # the one chosen, for --master_port=0; later rounds take it again
            if received:  # a signal came while the round was being set up: start no workers
                del store
                return 128 + int(received[0])
            workers[:] = _start(a, world, token, port, restart)
            code = _watch(a, workers, store, received)
            del store  # its server stops: the port is free for the next round
            if code == 0 or received or code == USAGE_EXIT or restart == a.max_restarts:
                return code
            sys.stderr.write(
                f"infinitrain.run: restarting every worker (restart {restart + 1} of {a.max_restarts}); a training "
                "run with --save continues from its newest intact checkpoint\n"
            )
        return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _start(a, world, token, port, restart):
    """This node's workers for one round (restart: how many rounds came before)."""
    base = dict(os.environ)
    base.update(
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(a.nproc_per_node),
        GROUP_RANK=str(a.node_rank),
        MASTER_ADDR=a.master_addr,
        MASTER_PORT=str(port),
        INFINITRAIN_STORE_SERVED="1",
        INFINITRAIN_STORE_TOKEN=token,
        INFINITRAIN_DIST_TIMEOUT_S=str(a.rdzv_timeout),
        PYTHONUNBUFFERED="1",
    )
    # The round, under our name and torchrun's (scripts written for it read TORCHELASTIC_RESTART_COUNT).
    base.update({RESTART_ENV: str(restart), "TORCHELASTIC_RESTART_COUNT": str(restart)})
    base["TORCHELASTIC_MAX_RESTARTS"] = str(a.max_restarts)
    base.pop(HEARTBEAT_ENV, None)
    if a.heartbeat_timeout:
        base[HEARTBEAT_ENV] = f"{_heartbeat_interval(a.heartbeat_timeout):g}"
    if a.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        base["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, *(["-m"] if a.module else []), a.script, *a.args]
    workers = []
    for local in range(a.nproc_per_node):
        rank = a.node_rank * a.nproc_per_node + local
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(local))
        workers.append(Worker(rank, local, cmd, env))
    return workers


def _stop(workers, timeout):
    for w in workers:
        w.signal(signal.SIGTERM)
        w.signal(signal.SIGCONT)  # a stopped process takes the SIGTERM now, not the SIGKILL later
    deadline = time.time() + timeout
    for w in workers:
        try:
            w.proc.wait(max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            w.signal(signal.SIGKILL)
            w.proc.wait()
    for w in workers:
        w.reader.join(timeout=5)


FAILED_KEY = "launcher/failed"
FAILED_RANK_KEY = "launcher/failed_rank"  # a hung rank, whose own launcher prints its last lines


def _watch(a, workers, store, received):
    failed_key = FAILED_KEY
    store_up = a.nnodes > 1  # polled for failures elsewhere until node 0's store goes (it may finish first)
    watchdog = None
    if a.heartbeat_timeout:
        # Node 0's launcher, beside the store, watches every rank: a node that vanished cannot report its own.
        ranks = range(a.nnodes * a.nproc_per_node) if a.node_rank == 0 else [w.rank for w in workers]
        watchdog = Watchdog(store, ranks, a.heartbeat_timeout)
    exited = set()
    while True:
        codes = [w.proc.returncode if w.exited_at is not None else None for w in workers]
        bad = [w for w, c in zip(workers, codes, strict=True) if c not in (None, 0)]
        if bad and not received:
            time.sleep(0.2)  # let the exit times of workers that went down with it be recorded too
            bad = [w for w in workers if w.exited_at is not None and w.proc.returncode != 0]
            # A worker killed by a signal is the cause, not the peers that lost it a moment later (whose exit times
            # can be recorded first on a busy host); otherwise the first to go.
            w = min(bad, key=lambda w: (w.proc.returncode >= 0, w.exited_at))
            code = _exit_code(w.proc.returncode)
            try:
                store.set(failed_key, f"rank {w.rank} (node {a.node_rank}) exited with code {code}".encode())
            except (RuntimeError, TimeoutError):
                pass  # the store's node is gone too
            _stop(workers, a.stop_timeout)
            sys.stderr.write(
                f"infinitrain.run: rank {w.rank} (local rank {w.local_rank}, pid {w.proc.pid}) exited with code "
                f"{code}; stopped the other workers. Its last lines:\n{_report(w)}\n"
            )
            return code
        if all(c is not None for c in codes):
            for w in workers:
                w.reader.join(timeout=5)
            if received:
                return 128 + int(received[0])
            return 0
        for w in workers:
            if w.exited_at is not None and w.rank not in exited:
                exited.add(w.rank)
                if watchdog:
                    watchdog.finished(w.rank)
                if store_up:
                    try:  # for node 0's watchdog
                        store.set(f"heartbeat/{w.rank}/done", b"1")
                    except (RuntimeError, TimeoutError, ValueError):
                        store_up = False
        if store_up and not received:
            try:
                why = store.get(failed_key).decode() if store.check([failed_key]) else None
                hung = int(store.get(FAILED_RANK_KEY)) if why and store.check([FAILED_RANK_KEY]) else None
            except (RuntimeError, TimeoutError, ValueError):
                why, store_up = None, False  # reconnecting would wait the whole timeout
            if why:
                _stop(workers, a.stop_timeout)
                sys.stderr.write(f"infinitrain.run: {why}; stopped this node's workers\n")
                for w in workers:
                    if w.rank == hung:
                        sys.stderr.write(f"infinitrain.run: rank {w.rank}'s last lines:\n{_report(w)}\n")
                return 1
        if watchdog and not received:
            try:
                hung = watchdog.stale(time.monotonic())
            except (RuntimeError, TimeoutError, ValueError):
                hung, watchdog = None, None  # node 0's store is gone: its launcher finished
            if hung:
                return _hung(a, workers, store, *hung)
        time.sleep(0.1)


def _report(w):
    return "\n".join(f"  {line}" for line in w.tail) or "  (no output)"


def _hung(a, workers, store, rank, seconds):
    """Names a rank that stopped beating, stops this node's workers and tells the other nodes."""
    mine = [w for w in workers if w.rank == rank]
    pid = mine[0].proc.pid if mine else None
    if pid is None:
        try:
            key = f"heartbeat/{rank}/pid"
            pid = store.get(key).decode() if store.check([key]) else "unknown"
        except (RuntimeError, TimeoutError, ValueError):
            pid = "unknown"
    why = (
        f"rank {rank} (node {rank // a.nproc_per_node}, pid {pid}) sent no heartbeat for {seconds:.1f} s: "
        "stopped, hung or unreachable"
    )
    sys.stderr.write(f"infinitrain.run: {why}; stopping the other workers\n")
    sys.stderr.flush()
    try:
        store.set(FAILED_RANK_KEY, str(rank).encode())
        store.set(FAILED_KEY, why.encode())
    except (RuntimeError, TimeoutError, ValueError):
        pass  # the store's node is gone
    _stop(workers, a.stop_timeout)
    if mine:
        sys.stderr.write(f"infinitrain.run: rank {rank}'s last lines:\n{_report(mine[0])}\n")
    return HUNG_EXIT


if __name__ == "__main__":
    sys.exit(main())
