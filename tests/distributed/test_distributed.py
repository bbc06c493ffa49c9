"""Collectives (infinitrain.distributed) on the device under test, checked exactly against NumPy.

Inputs are nonzero integers small enough that every reduction is exact in every
dtype (bfloat16 included), so results compare with equality.
"""

import threading

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, rng
from infinitrain import _C, backends, runtime
from infinitrain.distributed import comm as dist

TYPE = DEVICE.split(":")[0]
if TYPE == "cpu" and "sim" in backends.available():
    # The cpu has no collectives: the cpu suite runs them on the simulated devices (tests/BUILD.bazel builds them in).
    backends.register("sim")
    TYPE = "sim"
# Skips each test rather than the module: a module with no tests fails under Bazel (pytest exit code 5).
pytestmark = pytest.mark.skipif(not _C.has_ccl(TYPE), reason=f"device type '{TYPE}' has no collective library")

NDEV = runtime.device_count(TYPE)
SIZES = [pytest.param(n, marks=pytest.mark.skipif(n > NDEV, reason=f"{NDEV} {TYPE} devices")) for n in (1, 2, 4)]
OPS = ("sum", "avg", "max", "min", "prod")
DTYPES = ("float32", "float64", "int64")
# Every op on every dtype, plus bfloat16 sums.
OP_DTYPES = [(op, dt) for op in OPS for dt in DTYPES] + [("sum", "bfloat16")]
ALL_DTYPES = DTYPES + ("bfloat16",)
SIM = TYPE == "sim"


def devices(n):
    return [f"{TYPE}:{i}" for i in range(n)]


def sample(shape, op="sum", dtype="float32"):
    """Nonzero integers: |x| <= 3 for prod (4-rank products stay small), <= 8 for bfloat16, else <= 100."""
    g = rng()
    hi = 3 if op == "prod" else 8 if dtype == "bfloat16" else 100
    return (g.integers(1, hi + 1, shape) * g.choice([-1, 1], shape)).astype(np.float64)


def on(a, dtype, device):
    return it.from_numpy(a, dtype=dtype, device=device)


def reference(op, xs, dtype):
    s = np.stack(xs)
    if op == "sum":
        return s.sum(0)
    if op == "prod":
        return s.prod(0)
    if op == "max":
        return s.max(0)
    if op == "min":
        return s.min(0)
    mean = s.sum(0) / len(xs)
    # Integer averages truncate toward zero.
    return np.trunc(mean) if dtype in ("int32", "int64") else mean


def check(t, expected, what=""):
    got = t.numpy().astype(np.float64)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float64), err_msg=what)


def sentinel(dtype):
    return float("nan") if dtype in ("float32", "float64", "bfloat16") else -12345


def setup(n, shape, op="sum", dtype="float32"):
    comms = dist.init_all(devices(n))
    xs = [sample(shape, op, dtype) for _ in range(n)]
    ts = [on(x, dtype, c.device) for x, c in zip(xs, comms, strict=True)]
    return comms, xs, ts


def run_threads(fns):
    """Runs each fn on its own thread; re-raises the first failure."""
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (reported on the main thread)
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(f,), daemon=True) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)  # a rank that never meets its peers fails the test instead of hanging it
    hung = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not hung, f"threads {hung} still running after 120 s"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- every collective


