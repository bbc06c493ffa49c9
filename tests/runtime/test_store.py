"""The rendezvous store (infinitrain._C.TcpStore): values, waits that time out naming the keys, counters, bad
requests answered with an error (the connection stays), clients of a gone server; and its hardening: it listens
on the address it is given only, serves only clients that present the run's token, refuses keys, values and
totals over its limits with a clear error, survives huge length prefixes, garbage, idle connections past its
cap and past the descriptor limit without spinning; the launcher hands its workers the token, refuses a
multi-node run without one, and its failure key still stops the other nodes."""

import os
import select
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from harness import child_env
from infinitrain import _C

TOKEN_ENV = "INFINITRAIN_STORE_TOKEN"


@pytest.fixture
def stores():
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0)
    client = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)
    yield server, client


# ---- raw sockets: what a stranger (or a broken client) sends ----


def frame(cmd, *args):
    out = cmd + struct.pack("<I", len(args))
    for a in args:
        out += struct.pack("<I", len(a)) + a
    return out


def hello(token):
    token = token.encode() if isinstance(token, str) else token
    return b"ITS1" + struct.pack("<I", len(token)) + token


def raw(port, token=None, host="127.0.0.1", timeout=5.0):
    """A plain socket to the store; with token, past the handshake."""
    s = socket.create_connection((host, port), timeout=timeout)
    if token is not None:
        s.sendall(hello(token))
        assert read_reply(s) == (0, b"")
    return s


def read_reply(s):
    """(status, body) of the next reply, or None when the server closed the connection first."""
    buf = b""
    while len(buf) < 5 or len(buf) < 5 + struct.unpack("<I", buf[1:5])[0]:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf[0], buf[5 : 5 + struct.unpack("<I", buf[1:5])[0]]


def closed_by_server(s, within):
    """Whether the server closes s within `within` seconds (replies before the close are skipped)."""
    s.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def busy_seconds(pid, over):
    """CPU seconds process pid spends (all its threads) in `over` seconds of wall time."""

    def ticks():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    t0 = ticks()
    time.sleep(over)
    return (ticks() - t0) / os.sysconf("SC_CLK_TCK")


def served_within(port, token, seconds):
    """Seconds a new proper client takes to connect, set and get; fails past `seconds`."""
    start = time.monotonic()
    c = _C.TcpStore("127.0.0.1", port, False, seconds, token=token)
    c.set("probe", b"p")
    assert c.get("probe") == b"p"
    took = time.monotonic() - start
    assert took < seconds, took
    return took


# ---- the store's operations ----


def test_values_counters_and_waits(stores):
    server, client = stores
    blob = np.random.default_rng().bytes(70000) + b"\x00end"
    client.set("k", blob)
    assert server.get("k") == blob and client.check(["k"]) and not client.check(["k", "missing"])
    assert client.add("n", 5) == 5 and server.add("n", -7) == -2
    threading.Timer(0.2, lambda: server.set("late", b"v")).start()
    start = time.time()
    assert client.get("late") == b"v" and 0.1 < time.time() - start < 2
    assert client.delete_key("k") and not client.delete_key("k")


def test_waits_time_out_naming_the_keys_and_the_client_goes_on(stores):
    _, client = stores
    with pytest.raises(TimeoutError, match=r"waited 0.3 s for key\(s\) 'a', 'b'"):
        client.wait(["a", "b"], 0.3)
    client.set("a", b"1")
    assert client.get("a") == b"1"  # reconnected after the timeout


def test_bad_requests_get_an_error_and_keep_the_connection(stores):
    _, client = stores
    client.set("text", b"not a number")
    with pytest.raises(ValueError, match="whose value is not an integer"):
        client.add("text", 1)
    client.set("big", str(2**63 - 1).encode())
    with pytest.raises(ValueError, match="overflows int64"):
        client.add("big", 1)
    keys = [f"r{i}" for i in range(5000)]  # a rendezvous of 5000 ranks names 5000 keys
    assert not client.check(keys)
    assert client.get("text") == b"not a number"


def test_no_server_and_a_gone_server():
    with pytest.raises(TimeoutError, match="cannot connect to 127.0.0.1:1 within 0.2 s"):
        _C.TcpStore("127.0.0.1", 1, False, 0.2, token="t")
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0)
    client = _C.TcpStore("127.0.0.1", server.port, False, 0.5, token=server.token)
    client.set("x", b"1")
    del server
    with pytest.raises((RuntimeError, TimeoutError)):
        client.get("x")
    with pytest.raises(ValueError, match="port"):
        _C.TcpStore("127.0.0.1", 70000, False, 1.0, token="t")


