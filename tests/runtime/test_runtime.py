"""Device runtime: device counts, streams and events, allocator statistics, threads, async errors.

Runs on the device under test (harness.DEVICE); the sim-specific checks (device memory the host
cannot touch, INFINITRAIN_SIM_* settings, errors surfacing at the next synchronisation) skip elsewhere.
"""

import gc
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from harness import DEVICE, to_device
from infinitrain import _C, runtime

DEV = _C.parse_device(DEVICE)  # "cpu" or "<type>:<index>"
TYPE = DEV.split(":")[0]
SIM = TYPE == "sim"
NDEV = runtime.device_count(TYPE)
DEVICES = [DEV] if TYPE == "cpu" else [f"{TYPE}:{i}" for i in range(NDEV)]
sim_only = pytest.mark.skipif(not SIM, reason="sim-specific")


def op(name, inputs, attrs=()):
    """Runs one op without harness.run's synchronisation: these tests want the work in flight."""
    return _C.op(name)(list(inputs), list(attrs))


def _settle(device=DEV):
    """Waits for the device and collects garbage, so statistics no longer move."""
    gc.collect()
    runtime.synchronize(device)


def _chain(x, ws):
    """x @ w0 @ w1 ... through the dispatcher: a long stretch of work on the current stream."""
    for w in ws:
        (x,) = op("matmul", [x, w], [0, 0])
    return x


def _subprocess(code, **env):
    """Runs `code` in a fresh interpreter that sees this one's modules; returns the CompletedProcess."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True, timeout=120
    )


# ---- devices ----


def test_device_count():
    assert NDEV >= 1
    if TYPE == "cpu":
        assert NDEV == 1
    if SIM:
        import infinitrain_sim

        assert NDEV == int(os.environ.get("INFINITRAIN_SIM_DEVICES", "4")) == infinitrain_sim.device_count()


def test_device_module_counts_only_the_provider_holding_the_slot(monkeypatch):
    """One provider holds the device slot per process: its namespace counts its runtime's devices, another built-in
    provider's namespace counts none (it cannot run here), and before any registers each counts its own. The build
    under test may have no provider, so the providers, the slot and the runtime's counts are stood in for."""
    from infinitrain import accelerator, backends

    slot = {"info": None}
    monkeypatch.setattr(backends, "available", lambda: ["alpha", "beta"])
    monkeypatch.setattr(_C, "privateuse1", lambda: slot["info"])
    monkeypatch.setattr(runtime, "device_count", {"alpha": 3, "beta": 2}.__getitem__)
    alpha, beta = accelerator.DeviceModule("alpha"), accelerator.DeviceModule("beta")
    assert (alpha.device_count(), beta.device_count()) == (3, 2)
    slot["info"] = {"name": "alpha", "autocast_dtype": "bfloat16"}
    assert (alpha.device_count(), beta.device_count()) == (3, 0)
    assert alpha.is_available() and not beta.is_available()
    assert accelerator.DeviceModule("gamma").device_count() == 0  # not built in


def test_device_module_grad_scaler_has_pytorchs_defaults():
    """it.cuda.amp.GradScaler() (any device module's) starts at 2**16 and, with PyTorch's defaults, doubles the
    scale after 2000 good steps (not 1999) and halves it after a skipped one."""
    import infinitrain as it

    scaler = it.cuda.amp.GradScaler()
    assert scaler.get_scale() == 2.0**16
    for _ in range(1999):
        scaler.update()
    assert scaler.get_scale() == 2.0**16
    scaler.update()
    assert scaler.get_scale() == 2.0**17
    w = it.nn.Parameter(it.zeros(2, device=DEVICE))
    w.grad = it.tensor([math.inf, 1.0], device=DEVICE)
    assert scaler.step(it.optim.SGD([w], lr=0.1)) is None  # skipped: the gradient overflowed
    scaler.update()
    assert scaler.get_scale() == 2.0**16
    np.testing.assert_array_equal(w.numpy(), 0.0)


