"""Process groups: one process per rank, meeting through a TCP store (PyTorch's torch.distributed shape).

    it.distributed.init_process_group()          # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    it.distributed.all_reduce(t)                 # t on cpu: Gloo; on a device: the provider's CCL
    pg = it.distributed.new_group([0, 2])        # every rank calls it, members get a group

A group makes its communicators on first use, one per device type: the cpu's on Gloo, a device's on the
provider's CCL (its unique id handed round through the store), or, for a provider whose CCL cannot span
processes (sim's) or for ranks that share a device, staged through host memory and the group's cpu communicator.
Every rank must issue the same collectives in the same order, as with PyTorch.
"""

import atexit
import datetime
import ipaddress
import os
import secrets
import socket
import threading
import time

from infinitrain import _C
from infinitrain.distributed import cluster
from infinitrain.distributed import comm as _comm

_DEFAULT_TIMEOUT = 300.0
_TOKEN_ENV = "INFINITRAIN_STORE_TOKEN"


class ProcessGroup:
    """A set of ranks (global ranks, in group-rank order) and this process's communicators in it."""

    def __init__(self, name, ranks, global_rank, store):
        self.name = name
        self.ranks = list(ranks)
        self.rank = self.ranks.index(global_rank)
        self.size = len(self.ranks)
        self._store = store
        self._comms = {}
        self._lock = threading.Lock()
        self._worker = None  # runs the cpu collectives of async_op calls in issue order
        self._barriers = 0

    def __repr__(self):
        return f"ProcessGroup({self.name}, rank {self.rank} of {self.size}, global ranks {self.ranks})"

    def group_rank(self, global_rank, what):
        if global_rank not in self.ranks:
            raise ValueError(f"{what}: rank {global_rank} is not in {self}")
        return self.ranks.index(global_rank)

    def communicator(self, device):
        """This rank's communicator for `device` (made on first use: every rank must get there too)."""
        device = _C.parse_device(device)
        kind = device.split(":")[0]
        with self._lock:
            c = self._comms.get(kind)
            if c is None:
                c = self._comms[kind] = self._make(kind, device)
        if c.device != device:
            raise ValueError(
                f"{self}: this rank's {kind} communicator is on {c.device}; a group spans one device per rank "
                f"and type, got a tensor on {device}"
            )
        return c

    def _make(self, kind, device):
        if kind != "cpu" and (not _C.ccl_spans_processes(kind) or self._shares_a_device(kind, device)):
            return _C.ccl_staged(self._make_cpu(), device)
        key = f"{self.name}/uid/{kind}"
        if self.rank == 0:
            self._store.set(key, _comm.unique_id(kind))
        uid = self._store.get(key)
        return _comm.init_rank(uid, self.size, self.rank, device)

    def _shares_a_device(self, kind, device):
        """Whether two ranks of the group run on one device (same host and device): a GPU CCL takes one rank per
        device, so such a group stages through host memory instead. Every rank answers the same."""
        where = f"{socket.gethostname()}/{device}"
        self._store.set(f"{self.name}/where/{kind}/{self.rank}", where.encode())
        places = [self._store.get(f"{self.name}/where/{kind}/{r}") for r in range(self.size)]
        return len(set(places)) < len(places)

    def _make_cpu(self):
        c = self._comms.get("cpu")
        if c is None:
            c = self._comms["cpu"] = self._make("cpu", "cpu")
        return c

    def run(self, fn, async_op, device):
        """Calls fn(), a collective on `device`; returns a Work. A cpu collective blocks in Gloo, so with async_op
        it runs on the group's worker thread, in issue order, and later cpu calls queue behind it. A device
        collective is ordered on the caller's current stream already; it is called here, after the queued cpu
        ones (a staged device communicator runs on the group's cpu communicator)."""
        if device.startswith("cpu") and (async_op or self._worker is not None):
            if self._worker is None:
                self._worker = _Worker(self.name)
            pending = self._worker.submit(fn)
            if async_op:
                return Work(pending)
            pending.wait()
            return Work(None)
        if self._worker is not None:
            self._worker.submit(lambda: None).wait()
        fn()
        return Work(None)


class Work:
    """What an async_op collective returns: wait() blocks until it finished (and raises its error)."""

    def __init__(self, pending):
        self._pending = pending

    def wait(self, timeout=None):
        if self._pending is not None:
            self._pending.wait(timeout)
        return True

    def is_completed(self):
        return self._pending is None or self._pending.done()