# ---- the token ----


def test_a_token_is_required(stores, monkeypatch):
    server, client = stores
    assert len(server.token) == 32 and server.token != _C.TcpStore("127.0.0.1", 0, True, 5.0).token
    client.set("launcher/failed", b"")
    with pytest.raises(PermissionError, match="wrong token"):
        _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token + "x")
    with pytest.raises(PermissionError, match="wrong token"):
        _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token[:-1])
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=f"no token: pass one, or set \\${TOKEN_ENV}"):
        _C.TcpStore("127.0.0.1", server.port, False, 2.0)
    with pytest.raises(ValueError, match="must not be empty"):
        _C.TcpStore("127.0.0.1", server.port, False, 2.0, token="")
    with pytest.raises(ValueError, match="at most 256 bytes"):
        _C.TcpStore("127.0.0.1", 0, True, 2.0, token="t" * 257)
    monkeypatch.setenv(TOKEN_ENV, server.token)  # what the launcher's workers (and Gloo's client) use
    assert _C.TcpStore("127.0.0.1", server.port, False, 2.0).get("launcher/failed") == b""
    mine = _C.TcpStore("127.0.0.1", 0, True, 2.0, token=b"\x00bytes\xff")
    assert _C.TcpStore("127.0.0.1", mine.port, False, 2.0, token=b"\x00bytes\xff").add("n", 2) == 2


@pytest.mark.parametrize(
    "greeting",
    [b"", hello("wrong"), hello(""), b"ITS1", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"ITS2" + b"\x00" * 4],
    ids=["nothing", "wrong", "empty", "cut", "http", "magic"],
)
def test_strangers_read_and_write_nothing(stores, greeting):
    server, client = stores
    client.set("secret", b"s3cr3t")
    s = raw(server.port)
    s.sendall(greeting + frame(b"G", b"secret") + frame(b"S", b"launcher/failed", b"rank 0 exited"))
    got = b""
    s.settimeout(3 if greeting else 0.5)
    try:
        while chunk := s.recv(65536):
            got += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    assert b"s3cr3t" not in got
    if got:
        assert got[0] == 0x83 and b"store:" in got  # refused, then closed
    assert not client.check(["launcher/failed"])
    s.close()


def test_a_connection_without_the_token_is_closed_within_the_deadline():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"handshake_timeout": 0.5})
    silent, partial = raw(server.port), raw(server.port)
    partial.sendall(hello(server.token)[:6])
    start = time.monotonic()
    assert closed_by_server(silent, 3) and closed_by_server(partial, 3)
    assert 0.3 < time.monotonic() - start < 3
    served_within(server.port, server.token, 2)


# ---- the address it listens on ----


def non_loopback_ip():
    """An IPv4 address of this host other than loopback, or None."""
    found = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.1", 9))  # a route's source address; nothing is sent
            found.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        found += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    for ip in found:
        if not ip.startswith("127.") and ip != "0.0.0.0":
            try:
                with socket.socket() as s:
                    s.bind((ip, 0))
                return ip
            except OSError:
                pass
    return None


def reachable(ip, port):
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_it_listens_on_the_address_it_is_given():
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no IPv4 address other than loopback")
    local = _C.TcpStore("127.0.0.1", 0, True, 5.0)
    assert reachable("127.0.0.1", local.port) and not reachable(ip, local.port)
    there = _C.TcpStore(ip, 0, True, 5.0)
    assert reachable(ip, there.port) and not reachable("127.0.0.1", there.port)
    assert _C.TcpStore(ip, there.port, False, 2.0, token=there.token).add("n", 1) == 1
    every = _C.TcpStore("0.0.0.0", 0, True, 5.0)
    assert every.host == "127.0.0.1" and reachable(ip, every.port) and reachable("127.0.0.1", every.port)
    with pytest.raises(RuntimeError, match="not an address of this host"):
        _C.TcpStore("198.51.100.7", 0, True, 2.0)


# ---- limits ----