@pytest.mark.skipif(TYPE == "cpu", reason="the cpu has one device")
def test_bad_device_index_raises():
    for call in (
        lambda: _C.empty([2], "float32", f"{TYPE}:{NDEV}"),
        lambda: runtime.memory_stats(f"{TYPE}:{NDEV}"),
        lambda: _C.Stream(f"{TYPE}:{NDEV + 3}"),
        lambda: runtime.synchronize(f"{TYPE}:{NDEV}"),
    ):
        with pytest.raises(ValueError, match=rf"{TYPE}:\d+ does not exist: {TYPE} has {NDEV} device"):
            call()


@pytest.mark.skipif(NDEV < 2, reason="needs two devices")
def test_copy_between_devices():
    a = np.random.default_rng().standard_normal((33, 17))
    x = to_device(a, "float64", DEVICES[0])
    y = x.to(DEVICES[1])
    assert y.device == DEVICES[1]
    np.testing.assert_array_equal(y.numpy(), a)
    (z,) = op("affine", [y], [2.0, 1.0])
    np.testing.assert_array_equal(z.to(DEVICES[0]).numpy(), 2.0 * a + 1.0)


# ---- streams and events ----


def test_stream_waits_for_event_on_another_stream():
    gen = np.random.default_rng()
    n, k = 192, 24
    a = gen.standard_normal((n, n))
    ws = [gen.standard_normal((n, n)) / np.sqrt(n) for _ in range(k)]
    x, wt = to_device(a, "float64"), [to_device(w, "float64") for w in ws]
    runtime.synchronize(DEV)  # the uploads ran on the default stream: they land before another stream reads them
    sa, sb = runtime.Stream(DEV), runtime.Stream(DEV)
    done = runtime.Event(DEV)
    with runtime.stream(sa):
        y = _chain(x, wt)  # long work on stream A
        done.record()
    sb.wait_event(done)
    with runtime.stream(sb):
        (z,) = op("affine", [y], [3.0, -1.0])  # reads A's result on B
    sb.synchronize()
    expected = a
    for w in ws:
        expected = expected @ w
    np.testing.assert_allclose(z.numpy(), 3.0 * expected - 1.0, rtol=1e-9, atol=1e-9)
    assert done.query()


def test_event_elapsed_time_grows():
    gen = np.random.default_rng()
    n = 128
    x = to_device(gen.standard_normal((n, n)), "float64")
    ws = [to_device(gen.standard_normal((n, n)) / np.sqrt(n), "float64") for _ in range(8)]
    s = runtime.Stream(DEV)
    events = [runtime.Event(DEV) for _ in range(3)]
    t0 = time.perf_counter()
    with runtime.stream(s):
        events[0].record()
        y = _chain(x, ws)
        events[1].record()
        _chain(y, ws)
        events[2].record(s)
    events[2].synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    assert all(e.query() for e in events)
    first, second, both = (events[a].elapsed_ms(events[b]) for a, b in ((0, 1), (1, 2), (0, 2)))
    # Each stretch is 8 products of 128 x 128 (33 MFLOP, milliseconds): measured, not 0, and no longer than
    # the host saw; the intervals add up.
    assert 0 < first < both and 0 < second < both
    assert both <= wall_ms + 0.01, (both, wall_ms)
    assert abs(first + second - both) <= 1e-3 * both + 1e-3, (first, second, both)


@sim_only
def test_elapsed_needs_recorded_events():
    a, b = runtime.Event(DEV), runtime.Event(DEV)
    assert a.query()  # nothing recorded: nothing pending
    b.record()
    b.synchronize()
    with pytest.raises(RuntimeError, match="never recorded"):
        a.elapsed_ms(b)


@sim_only
def test_stream_and_event_reject_other_devices():
    if NDEV < 2:
        pytest.skip("needs two devices")
    s, e = runtime.Stream("sim:0"), runtime.Event("sim:1")
    with pytest.raises(ValueError, match="different devices"):
        s.wait_event(e)
    with pytest.raises(ValueError, match="belongs to"):
        e.record(s)