class _Pending:
    def __init__(self):
        self._event = threading.Event()
        self._error = None

    def done(self):
        return self._event.is_set()

    def finish(self, error):
        self._error = error
        self._event.set()

    def wait(self, timeout=None):
        if not self._event.wait(timeout):
            raise TimeoutError(f"a collective did not finish within {timeout} s")
        if self._error is not None:
            raise self._error


class _Worker:
    """One thread per group running its cpu collectives in the order they were issued."""

    def __init__(self, name):
        self._jobs = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"infinitrain-{name}-collectives", daemon=True)
        self._thread.start()

    def submit(self, fn):
        p = _Pending()
        with self._cv:
            self._jobs.append((fn, p))
            self._cv.notify()
        return p

    def _loop(self):
        while True:
            with self._cv:
                while not self._jobs:
                    self._cv.wait()
                fn, p = self._jobs.pop(0)
            try:
                fn()
                p.finish(None)
            except BaseException as e:  # handed to whoever waits; the thread must not die
                p.finish(e)


class _NonMember:
    """new_group's answer on ranks outside the group (PyTorch's GroupMember.NON_GROUP_MEMBER)."""

    def __repr__(self):
        return "NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonMember()

_state = {"world": None, "store": None, "groups": 0}


def _env_int(name, default=None):
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise ValueError(f"init_process_group: {name} is not set (infinitrain.run sets it, or pass it)")
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"init_process_group: {name} must be an integer, got {v!r}") from None


def _seconds(timeout):
    if timeout is None:
        return float(os.environ.get("INFINITRAIN_DIST_TIMEOUT_S", _DEFAULT_TIMEOUT))
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    return float(timeout)


def init_process_group(
    backend=None,
    init_method=None,
    timeout=None,
    world_size=-1,
    rank=-1,
    store=None,
    group_name="",
    pg_options=None,
    device_id=None,
    _ranks=None,
    enable_reconfigure=False,
):
    """Joins the default group: every rank of WORLD_SIZE, meeting at the store on MASTER_ADDR:MASTER_PORT
    (infinitrain.run serves it; otherwise rank 0 does). Under srun or mpirun these come from Slurm's or Open MPI's
    variables (distributed/cluster.py). init_method "env://" (default) or "tcp://host:port".
    backend is accepted for PyTorch's sake: None, "gloo", or the registered provider's CCL; the device of each
    tensor chooses. Waits for every rank, up to timeout (seconds or a timedelta; default 300, or
    INFINITRAIN_DIST_TIMEOUT_S), then raises TimeoutError naming the ranks that did not come. A timeout given
    here also bounds each cpu collective (otherwise INFINITRAIN_CCL_TIMEOUT_S, default 300 s). The store serves
    only processes that present INFINITRAIN_STORE_TOKEN (infinitrain.run sets it; ranks started otherwise need
    the same secret, unless MASTER_ADDR is loopback); a serving rank 0 listens on MASTER_ADDR, or
    INFINITRAIN_STORE_BIND_ADDR (0.0.0.0: every interface). Under infinitrain.run the process starts beating for
    the launcher's watchdog here (see _Heartbeat), and goes on until it exits."""
    if _state["world"] is not None:
        raise RuntimeError("init_process_group: already initialised (destroy_process_group() first)")
    if backend not in (None, "gloo", "nccl", "mccl", "cuda", "maca", "sim", "cpu"):
        raise ValueError(f"init_process_group: unknown backend {backend!r}: expected None, 'gloo' or a provider's CCL")
    if rank < 0 or world_size < 0:
        cluster.apply()  # srun's or mpirun's variables, as infinitrain.run's
    rank = _env_int("RANK") if rank < 0 else int(rank)
    world_size = _env_int("WORLD_SIZE") if world_size < 0 else int(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"init_process_group: need 0 <= rank < world_size, got rank {rank} of {world_size}")
    seconds = _seconds(timeout)
    serve_here = False
    if store is None:
        host, port = _address(init_method)
        serve_here = rank == 0 and os.environ.get("INFINITRAIN_STORE_SERVED") != "1"
        bind = os.environ.get("INFINITRAIN_STORE_BIND_ADDR") or host  # 0.0.0.0: every interface
        token = _store_token(world_size, serve_here, bind if serve_here else host, port)
        store = _C.TcpStore(bind if serve_here else host, port, serve_here, seconds, token=token)
    elif getattr(store, "token", None) and not os.environ.get(_TOKEN_ENV):
        os.environ[_TOKEN_ENV] = store.token  # Gloo's store client (C++) reads the token from the environment
    _load_gloo()
    # The address other ranks reach the store at (a serving rank 0's own is MASTER_ADDR, not loopback).
    advertised = host if serve_here else store.host
    _C.set_rendezvous_store(advertised if advertised not in ("0.0.0.0", "") else "127.0.0.1", store.port)
    if timeout is not None:  # as PyTorch's: the collectives' limit too (for communicators made from now on)
        os.environ["INFINITRAIN_CCL_TIMEOUT_S"] = str(seconds)
    # Every init after a destroy meets under new keys (a store outlives the groups that used it).
    _state["generation"] = gen = _state.get("generation", 0) + 1
    store.set(f"rdzv{gen}/{rank}", socket.gethostname().encode())
    keys = [f"rdzv{gen}/{r}" for r in range(world_size)]
    try:
        # A rank serving the store waits a little longer, so the others can still ask it who is missing.
        store.wait(keys, seconds + (min(seconds, 5.0) if serve_here else 0.0))
    except TimeoutError:
        try:
            missing = [str(r) for r in range(world_size) if not store.check([keys[r]])]
            who = f"rank(s) {', '.join(missing)} of {world_size} did not join"
        except (RuntimeError, OSError):
            who = "the store went away before the missing ranks could be listed"
        raise TimeoutError(
            f"init_process_group: rank {rank} waited {seconds:g} s at the store {store.host}:{store.port}; {who}"
        ) from None
    _state.update(world=ProcessGroup(f"world{gen}", range(world_size), rank, store), store=store, groups=0)
    _start_heartbeat()