def test_keys_and_values_over_the_limits_are_refused_and_the_store_goes_on(stores):
    server, client = stores
    limits = _C.store_limits()
    assert (limits["max_key_bytes"], limits["max_value_bytes"]) == (4 << 10, 16 << 20)
    with pytest.raises(ValueError, match=r"a key of 4097 bytes, over the store's limit of 4 KiB"):
        client.set("k" * 4097, b"")
    with pytest.raises(ValueError, match=r"a key of 5000 bytes"):
        client.wait(["ok", "k" * 5000])
    with pytest.raises(ValueError, match=r"a value of 16777217 bytes, over the store's limit of 16 MiB"):
        client.set("v", bytes((16 << 20) + 1))
    client.set("k" * 4096, b"at the limit")
    client.set("v", bytes(16 << 20))
    assert len(server.get("v")) == 16 << 20 and client.get("k" * 4096) == b"at the limit"
    # The server checks them too, from the length prefix alone: an error reply, then the connection goes.
    for bad in (
        frame(b"S", b"k" * 5000, b"x"),
        b"S" + struct.pack("<II", 2, 1) + b"k" + struct.pack("<I", 64 << 20) + b"only a start",  # 64 MiB value
        b"A" + struct.pack("<II", 2, 1) + b"n" + struct.pack("<I", 100) + b"1" * 100,
    ):
        s = raw(server.port, server.token)
        s.sendall(bad)
        status, body = read_reply(s)
        assert status == 0x81 and b"over the store's limit" in body, body
        assert closed_by_server(s, 2)
    assert client.add("n", 1) == 1


def test_a_client_hears_the_servers_smaller_limits():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"max_key_bytes": 8, "max_value_bytes": 1024})
    client = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)  # the default limits
    with pytest.raises(ValueError, match="a value of 1025 bytes, over the store's limit of 1 KiB"):
        client.set("v", bytes(1025))
    with pytest.raises(ValueError, match="a key of 9 bytes, over the store's limit of 8 bytes"):
        client.get("123456789")
    client.set("v", bytes(1024))  # the same client, reconnected
    assert client.get("v") == bytes(1024)


def test_the_total_is_capped():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"max_total_bytes": 1 << 20})
    client = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)
    value = bytes(200 << 10)
    for i in range(5):
        client.set(f"k{i}", value)
    with pytest.raises(RuntimeError, match=r"store: full: setting key 'k5' \(204800 bytes\) .* limit of 1 MiB"):
        client.set("k5", value)
    client.set("k0", value)  # replacing a value of the same size fits
    assert client.get("k4") == value and not client.check(["k5"])
    assert client.delete_key("k0")
    client.set("k5", value)  # deleting made room
    # Many small entries count their overhead too: the cap bounds the number of keys.
    with pytest.raises(RuntimeError, match="store: full"):
        for i in range(100000):
            client.set(f"small{i}", b"")
    assert client.get("k5") == value


def vm_rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def test_full_buffers_hold_back_large_replies_without_a_deadlock():
    """Buffers smaller than one value: requests still go through (one begun is read to its end, a large reply
    waits for room); clients that never read their replies hold about the buffers and one reply, not one reply
    each, and are closed once stalled, so a proper client waits at most that long."""
    limits = {"max_buffered_bytes": 256 << 10, "max_value_bytes": 8 << 20, "stall_timeout": 1.0}
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0, limits=limits)
    value = np.random.default_rng(5).bytes(1 << 20)
    errors = []

    def rank(i):
        try:
            c = _C.TcpStore("127.0.0.1", server.port, False, 20.0, token=server.token)
            for _ in range(3):
                c.set(f"v{i}", value)
                assert c.get(f"v{(i + 1) % 6}") == value
        except Exception as e:  # handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(6)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and time.monotonic() - start < 20, errors
    # 8 MiB: more than the kernel's send buffer takes off the server's hands.
    server.set("big", bytes(8 << 20))
    rss = vm_rss()
    hogs = []
    for _ in range(20):
        h = socket.socket()
        h.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        h.settimeout(5)
        h.connect(("127.0.0.1", server.port))
        h.sendall(hello(server.token))
        assert read_reply(h) == (0, b"")
        h.sendall(frame(b"G", b"big"))
        hogs.append(h)
    time.sleep(0.3)
    grown = vm_rss() - rss
    assert grown < 40 << 20, f"VmRSS grew by {grown >> 20} MiB for 20 unread replies of 8 MiB"
    assert served_within(server.port, server.token, 3) < 3  # once the first reader stalled (1 s)
    time.sleep(1.5)  # past the stall timeout again, reading nothing (a read is progress)
    p = select.poll()
    for h in hogs:
        p.register(h, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    assert p.poll(0), "no connection that stalled with its reply unread was closed"
    for h in hogs:
        h.close()
    served_within(server.port, server.token, 2)


def test_huge_length_prefixes_and_garbage_do_not_kill_it(stores):
    server, client = stores
    rng = np.random.default_rng(29)
    u32 = 0xFFFFFFFF
    attempts = [
        (None, b"ITS1" + struct.pack("<I", u32)),
        (None, b"ITS1" + struct.pack("<Q", 1 << 63)),
        (server.token, b"S" + struct.pack("<I", u32)),
        (server.token, b"W" + struct.pack("<I", u32)),
        (server.token, b"C" + struct.pack("<II", 1, u32)),
        (server.token, b"G" + struct.pack("<II", 1, u32)),
        (server.token, b"S" + struct.pack("<III", 2, 1 << 31, 0)),
        (server.token, b"W" + struct.pack("<Q", 1 << 63) + b"\xff" * 64),
        (server.token, b"\x00" * 64),
        (None, rng.bytes(1 << 16)),
        (server.token, rng.bytes(1 << 16)),
        (server.token, b"S" + rng.bytes(1 << 16)),
    ]
    for token, data in attempts:
        s = raw(server.port, token)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending
        assert closed_by_server(s, 3), data[:16]
        s.close()
    client.set("after", b"ok")
    assert client.get("after") == b"ok" and client.add("n", 2) == 2


def test_idle_connections_do_not_stop_a_client_nor_spin_it():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"handshake_timeout": 2.0})
    idle = [raw(server.port) for _ in range(300)]
    assert served_within(server.port, server.token, 2) < 2
    assert busy_seconds(os.getpid(), 1.0) < 0.3  # the server thread waits in poll
    assert all(closed_by_server(s, 4) for s in idle)  # no token within 2 s
    for s in idle:
        s.close()