def test_communicators():
    comms = dist.init_all(devices(min(2, NDEV)))
    assert [c.rank for c in comms] == list(range(len(comms)))
    assert all(c.size == len(comms) for c in comms)
    assert [c.device for c in comms] == devices(len(comms))
    assert all(c.async_error() == "" for c in comms)
    a, b = dist.unique_id(TYPE), dist.unique_id(TYPE)
    assert isinstance(a, bytes) and len(a) == 128 and a != b


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op,dtype", OP_DTYPES)
def test_all_reduce(n, op, dtype):
    comms, xs, ts = setup(n, (3, 17), op, dtype)
    for c, t in zip(comms, ts, strict=True):
        assert dist.all_reduce(c, t, op) is t
    want = reference(op, xs, dtype)
    for r, t in enumerate(ts):
        check(t, want, f"rank {r}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("last_root", [False, True])
def test_broadcast(n, dtype, last_root):
    root = n - 1 if last_root else 0
    comms, xs, ts = setup(n, (5, 7), dtype=dtype)
    for c, t in zip(comms, ts, strict=True):
        dist.broadcast(c, t, root)
    for r, t in enumerate(ts):
        check(t, xs[root], f"rank {r}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op,dtype", OP_DTYPES)
def test_reduce(n, op, dtype):
    root = n - 1
    comms, xs, ts = setup(n, (4, 9), op, dtype)
    for c, t in zip(comms, ts, strict=True):
        dist.reduce(c, t, op, root)
    for r, t in enumerate(ts):
        # Only the root's tensor changes.
        check(t, reference(op, xs, dtype) if r == root else xs[r], f"rank {r}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_all_gather(n, dtype):
    comms, xs, ts = setup(n, (3, 5), dtype=dtype)
    outs = [dist.all_gather(c, t) for c, t in zip(comms, ts, strict=True)]
    for r, (o, t) in enumerate(zip(outs, ts, strict=True)):
        assert o.shape == (n, 3, 5) and o.dtype == dtype and o.device == comms[r].device
        check(o, np.stack(xs), f"rank {r}")
        check(t, xs[r], f"rank {r} input")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("op,dtype", OP_DTYPES)
def test_reduce_scatter(n, op, dtype):
    comms, xs, ts = setup(n, (3 * n, 2), op, dtype)
    outs = [dist.reduce_scatter(c, t, op) for c, t in zip(comms, ts, strict=True)]
    want = reference(op, xs, dtype)
    for r, o in enumerate(outs):
        assert o.shape == (3, 2) and o.dtype == dtype
        check(o, want[3 * r : 3 * (r + 1)], f"rank {r}")


# ---------------------------------------------------------------- in place and out of place

KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_out_of_place(n, kind, dtype):
    """Distinct send and receive buffers (the binding's raw form): the send buffers stay intact."""
    op, root, m = "max", n - 1, 6
    comms = dist.init_all(devices(n))
    send_shape = (n * m,) if kind == "reduce_scatter" else (m,)
    recv_shape = {"all_gather": (n * m,), "reduce_scatter": (m,)}.get(kind, (m,))
    xs = [sample(send_shape, op, dtype) for _ in range(n)]
    sends = [on(x, dtype, c.device) for x, c in zip(xs, comms, strict=True)]
    recvs = [it.full(recv_shape, sentinel(dtype), dtype=dtype, device=c.device) for c in comms]
    with dist.group():
        for c, s, v in zip(comms, sends, recvs, strict=True):
            if kind == "all_reduce":
                c.all_reduce(s._t, v._t, op)
            elif kind == "broadcast":
                c.broadcast(s._t, v._t, root)
            elif kind == "reduce":
                c.reduce(s._t, v._t, op, root)
            elif kind == "all_gather":
                c.all_gather(s._t, v._t)
            else:
                c.reduce_scatter(s._t, v._t, op)
    red = reference(op, xs, dtype)
    for r, (s, v) in enumerate(zip(sends, recvs, strict=True)):
        check(s, xs[r], f"rank {r} send")
        if kind == "all_reduce":
            check(v, red, f"rank {r}")
        elif kind == "broadcast":
            check(v, xs[root], f"rank {r}")
        elif kind == "reduce":
            if r == root:
                check(v, red, "root")
            else:  # untouched
                check(v, np.full(recv_shape, sentinel(dtype)), f"rank {r}")
        elif kind == "all_gather":
            check(v, np.concatenate(xs), f"rank {r}")
        else:
            check(v, red[m * r : m * (r + 1)], f"rank {r}")


@pytest.mark.parametrize("n", SIZES)
def test_in_place_large(n):
    """In-place all-reduce over more data than a cache line or page: no rank reads a peer's half-written output."""
    comms, xs, ts = setup(n, (257, 1031))
    for c, t in zip(comms, ts, strict=True):
        dist.all_reduce(c, t, "sum")
    for t in ts:
        check(t, np.sum(xs, 0))


@pytest.mark.parametrize("n", SIZES)
def test_empty_tensors(n):
    comms, _, ts = setup(n, (0, 3))
    for c, t in zip(comms, ts, strict=True):
        dist.all_reduce(c, t)
    outs = [dist.all_gather(c, t) for c, t in zip(comms, ts, strict=True)]
    assert all(o.shape == (n, 0, 3) and o.numpy().size == 0 for o in outs)


# ---------------------------------------------------------------- how collectives are issued


@pytest.mark.parametrize("n", SIZES)
def test_one_thread_in_group(n):
    comms, xs, ts = setup(n, (8, 3))
    with dist.group():
        for c, t in zip(comms, ts, strict=True):
            dist.all_reduce(c, t, "sum")
        outs = [dist.all_gather(c, t) for c, t in zip(comms, ts, strict=True)]
    total = np.sum(xs, 0)
    for t, o in zip(ts, outs, strict=True):
        check(t, total)
        check(o, np.stack([total] * n))


@pytest.mark.parametrize("n", SIZES)
def test_one_thread_per_device(n):
    comms, xs, ts = setup(n, (8, 3))
    outs = [None] * n

    def rank(r):
        def go():
            dist.all_reduce(comms[r], ts[r], "min")
            outs[r] = dist.reduce_scatter(comms[r], ts[r].reshape(24, 1), "sum")

        return go

    # Threads only issue; results are read after they joined (a blocking read
    # holding the GIL would keep the other threads from issuing their part).
    run_threads([rank(r) for r in range(n)])
    k = 24 // n
    for r, t in enumerate(ts):
        check(t, np.min(xs, 0))
        check(outs[r], (np.min(xs, 0).reshape(24, 1) * n)[k * r : k * (r + 1)])


@pytest.mark.parametrize("n", SIZES)
def test_nested_groups(n):
    comms, xs, ts = setup(n, (5,))
    with dist.group():
        with dist.group():
            for c, t in zip(comms, ts, strict=True):
                dist.all_reduce(c, t, "max")
    for t in ts:
        check(t, np.max(xs, 0))


@pytest.mark.parametrize("n", SIZES)
def test_back_to_back(n):
    """Several collectives in a row on the same buffers: each sees the previous one's result."""
    comms, xs, ts = setup(n, (6, 4))
    for c, t in zip(comms, ts, strict=True):
        dist.all_reduce(c, t, "sum")
    for c, t in zip(comms, ts, strict=True):
        dist.all_reduce(c, t, "sum")
    for c, t in zip(comms, ts, strict=True):
        dist.broadcast(c, t, n - 1)
    outs = [dist.all_gather(c, t) for c, t in zip(comms, ts, strict=True)]
    want = np.sum(xs, 0) * n
    for t, o in zip(ts, outs, strict=True):
        check(t, want)
        check(o, np.stack([want] * n))


def test_groups_and_streams_do_not_mix():
    """Two groups over the same devices, issued in different orders on different streams.

    Rank 0 issues group a then group b on its default stream; rank 1 issues b
    on a side stream before a on its default stream. Each call must meet only
    its own group's calls.
    """
    n = min(2, NDEV)
    a, b = dist.init_all(devices(n)), dist.init_all(devices(n))
    xa = [sample((7,)) for _ in range(n)]
    xb = [sample((7,)) for _ in range(n)]
    ta = [on(x, "float32", c.device) for x, c in zip(xa, a, strict=True)]
    tb = [on(x, "float32", c.device) for x, c in zip(xb, b, strict=True)]
    for d in devices(n):
        runtime.synchronize(d)  # inputs were written on the default stream
    side = [runtime.Stream(d) for d in devices(n)]
    for r in range(n):
        if r % 2 == 0:
            dist.all_reduce(a[r], ta[r], "sum")
            dist.all_reduce(b[r], tb[r], "max")
        else:
            with runtime.stream(side[r]):
                dist.all_reduce(b[r], tb[r], "max")
            dist.all_reduce(a[r], ta[r], "sum")
    for s in side:
        s.synchronize()
    for t in ta:
        check(t, np.sum(xa, 0))
    for t in tb:
        check(t, np.max(xb, 0))


@pytest.mark.parametrize("n", SIZES)
def test_non_default_stream(n):
    comms, xs, ts = setup(n, (9, 2), "prod")
    for d in devices(n):
        runtime.synchronize(d)  # inputs were written on the default stream
    streams = [runtime.Stream(d) for d in devices(n)]
    for c, t, s in zip(comms, ts, streams, strict=True):
        with runtime.stream(s):
            dist.all_reduce(c, t, "prod")
    for s in streams:
        s.synchronize()
    for t in ts:
        check(t, np.prod(xs, 0))


@pytest.mark.parametrize("n", SIZES)
def test_init_rank(n):
    uid = dist.unique_id(TYPE)
    comms = [None] * n
    xs = [sample((10,)) for _ in range(n)]
    results = [None] * n

    def rank(r):
        def go():
            comms[r] = dist.init_rank(uid, n, r, f"{TYPE}:{r}")
            t = on(xs[r], "float64", comms[r].device)
            dist.all_reduce(comms[r], t, "sum")
            results[r] = t

        return go

    run_threads([rank(r) for r in range(n)])
    assert [c.rank for c in comms] == list(range(n))
    assert all(c.size == n for c in comms)
    for t in results:
        check(t, np.sum(xs, 0))


# ---------------------------------------------------------------- send / recv


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16"])
def test_send_recv_ring(n, threads, dtype):
    """Rank r sends to r+1 and receives from r-1 (one rank sends to itself)."""
    comms, xs, ts = setup(n, (4, 3), dtype=dtype)
    bufs = [it.full((4, 3), sentinel(dtype), dtype=dtype, device=c.device) for c in comms]

    def rank(r):
        def go():
            dist.send(comms[r], ts[r], (r + 1) % n)
            dist.recv(comms[r], bufs[r], (r - 1) % n)

        return go

    def grouped(fn):
        # One thread per rank: each rank groups its own send and recv, as NCCL-like libraries need.
        def go():
            with dist.group():
                fn()

        return go

    if threads:
        run_threads([grouped(rank(r)) for r in range(n)])
    else:
        with dist.group():
            for r in range(n):
                rank(r)()
    for r in range(n):
        check(bufs[r], xs[(r - 1) % n], f"rank {r}")
        check(ts[r], xs[r], f"rank {r} send buffer")


def test_send_recv_order():
    """Several messages between one pair arrive in the order sent."""
    n = min(2, NDEV)
    comms = dist.init_all(devices(n))
    xs = [sample((3,)) for _ in range(3)]
    src, dst = comms[0], comms[n - 1]
    bufs = [it.zeros(3, device=dst.device) for _ in xs]
    with dist.group():
        for x in xs:
            dist.send(src, on(x, "float32", src.device), dst.rank)
        for b in bufs:
            dist.recv(dst, b, src.rank)
    for b, x in zip(bufs, xs, strict=True):
        check(b, x)


# ---------------------------------------------------------------- errors


def drain(devs, match):
    """Each device's asynchronous error surfaces at its next synchronisation."""
    for d in devs:
        with pytest.raises(RuntimeError, match=match):
            runtime.synchronize(d)


def test_bad_arguments():
    n = min(2, NDEV)
    comms = dist.init_all(devices(n))
    c = comms[0]
    t = on(sample((3,)), "float32", c.device)
    if n > 1:
        with pytest.raises(ValueError, match="divisible"):
            dist.reduce_scatter(c, on(sample((2 * n + 1,)), "float32", c.device), "sum")
    with pytest.raises(ValueError, match="divisible"):
        dist.reduce_scatter(c, on(np.float64(2.0), "float32", c.device), "sum")
    with pytest.raises(ValueError, match="unknown reduce op"):
        dist.all_reduce(c, t, "mean")
    with pytest.raises(ValueError, match="out of range"):
        dist.broadcast(c, t, n)
    with pytest.raises(ValueError, match="out of range"):
        dist.send(c, t, -1)
    with pytest.raises(ValueError, match="bool"):
        dist.all_reduce(c, it.from_numpy(np.array([True, False]), device=c.device))
    with pytest.raises(ValueError, match="Tensor"):
        dist.all_reduce(c, np.zeros(3))
    with pytest.raises(ValueError, match="is on cpu"):
        dist.all_reduce(c, it.zeros(3))
    if n > 1:
        with pytest.raises(ValueError, match=f"is on {comms[1].device}"):
            dist.all_reduce(c, on(sample((3,)), "float32", comms[1].device))
    # The raw binding checks buffer sizes and dtypes too.
    with pytest.raises(ValueError, match="sizes do not match"):
        c.all_reduce(t._t, it.zeros(4, device=c.device)._t, "sum")
    with pytest.raises(ValueError, match="one dtype"):
        c.all_reduce(t._t, it.zeros(3, dtype="float64", device=c.device)._t, "sum")
    with pytest.raises(ValueError, match="distinct"):
        dist.init_all([c.device, c.device])
    with pytest.raises(ValueError, match="rank"):
        dist.init_rank(dist.unique_id(TYPE), 2, 2, c.device)
    # Nothing was enqueued: the communicators still work.
    for cc in comms:
        dist.all_reduce(cc, on(np.ones(2), "float32", cc.device))
    assert all(cc.async_error() == "" for cc in comms)


@pytest.mark.skipif(not SIM, reason="which dtypes reduce is provider-specific")
def test_unsupported_reduce_dtype():
    c = dist.init_all(devices(1))[0]
    with pytest.raises(ValueError, match="cannot reduce uint8"):
        dist.all_reduce(c, it.from_numpy(np.arange(4, dtype=np.uint8), device=c.device))
    # Moving data needs no arithmetic: any dtype broadcasts.
    t = it.from_numpy(np.arange(4, dtype=np.uint8), device=c.device)
    check(dist.broadcast(c, t, 0), np.arange(4))


@pytest.mark.skipif(NDEV < 2, reason="needs 2 devices")
def test_mismatched_sizes_across_ranks():
    """Ranks that disagree on a collective's size fail on every rank, at the next sync and in async_error()."""
    comms = dist.init_all(devices(2))
    a = on(sample((4,)), "float32", comms[0].device)
    b = on(sample((5,)), "float32", comms[1].device)
    dist.all_reduce(comms[0], a)
    dist.all_reduce(comms[1], b)
    drain(devices(2), "disagree")
    for c in comms:
        assert "disagree" in c.async_error() and "count=4" in c.async_error() and "count=5" in c.async_error()
    # The devices stay usable with a fresh group.
    fresh, xs, ts = setup(2, (3,))
    for c, t in zip(fresh, ts, strict=True):
        dist.all_reduce(c, t)
    for t in ts:
        check(t, np.sum(xs, 0))


@pytest.mark.skipif(NDEV < 2, reason="needs 2 devices")
def test_mismatched_recv_size():
    comms = dist.init_all(devices(2))
    dist.send(comms[0], on(sample((4,)), "float32", comms[0].device), 1)
    dist.recv(comms[1], it.zeros(6, device=comms[1].device), 0)
    drain([comms[1].device], "expected 6 float32 elements, the send has 4")
    runtime.synchronize(comms[0].device)  # the send itself completed
    assert "the send has 4" in comms[0].async_error() and "the send has 4" in comms[1].async_error()


@pytest.mark.skipif(not SIM or NDEV < 2, reason="the timeout setting is the sim's")
def test_timeouts(monkeypatch):
    monkeypatch.setenv("INFINITRAIN_SIM_CCL_TIMEOUT_S", "0.2")
    with pytest.raises(RuntimeError, match=r"timed out after 0.2 s waiting for rank\(s\) 1 to join"):
        dist.init_rank(dist.unique_id(TYPE), 2, 0, devices(1)[0])
    comms = dist.init_all(devices(2))
    # Rank 1 never joins this all-reduce.
    dist.all_reduce(comms[0], on(sample((3,)), "float32", comms[0].device))
    drain([comms[0].device], r"all_reduce #0 on rank 0 timed out after 0.2 s waiting for rank\(s\) 1")
    assert "timed out" in comms[0].async_error() and comms[1].async_error() == ""
    # A recv without a send.
    dist.recv(comms[1], it.zeros(3, device=comms[1].device), 0)
    drain([comms[1].device], "recv #0 on rank 1 from rank 0 timed out")


@pytest.mark.skipif(NDEV < 2, reason=f"{NDEV} {TYPE} devices")
def test_replica_gradients_average_what_some_replica_reached_and_leave_the_rest():
    """The in-process data-parallel average (the trainer's Local strategy): a parameter reached on one replica is
    averaged with zero from the other; one reached on none keeps no gradient (AdamW would move a zero one)."""
    from infinitrain.training.strategy import average_replica_gradients

    comms = dist.init_all(devices(2))
    g = [sample((3, 2)).astype(np.float32) for _ in range(3)]
    replicas = []
    for r, d in enumerate(devices(2)):
        params = [it.nn.Parameter(it.zeros((3, 2), device=d)) for _ in range(3)]
        params[0].grad = it.from_numpy(g[r], device=d)  # reached on both
        if r == 0:
            params[1].grad = it.from_numpy(g[2], device=d)  # reached on replica 0 only; params[2] on none
        replicas.append(params)
    average_replica_gradients(replicas, comms)
    for params in replicas:
        np.testing.assert_array_equal(params[0].grad.numpy(), (g[0] + g[1]) / 2)
        np.testing.assert_array_equal(params[1].grad.numpy(), g[2] / 2)
        assert params[2].grad is None