def _store_token(world_size, serve_here, addr, port):
    """The run's store secret: INFINITRAIN_STORE_TOKEN (infinitrain.run sets it), or, for ranks started as PyTorch
    users start them (MASTER_ADDR on loopback, no launcher), one derived from the port: such a store is reachable
    from this host only. A world of one makes a fresh one."""
    token = os.environ.get(_TOKEN_ENV)
    if not token:
        if world_size == 1 and serve_here:
            token = secrets.token_hex(16)
        elif _is_loopback(addr):
            token = f"loopback:{port}"
        else:
            raise ValueError(
                f"init_process_group: {_TOKEN_ENV} is not set and the store at {addr}:{port} is not on loopback: "
                "infinitrain.run sets it for its workers; ranks started otherwise need the same secret in each "
                "one's environment (python -c 'import secrets; print(secrets.token_hex(16))')"
            )
        os.environ[_TOKEN_ENV] = token  # Gloo's store client (C++) reads it from the environment
    return token


def _is_loopback(addr):
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        return False


def _address(init_method):
    if init_method in (None, "env://"):
        host = os.environ.get("MASTER_ADDR")
        if host is None:
            raise ValueError("init_process_group: MASTER_ADDR is not set (infinitrain.run sets it) and no init_method")
        return host, _env_int("MASTER_PORT")
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://") :].rpartition(":")
        if host and port.isdigit():
            return host, int(port)
    raise ValueError(f"init_process_group: init_method must be 'env://' or 'tcp://host:port', got {init_method!r}")


def _load_gloo():
    try:
        from infinitrain import _gloo  # noqa: F401 (importing registers the cpu's CCL)
    except ImportError as e:
        raise ImportError(
            f"infinitrain's Gloo module failed to load ({e}): install Gloo's library (Debian: libgloo0)"
        ) from e
    if not _state.get("flush_at_exit"):
        atexit.register(_at_exit)
        _state["flush_at_exit"] = True


def _at_exit():
    from infinitrain import _gloo

    try:
        # A send completes when its receiver takes it: a rank that sends last must not exit before that.
        _gloo.flush_sends()
    finally:
        # The heartbeat goes on while this waits (a receiver that hangs is the one to name) and stops before the
        # interpreter finalizes.
        hb = _state.get("heartbeat")
        if hb is not None:
            hb.stop()


_HEARTBEAT_ENV = "INFINITRAIN_HEARTBEAT_S"  # the interval infinitrain.run asks of its workers; unset: no heartbeat
_HEARTBEAT_CALL_S = 2.0  # a heartbeat's store timeout: bounds what a dead store costs the thread, and exit