def test_connections_past_the_cap_give_way_to_one_with_the_token():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"max_connections": 32})
    assert server.limits["max_connections"] == 32
    held = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)
    idle = [raw(server.port) for _ in range(200)]  # past the cap: the kernel's backlog holds the rest
    served_within(server.port, server.token, 3)
    assert held.add("n", 1) == 1  # a connection that showed its token is never evicted
    assert busy_seconds(os.getpid(), 1.0) < 0.3
    for s in idle:
        s.close()
    served_within(server.port, server.token, 2)


SERVER_AT_FD_LIMIT = """
import resource, sys, time
from infinitrain import _C
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
limits = {"max_connections": 4096} if sys.argv[1] == "past" else None
s = _C.TcpStore("127.0.0.1", 0, True, 10.0, limits=limits)
print(s.port, s.token, s.limits["max_connections"], flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("cap", ["default", "past"])
def test_more_connections_than_descriptors(cap):
    """A server allowed 64 descriptors: by default its cap stays under them; told to take 4096 connections,
    it runs out of descriptors (EMFILE), and still serves a client with the token without spinning."""
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER_AT_FD_LIMIT, cap], env=child_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        port, token, max_conn = p.stdout.readline().split()
        assert int(max_conn) == (16 if cap == "default" else 4096)
        idle = [raw(int(port)) for _ in range(200)]
        served_within(int(port), token, 3)
        assert busy_seconds(p.pid, 1.0) < 0.3
        served_within(int(port), token, 3)
        assert p.poll() is None
        for s in idle:
            s.close()
    finally:
        p.kill()
        p.wait()


def test_a_stalled_request_is_closed_and_an_idle_client_stays():
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0, limits={"stall_timeout": 0.5})
    half = raw(server.port, server.token)
    half.sendall(frame(b"S", b"k", b"value")[:-2])
    quiet = raw(server.port, server.token)
    assert closed_by_server(half, 3)
    time.sleep(0.5)
    quiet.sendall(frame(b"S", b"k", b"v"))  # an idle connection past the handshake may stay
    assert read_reply(quiet) == (0, b"")


def test_a_client_that_sends_while_its_get_waits_is_closed(stores):
    """One request at a time: more bytes behind a parked get would otherwise sit unread and hide a hang-up."""
    server, client = stores
    s = raw(server.port, server.token)
    s.sendall(frame(b"G", b"missing"))
    time.sleep(0.2)
    s.sendall(frame(b"S", b"k", b"v"))
    assert closed_by_server(s, 2) and not client.check(["k"])
    client.set("missing", b"now")  # nobody is left to answer
    assert client.get("missing") == b"now"


# ---- the launcher and init_process_group ----


def test_init_process_group_without_the_token(monkeypatch):
    import infinitrain.distributed as dist

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    # Off loopback a secret is required (on loopback, ranks started as PyTorch users start them get one derived
    # from the port: test_multiprocess's rendezvous test runs that way).
    for k, v in dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="10.255.255.1", MASTER_PORT="1").items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=f"{TOKEN_ENV} is not set and the store at 10.255.255.1:1 is not on loop"):
        dist.init_process_group(timeout=1)


def test_a_world_of_one_without_the_launcher(tmp_path):
    """Rank 0 serving itself makes a token; Gloo's own store client finds it."""
    script = tmp_path / "one.py"
    script.write_text(
        textwrap.dedent("""
        import os
        import numpy as np
        import infinitrain as it
        import infinitrain.distributed as dist
        dist.init_process_group(timeout=30)
        t = it.from_numpy(np.ones(4, dtype=np.float32))
        dist.all_reduce(t)
        assert len(os.environ["INFINITRAIN_STORE_TOKEN"]) == 32
        print("one ok", t.numpy().tolist(), flush=True)
        """)
    )
    env = child_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    env.pop(TOKEN_ENV, None)
    env.pop("INFINITRAIN_STORE_SERVED", None)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "one ok [1.0, 1.0, 1.0, 1.0]" in p.stdout, p.stdout + p.stderr