def test_streams_come_from_a_pool_and_stay_valid():
    streams = [runtime.Stream(DEV) for _ in range(40)]
    assert 1 <= len(set(streams)) <= 32  # handed out in turn, never destroyed
    assert all(not s.is_default for s in streams) or TYPE == "cpu"
    x = to_device(np.arange(4.0), "float64")
    s = streams[3]
    runtime.synchronize(DEV)  # the uploads ran on the default stream: they land before another stream reads them
    del streams
    gc.collect()
    with runtime.stream(s):
        (y,) = op("neg", [x])
    s.synchronize()
    np.testing.assert_array_equal(y.numpy(), -np.arange(4.0))


def test_stream_synchronize_and_default_stream():
    a = np.arange(12.0).reshape(3, 4)
    s = runtime.Stream(DEV)
    with runtime.stream(s):
        assert runtime.current_stream(DEV) is not None
        (y,) = op("neg", [to_device(a, "float64")])
    s.synchronize()
    runtime.default_stream(DEV).synchronize()
    np.testing.assert_array_equal(y.numpy(), -a)


# ---- allocator ----


def test_allocator_statistics():
    _settle()
    base = runtime.memory_stats(DEV)
    t = _C.empty([1024], "float32", DEV)  # 4096 bytes: a multiple of every runtime's rounding
    s = runtime.memory_stats(DEV)
    assert s["allocated"] == base["allocated"] + 4096
    assert s["num_allocs"] == base["num_allocs"] + 1
    assert s["reserved"] >= s["allocated"]
    assert s["peak_allocated"] >= s["allocated"]
    del t
    _settle()
    assert runtime.memory_allocated(DEV) == base["allocated"]

    runtime.reset_peak_memory_stats(DEV)
    assert runtime.max_memory_allocated(DEV) == base["allocated"]
    big = _C.empty([3 << 20], "uint8", DEV)
    peak = runtime.max_memory_allocated(DEV)
    assert peak >= base["allocated"] + (3 << 20)
    del big
    _settle()
    assert runtime.max_memory_allocated(DEV) == peak  # the peak stays until reset
    runtime.reset_peak_memory_stats(DEV)
    assert runtime.max_memory_allocated(DEV) == runtime.memory_allocated(DEV) == base["allocated"]


def _consistent(stats):
    assert stats["reserved"] == stats["allocated"] + stats["cached"] + stats["pending"], stats
    assert stats["peak_allocated"] >= stats["allocated"] and stats["peak_reserved"] >= stats["reserved"], stats


def test_allocator_rounds_and_caches():
    _settle()
    base = runtime.memory_stats(DEV)
    t = _C.empty([1], "float32", DEV)
    assert runtime.memory_allocated(DEV) == base["allocated"] + 512  # rounded up to 512 bytes
    z = _C.empty([0], "float32", DEV)  # empty tensors still get a distinct block
    assert z.data_ptr != t.data_ptr
    assert runtime.memory_allocated(DEV) == base["allocated"] + 1024
    _consistent(runtime.memory_stats(DEV))
    del t, z
    _settle()
    reserved = runtime.memory_stats(DEV)["reserved"]
    for _ in range(20):  # freed blocks come back from the cache
        u = _C.empty([5 << 18], "float32", DEV)
        del u
    after = runtime.memory_stats(DEV)
    assert after["reserved"] <= reserved + (20 << 20)  # at most one new segment
    assert after["allocated"] == base["allocated"]
    _consistent(after)


def test_empty_cache_returns_unused_segments():
    _settle()
    big = _C.empty([12 << 20], "uint8", DEV)  # a segment of its own
    del big
    _settle()
    before = runtime.memory_stats(DEV)
    assert before["cached"] >= 12 << 20
    runtime.empty_cache(DEV)
    after = runtime.memory_stats(DEV)
    assert after["reserved"] <= before["reserved"] - (12 << 20)
    assert after["allocated"] == before["allocated"]
    _consistent(after)