class _Heartbeat:
    """A daemon thread adding 1 to the launcher's store key heartbeat/<RANK> every `interval` seconds; the launcher
    names a rank whose count stops moving (infinitrain.run's --heartbeat_timeout). It has a connection of its own:
    the group's may be held by a wait for minutes. It never raises into the program and never prints; it gives up
    once the store has been out of reach for a while (node 0 finished first, say)."""

    def __init__(self, host, port, token, rank, interval):
        self.key = f"heartbeat/{rank}"
        self._where = (host, port, token)
        self._interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infinitrain-heartbeat", daemon=True)
        self._thread.start()

    def _run(self):
        store, failing_since = None, None
        give_up = max(30.0, 10 * self._interval)
        while True:
            try:
                if store is None:
                    host, port, token = self._where
                    store = _C.TcpStore(host, port, False, _HEARTBEAT_CALL_S, token=token)
                    store.set(f"{self.key}/pid", str(os.getpid()).encode())
                store.add(self.key, 1)
                failing_since = None
            except PermissionError:
                return  # a store that refuses this process will not take it later
            except BaseException:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > give_up:
                    return
            if self._stopping.wait(self._interval):
                break
        if failing_since is None:  # a store that just failed is likely gone: exit without waiting on it
            try:
                store.set(f"{self.key}/done", b"1")  # a finished rank: no longer watched
            except BaseException:
                pass

    def stop(self):
        """Stops the thread and waits for it: a daemon thread that comes back from the store while the interpreter
        finalizes would abort the process (pybind11 cannot unwind it)."""
        self._stopping.set()
        self._thread.join(2 * _HEARTBEAT_CALL_S + 1.0)


def _start_heartbeat():
    """Under infinitrain.run, starts this process's heartbeat (once: it outlives destroy_process_group)."""
    interval = os.environ.get(_HEARTBEAT_ENV)
    if not interval or _state.get("heartbeat") is not None:
        return
    try:
        interval = float(interval)
        host, port, rank = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
    except (KeyError, ValueError):
        return  # not the launcher's environment after all
    if interval > 0:
        _state["heartbeat"] = _Heartbeat(host, port, os.environ.get(_TOKEN_ENV), rank, interval)


def flush_sends():
    """Blocks until the receivers have taken every cpu send of this process (a send returns once buffered);
    nothing to wait for while no cpu group has been made."""
    if _state.get("flush_at_exit"):
        from infinitrain import _gloo

        _gloo.flush_sends()


def is_initialized():
    return _state["world"] is not None


def destroy_process_group(group=None):
    """Leaves the default group (every group made from it goes too)."""
    if group is None or group is _state["world"]:
        _state.update(world=None, store=None)


def _world(what):
    if _state["world"] is None:
        raise RuntimeError(f"{what}: call infinitrain.distributed.init_process_group() first")
    return _state["world"]


def default_group():
    return _world("default_group")


def default_store():
    """The default group's rendezvous store (a TcpStore: set, get, add, wait, check, delete_key)."""
    _world("default_store")
    return _state["store"]


def get_rank(group=None):
    """This process's rank in group (the default group's: the global rank); -1 outside the group."""
    if group is NON_GROUP_MEMBER:
        return -1
    return (group or _world("get_rank")).rank


def get_world_size(group=None):
    if group is NON_GROUP_MEMBER:
        return -1
    return (group or _world("get_world_size")).size


def new_group(ranks=None, timeout=None):
    """A group of these global ranks (all of them by default). Every rank of the default group must call it,
    in the same order; ranks outside get NON_GROUP_MEMBER."""
    world = _world("new_group")
    ranks = list(range(world.size)) if ranks is None else [int(r) for r in ranks]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < world.size for r in ranks):
        raise ValueError(f"new_group: ranks must be distinct global ranks in [0, {world.size}), got {ranks}")
    _state["groups"] += 1
    name = f"{world.name}.g{_state['groups']}"
    me = world.ranks[world.rank]
    if me not in ranks:
        return NON_GROUP_MEMBER
    return ProcessGroup(name, ranks, me, _state["store"])


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Returns once every rank of group got here (through the store, so no device work is involved)."""
    g = group or _world("barrier")
    if g is NON_GROUP_MEMBER:
        return
    store = _state["store"]
    key = f"{g.name}/barrier/{g._barriers}"
    g._barriers += 1
    if store.add(key, 1) == g.size:
        store.set(key + "/done", b"1")
    store.wait([key + "/done"])
