"""The rendezvous store's protocol fuzzed from raw sockets: seeded sequences of a few thousand frames, well-formed
ones mutated (bits flipped, length prefixes and argument counts replaced by huge or random values, frames cut
short, bytes inserted, commands replaced), sent with the token, a wrong one or none, some connections flooded
and dropped half-way. Afterwards the in-process server still answers a proper client at once, has closed every
connection, does not spin, and its process memory (VmRSS) has not grown past a bound."""

import os
import random
import socket
import struct
import time

import pytest

from infinitrain import _C

COMMANDS = b"SGACWD"
KEYS = [b"k", b"rdzv1/0", b"rdzv1/1", b"launcher/failed", b"n", b"", b"gloo/abc/0"]


def vm_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def well_formed(rng):
    cmd = rng.choice(COMMANDS)

    def key():
        return rng.choice(KEYS) if rng.random() < 0.7 else rng.randbytes(rng.randrange(0, 40))

    if cmd == ord("S"):
        args = [key(), rng.randbytes(rng.choice([0, 1, 8, 300, 5000]))]
    elif cmd == ord("A"):
        args = [key(), str(rng.randrange(-(10**6), 10**6)).encode()]
    elif cmd in b"GD":
        args = [key()]
    else:
        args = [key() for _ in range(rng.randrange(0, 6))]
    out = bytes([cmd]) + struct.pack("<I", len(args))
    for a in args:
        out += struct.pack("<I", len(a)) + a
    return out


def mutate(rng, f):
    f = bytearray(f)
    kind = rng.randrange(8)
    if kind == 0:  # flipped bits
        for _ in range(rng.randrange(1, 4)):
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a length prefix or the argument count replaced
        at = rng.choice([1] + [i for i in range(5, len(f) - 3)])
        f[at : at + 4] = struct.pack("<I", rng.choice([0xFFFFFFFF, 1 << 31, 1 << 24, rng.getrandbits(32)]))
    elif kind == 2:  # cut short
        f = f[: rng.randrange(len(f))]
    elif kind == 3:  # bytes inserted
        at = rng.randrange(len(f) + 1)
        f[at:at] = rng.randbytes(rng.randrange(1, 16))
    elif kind == 4:  # another command byte
        f[0] = rng.randrange(256)
    elif kind == 5:  # a 64-bit length where a 32-bit one goes (2^63 and the like)
        f[1:5] = struct.pack("<Q", rng.choice([1 << 63, (1 << 64) - 1, rng.getrandbits(64)]))
    elif kind == 6:  # garbage
        f = bytearray(rng.randbytes(rng.randrange(1, 2048)))
    return bytes(f)  # kind 7: left well-formed


def session(rng, port, token):
    """One connection: a greeting (the token mostly), a few frames, then closed, at times half-way."""
    greeting = rng.random()
    hello = token if greeting < 0.85 else b"wrong" if greeting < 0.92 else rng.randbytes(rng.randrange(0, 12))
    data = b"ITS1" + struct.pack("<I", len(hello)) + hello if greeting < 0.92 else hello
    frames = [mutate(rng, well_formed(rng)) for _ in range(rng.randrange(1, 12))]
    if rng.random() < 0.03:  # a flood of one huge well-prefixed value
        frames.append(b"S" + struct.pack("<II", 2, 1) + b"f" + struct.pack("<I", 15 << 20) + rng.randbytes(1 << 20))
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(data)
            for f in frames:
                s.sendall(f)
                if rng.random() < 0.2:  # read whatever the server answered so far
                    s.settimeout(0.002)
                    try:
                        s.recv(1 << 16)
                    except TimeoutError:
                        pass
                    s.settimeout(2)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server closed it: a refused frame
        if rng.random() < 0.5:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a close
    return len(frames)


@pytest.mark.parametrize("seed", [29, 2029])
def test_mutated_frames_leave_the_store_serving(seed):
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0)
    client = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)
    client.set("before", b"x")
    fds, rss = open_fds(), vm_rss()
    rng = random.Random(seed)
    token = server.token.encode()
    sent = 0
    while sent < 3000:
        sent += session(rng, server.port, token)
    # A proper client is answered at once, by the same connection and by a new one.
    start = time.monotonic()
    assert client.get("before") == b"x"
    client.set("after", b"y")
    fresh = _C.TcpStore("127.0.0.1", server.port, False, 2.0, token=server.token)
    assert fresh.get("after") == b"y" and fresh.add("fuzz/n", 3) == 3 and fresh.check(["before", "after"])
    assert time.monotonic() - start < 2
    # Every fuzzing connection is closed (the server's ends too), the thread waits in poll, memory is bounded:
    # the frames' values are small, and a 15 MiB value announced by its prefix is never read.
    deadline = time.monotonic() + 5
    while open_fds() > fds + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert open_fds() <= fds + 2, (fds, open_fds())
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.2
    grown = vm_rss() - rss
    assert grown < 64 << 20, f"VmRSS grew by {grown >> 20} MiB"