def test_block_freed_on_its_stream_is_reused_at_once():
    """Stream-ordered reuse: later work on the same stream runs after every earlier use of the block."""
    _settle()
    s = runtime.Stream(DEV)
    with runtime.stream(s):
        a = _C.empty([3 << 18], "float32", DEV)
        addr = a.data_ptr
        del a
        b = _C.empty([3 << 18], "float32", DEV)
        assert b.data_ptr == addr


@pytest.mark.skipif(TYPE == "cpu", reason="cpu streams run work at once")
def test_block_used_on_another_stream_waits_for_it():
    """A block that a kernel on another stream reads is not handed out before that kernel ran; the
    dispatcher records the use, and the freed block waits for an event on that stream."""
    gen = np.random.default_rng()
    n = 256
    x = to_device(gen.standard_normal((n, n)), "float64")
    ws = [to_device(gen.standard_normal((n, n)) / np.sqrt(n), "float64") for _ in range(40)]
    a_host = gen.standard_normal((n, n))
    a = to_device(a_host, "float64")  # allocated on the default stream
    runtime.synchronize(DEV)  # the uploads ran on the default stream: they land before another stream reads them
    s, passed = runtime.Stream(DEV), runtime.Event(DEV)
    with runtime.stream(s):
        y = _chain(x, ws)  # keeps stream s busy for a while
        (z,) = op("add", [y, a])  # reads `a` on s, after the chain
        passed.record()
    addr = a.data_ptr
    del a  # freed while s may not have read it yet
    again = _C.empty([n * n], "float64", DEV)
    if not passed.query():  # s was still busy: the block must not be handed out
        assert again.data_ptr != addr
    op("fill_", [again], [7.0])  # on the default stream, at once: would overwrite `a` if it were reused
    s.synchronize()
    expected = a_host + np.linalg.multi_dot([x.numpy()] + [w.numpy() for w in ws])
    np.testing.assert_allclose(z.numpy(), expected, rtol=1e-9, atol=1e-9)
    _settle()
    assert runtime.memory_stats(DEV)["pending"] == 0


def test_threads_allocate_copy_compute_and_free():
    """8 threads at once, each on its own device and stream: results match NumPy and nothing leaks."""
    _settle()
    for d in DEVICES:
        _settle(d)
    start = {d: runtime.memory_allocated(d) for d in DEVICES}
    errors = []

    def work(i):
        try:
            dev = DEVICES[i % len(DEVICES)]
            gen = np.random.default_rng(i)
            s = runtime.Stream(dev)
            with runtime.stream(s):
                for it in range(6):
                    a = gen.standard_normal((24 + i, 16))
                    b = gen.standard_normal((16, 8 + it))
                    ta, tb = to_device(a, "float64", dev), to_device(b, "float64", dev)
                    (c,) = op("matmul", [ta, tb], [0, 0])
                    (d,) = op("relu", [c])
                    (e,) = op("add", [d, c])
                    (f,) = op("sum", [e], [[1], 0])
                    ref = a @ b
                    np.testing.assert_allclose(f.numpy(), (np.maximum(ref, 0) + ref).sum(1), rtol=1e-12, atol=1e-12)
                    del ta, tb, c, d, e, f
            s.synchronize()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    for d in DEVICES:
        _settle(d)
        assert runtime.memory_allocated(d) == start[d], f"{d} leaked"


# ---- errors ----


def test_kernel_error_surfaces_by_the_next_synchronize():
    w = to_device(np.ones((4, 3)), "float32")
    idx = to_device(np.array([0, 7]), "int64")
    with pytest.raises(IndexError, match="out of range"):
        op("embedding", [w, idx])
        runtime.synchronize(DEV)
    runtime.synchronize(DEV)  # reported once
    (ok,) = op("embedding", [w, to_device(np.array([3, 1]), "int64")])
    np.testing.assert_array_equal(ok.numpy(), np.ones((2, 3), np.float32))


