"""The rendezvous store (infinitrain._C.TcpStore) in one process: values, waits that time out naming the
keys, counters, bad requests answered with an error (the connection stays), and clients of a gone server."""

import threading
import time

import numpy as np
import pytest

from infinitrain import _C


@pytest.fixture
def stores():
    server = _C.TcpStore("127.0.0.1", 0, True, 10.0)
    client = _C.TcpStore("127.0.0.1", server.port, False, 2.0)
    yield server, client


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
    keys = [f"r{i}" for i in range(5000)]  # a rendezvous of 5000 ranks names 5000 keys
    assert not client.check(keys)
    assert client.get("text") == b"not a number"


def test_no_server_and_a_gone_server():
    with pytest.raises(TimeoutError, match="cannot connect to 127.0.0.1:1 within 0.2 s"):
        _C.TcpStore("127.0.0.1", 1, False, 0.2)
    server = _C.TcpStore("127.0.0.1", 0, True, 5.0)
    client = _C.TcpStore("127.0.0.1", server.port, False, 0.5)
    client.set("x", b"1")
    del server
    with pytest.raises((RuntimeError, TimeoutError)):
        client.get("x")
    with pytest.raises(ValueError, match="port"):
        _C.TcpStore("127.0.0.1", 70000, False, 1.0)