LAUNCHED = """
import os, socket, struct, sys
import numpy as np
import infinitrain as it
import infinitrain.distributed as dist
from infinitrain import _C

token = os.environ["INFINITRAIN_STORE_TOKEN"]
assert len(token) == 32, token
dist.init_process_group(timeout=60)
r = dist.get_rank()
t = it.from_numpy(np.full(3, r + 1, dtype=np.float32))
dist.all_reduce(t)
assert t.numpy().tolist() == [3.0] * 3
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
try:
    _C.TcpStore(host, port, False, 5.0, token="not the token")
    raise AssertionError("a wrong token was served")
except PermissionError:
    pass
s = socket.create_connection((host, port), timeout=5)
key = b"launcher/failed"
s.sendall(b"S" + struct.pack("<II", 2, len(key)) + key + struct.pack("<I", 1) + b"x")
assert s.recv(100)[:1] in (b"", b"\\x83")
other = sys.argv[1]
if other != "-":
    try:
        socket.create_connection((other, port), timeout=2).close()
        raise AssertionError(f"the store answers on {other}")
    except OSError:
        pass
dist.barrier()
assert not dist.default_store().check(["launcher/failed"])
print(f"rank {r} launched ok", flush=True)
"""


def test_the_launcher_hands_its_workers_the_token(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(LAUNCHED)
    env = child_env()
    env.pop(TOKEN_ENV, None)
    cmd = [sys.executable, "-m", "infinitrain.run", "--nproc_per_node=2", "--master_port=0", str(script)]
    p = subprocess.run([*cmd, non_loopback_ip() or "-"], env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sorted(line for line in p.stdout.splitlines() if "launched ok" in line) == [
        f"rank {r} launched ok" for r in (0, 1)
    ], p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_several_nodes_need_the_token_and_a_failure_on_one_stops_the_other(tmp_path):
    env = child_env()
    env.pop(TOKEN_ENV, None)
    for k in (0, 1):
        flags = ["--nnodes=2", f"--node_rank={k}", f"--master_port={free_port()}"]
        p = subprocess.run(
            [sys.executable, "-m", "infinitrain.run", *flags, "x.py"], env=env, capture_output=True, text=True
        )
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"--nnodes=2 needs {TOKEN_ENV} set to the same secret on every node" in p.stderr, p.stderr
    # Two "nodes" on this host: node 1's worker fails, node 0's launcher hears it through the store's failure key.
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, time
        import infinitrain.distributed as dist
        dist.init_process_group(timeout=60)
        dist.barrier()
        print(f"rank {dist.get_rank()} up", flush=True)
        if dist.get_rank() == 1:
            sys.exit(7)
        time.sleep(120)
        """)
    )
    env[TOKEN_ENV] = "a secret both nodes know"
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "infinitrain.run", "--nnodes=2", f"--node_rank={k}", "--nproc_per_node=1"]
            + [f"--master_port={port}", "--rdzv_timeout=60", "--stop_timeout=2", str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in (0, 1)
    ]
    start = time.time()
    (out0, err0), (out1, err1) = (p.communicate(timeout=120) for p in procs)
    assert procs[1].returncode == 7 and "rank 1 (local rank 0" in err1, out1 + err1
    assert procs[0].returncode == 1 and "rank 1 (node 1) exited with code 7" in err0, out0 + err0
    assert time.time() - start < 60
    # A node whose launcher has another secret is refused at once.
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0, token="node 0's secret")
    flags = ["--nnodes=2", "--node_rank=1", f"--master_port={server.port}", "--rdzv_timeout=30"]
    p = subprocess.run(
        [sys.executable, "-m", "infinitrain.run", *flags, str(script)],
        env=dict(env, **{TOKEN_ENV: "another"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1 and "refused this process: store: wrong token" in p.stderr, p.stderr