@sim_only
def test_async_error_is_sticky_until_raised_with_its_type():
    w = to_device(np.ones((4, 3)), "float32")
    bad = to_device(np.array([5]), "int64")
    runtime.synchronize(DEV)  # the uploads ran on the default stream: s must not read `bad` before they land
    s = runtime.Stream(DEV)
    with runtime.stream(s):
        op("embedding", [w, bad])  # returns at once: the kernel runs later on the stream
    with pytest.raises(IndexError, match="out of range"):
        s.synchronize()
    s.synchronize()
    op("embedding", [w, bad])
    with pytest.raises(IndexError):
        w.numpy()  # a synchronous copy is a synchronisation point too
    assert w.numpy().shape == (4, 3)


@pytest.mark.skipif(TYPE == "cpu", reason="the cpu raises kernel errors as they happen")
def test_async_error_is_not_lost_when_the_allocator_waits_for_its_blocks():
    """The allocator synchronises with the events of blocks other streams used (empty_cache, an out-of-memory
    retry); that synchronisation hands over the device's pending error, which it once dropped."""
    w = to_device(np.ones((4, 3)), "float32")
    bad = to_device(np.array([5]), "int64")
    x = to_device(np.ones(1 << 16), "float32")
    runtime.synchronize(DEV)  # the uploads ran on the default stream: they land before another stream reads them
    s = runtime.Stream(DEV)
    with runtime.stream(s):
        op("embedding", [w, bad])  # fails later, on the stream
        op("neg", [x])  # x, allocated on the default stream, is used on s
    del x  # its block waits for s's event
    with pytest.raises(IndexError, match="embedding: index 5 out of range"):
        runtime.empty_cache(DEV)
        runtime.synchronize(DEV)


@sim_only
def test_host_access_to_device_memory_faults():
    proc = _subprocess("""
        import ctypes
        import infinitrain.backends
        from infinitrain import _C
        infinitrain.backends.register("sim")
        t = _C.from_numpy(__import__("numpy").ones(256, "float32"), "float32", "sim:0")
        assert t.numpy().sum() == 256  # the runtime's own copies work
        print("reading", hex(t.data_ptr), flush=True)
        ctypes.c_float.from_address(t.data_ptr).value
        print("no fault")
    """)
    assert "reading" in proc.stdout, proc.stderr
    assert "no fault" not in proc.stdout
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr)


@sim_only
def test_bad_device_count_setting_errors_at_first_use():
    proc = _subprocess(
        """
        import infinitrain.backends
        from infinitrain import _C
        infinitrain.backends.register("sim")  # registration touches no device
        try:
            _C.device_count("sim")
        except ValueError as e:
            print("error:", e)
        """,
        INFINITRAIN_SIM_DEVICES="many",
    )
    assert proc.returncode == 0, proc.stderr
    assert "error:" in proc.stdout and "INFINITRAIN_SIM_DEVICES" in proc.stdout, proc.stdout


@sim_only
def test_skip_ops_setting_leaves_ops_to_the_cpu_fallback():
    proc = _subprocess(
        """
        import numpy as np
        import infinitrain.backends
        from infinitrain import _C
        infinitrain.backends.register("sim")
        print(_C.op("relu").has_kernel("sim"), _C.op("gelu_tanh").has_kernel("sim"), _C.op("add").has_kernel("sim"))
        x = _C.from_numpy(np.array([-1.0, 2.0]), "float64", "sim:1")
        try:
            _C.op("relu")([x], [])
        except NotImplementedError:
            print("missing")
        infinitrain.backends.set_cpu_fallback("sim", True)
        (y,) = _C.op("relu")([x], [])
        print(y.device, y.numpy().tolist())
        """,
        INFINITRAIN_SIM_SKIP_OPS="relu, gelu_tanh",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False False True", "missing", "sim:1 [0.0, 2.0]"], proc.stdout
    assert "CPU fallback" in proc.stderr  # warned once


# ---- sim capacity, out-of-memory retry, kernel errors on the stream worker ----


@sim_only
def test_out_of_memory_retries_after_emptying_the_cache_then_raises_with_statistics():
    """64 MiB of sim memory: a 40 MiB block cached for a side stream is returned by the allocator's retry when the
    default stream needs 40 MiB; 100 MiB then fails with it.OutOfMemoryError naming the device and its statistics."""
    proc = _subprocess(
        """
        import infinitrain as it
        import infinitrain_sim
        from infinitrain import _C, runtime
        MiB = 1 << 20
        it.backends.register("sim")
        assert infinitrain_sim.memory_capacity() == 64 * MiB
        s = runtime.Stream("sim:0")
        with runtime.stream(s):
            a = _C.empty([10 * MiB], "float32", "sim:0")  # 40 MiB, a segment of its own, for stream s
            _C.op("fill_")([a], [1.0])  # used on the side stream
        del a  # free again, cached for s only
        st = runtime.memory_stats("sim:0")
        assert st["allocated"] == 0 and st["reserved"] == st["cached"] == 40 * MiB, st
        b = _C.empty([10 * MiB], "float32", "sim:0")  # 40 more MiB on the default stream do not fit beside it
        st = runtime.memory_stats("sim:0")
        assert st["allocated"] == st["reserved"] == 40 * MiB and st["num_ooms"] == 0, st  # a's segment went back
        _C.op("fill_")([b], [2.0])
        assert b.numpy()[::MiB].tolist() == [2.0] * 10
        try:
            _C.empty([25 * MiB], "float32", "sim:0")  # 100 MiB
        except it.OutOfMemoryError as e:
            assert isinstance(e, MemoryError)
            print("error:", e)
        else:
            raise AssertionError("allocated 100 MiB on a 64 MiB device")
        st = runtime.memory_stats("sim:0")
        assert st["num_ooms"] == 1 and st["allocated"] == 40 * MiB, st
        """,
        INFINITRAIN_SIM_MEMORY="64M",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("error:")]
    assert "sim:0: out of memory allocating 104857600 bytes" in line, line
    assert "40.0 MiB allocated" in line and "40.0 MiB reserved" in line, line  # the statistics


@sim_only
def test_default_capacity_is_the_hosts_memory_shared_by_the_devices():
    """Without INFINITRAIN_SIM_MEMORY each device may map min(16 GiB, physical memory / device count), so a run
    that fits the sim fits the host; once each device had 16 GiB whatever the host had."""
    proc = _subprocess(
        """
        import os
        import infinitrain as it
        import infinitrain_sim
        from infinitrain import _C
        it.backends.register("sim")
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        expected = min(16 << 30, physical // 64)
        assert infinitrain_sim.memory_capacity() == expected, (infinitrain_sim.memory_capacity(), expected)
        try:
            _C.empty([expected + (2 << 20)], "uint8", "sim:3")  # mapped lazily: beyond the capacity it must fail
        except it.OutOfMemoryError as e:
            assert "sim:3: out of memory" in str(e), e
        else:
            raise AssertionError("allocated more than the capacity")
        x = _C.empty([expected // 2], "uint8", "sim:3")
        print("ok")
        """,
        INFINITRAIN_SIM_DEVICES="64",
        INFINITRAIN_SIM_MEMORY="",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["ok"]


@sim_only
def test_errors_from_the_stream_worker_name_the_op_and_keep_their_type():
    """A kernel's error surfaces at a later synchronisation, away from the call: it starts with the op's name and
    device, and keeps its type (IndexError, ValueError)."""
    index = DEV.split(":")[1]
    w = to_device(np.ones((4, 3)), "float32")
    y = to_device(np.ones((4, 3)), "float32")
    weights = to_device(np.ones((2, 2)), "float32")
    bad_index = to_device(np.array([5]), "int64")
    bad_source = to_device(np.array([0, 0, 1, 2]), "int64")
    runtime.synchronize(DEV)
    s = runtime.Stream(DEV)
    for name, inputs, error, message in [
        ("embedding", [w, bad_index], IndexError, "embedding: index 5 out of range"),
        ("moe_unpermute", [y, bad_source, weights], ValueError, r"moe_unpermute: source must be a permutation"),
    ]:
        with runtime.stream(s):
            op(name, inputs)  # returns at once: the kernel fails later, on the stream's worker
        with pytest.raises(error, match=rf"^{name} on sim:{index}: {message}"):
            s.synchronize()
    s.synchronize()  # reported once
