"""Pinned host memory, non-blocking copies and the device loader that copies batches ahead on a side
stream. The ordering checks need an asynchronous device (sim, a GPU); on the cpu they skip."""

import numpy as np
import pytest

import infinitrain as it
from harness import DEVICE, to_device
from infinitrain import _C, runtime
from infinitrain.data import DataLoader
from infinitrain.data.device import DeviceLoader

DEV = runtime.parse_device(DEVICE)
ASYNC = not DEV.startswith("cpu")
needs_async = pytest.mark.skipif(not ASYNC, reason="needs an asynchronous device")


def _busy(stream, n=192, k=30):
    """Enqueues a long chain of matmuls on `stream`; returns the result (keep it alive)."""
    gen = np.random.default_rng()
    x = to_device(gen.standard_normal((n, n)), "float64")
    ws = [to_device(gen.standard_normal((n, n)) / np.sqrt(n), "float64") for _ in range(k)]
    with runtime.stream(stream):
        for w in ws:
            (x,) = _C.op("matmul")([x, w], [0, 0])
    return x


@needs_async
def test_pinned_memory():
    t = it.empty(3, 4, pin_memory=True)
    assert t.is_pinned() and t.device == "cpu"
    a = np.random.default_rng().standard_normal((5, 6))
    p = it.from_numpy(a).pin_memory()
    assert p.is_pinned() and not it.from_numpy(a).is_pinned()
    np.testing.assert_array_equal(p.numpy(), a)
    assert _C.pinned_memory_stats()["allocated"] > 0


def test_pin_memory_needs_a_cpu_tensor():
    if ASYNC:
        with pytest.raises(ValueError, match="only cpu tensors can be pinned"):
            _C.empty([2], "float32", DEV, True)


@needs_async
def test_non_blocking_copy_from_pinned_memory_reads_when_it_runs():
    """A non-blocking copy reads pinned memory when the stream gets to it; a blocking one before returning.
    The stream is held up by work long enough that the host writes before the copy runs (checked with an
    event; the work doubles until it is, since devices differ in speed)."""
    s = runtime.Stream(DEV)
    first, second = np.full(1000, 1.0), np.full(1000, 2.0)
    src = it.from_numpy(first, pin_memory=True)
    host = src._t.host_array()
    for n in (192, 512, 1024, 2048, 4096):
        host[:] = first.view(host.dtype)
        before_copy = runtime.Event(DEV)
        with runtime.stream(s):
            keep = _busy(s, n=n)
            before_copy.record()
            late = src.to(DEV, non_blocking=True)  # queued behind the matmuls
        busy = not before_copy.query()
        host[:] = second.view(host.dtype)
        s.synchronize()
        if busy:
            break
    assert busy, "the device finished the held-up work before the host wrote: make _busy longer"
    np.testing.assert_array_equal(late.numpy(), second)  # it read the new values
    host[:] = first.view(host.dtype)
    with runtime.stream(s):
        keep = _busy(s, n=n)
        done = src.to(DEV)  # blocking: finished before returning
        host[:] = second.view(host.dtype)
    s.synchronize()
    np.testing.assert_array_equal(done.numpy(), first)
    del keep


@needs_async
def test_pinned_source_freed_before_its_copy_runs_is_not_reused():
    """A non-blocking copy from pinned memory on the device's default stream, its source freed at once: the
    buffer must not be handed out again before the copy ran. (The pinned block belongs to the cpu's stream, whose
    handle is null like every default stream's, which once hid the use.)"""
    default = runtime.default_stream(DEV)
    a = np.random.default_rng().standard_normal(4096)
    for n in (192, 512, 1024, 2048, 4096):
        keep = _busy(default, n=n)
        before_copy = runtime.Event(DEV)
        with runtime.stream(default):
            before_copy.record()
            late = it.from_numpy(a, pin_memory=True).to(DEV, non_blocking=True)  # the source is freed here
        busy = not before_copy.query()
        again = it.empty(4096, dtype="float64", pin_memory=True)  # the freed block's size
        host = again._t.host_array()
        host[:] = np.full(4096, -1.0).view(host.dtype)
        runtime.synchronize(DEV)
        del keep
        if busy:
            break
    assert busy, "the device finished the held-up work before the host wrote: make _busy longer"
    np.testing.assert_array_equal(late.numpy(), a)


@needs_async
def test_non_blocking_copy_to_pinned_host_memory():
    a = np.random.default_rng().standard_normal((64, 9))
    x = to_device(a, "float64")
    h = it.Tensor(x).to("cpu", non_blocking=True)
    assert h.is_pinned()
    runtime.synchronize(DEV)
    np.testing.assert_array_equal(h.numpy(), a)


def _batches(n, shape, seed):
    gen = np.random.default_rng(seed)
    return [(gen.integers(0, 1000, shape), gen.standard_normal(shape)) for _ in range(n)]


def test_device_loader_gives_every_batch_on_the_device():
    batches = _batches(7, (4, 16), 1)
    loader = DeviceLoader(iter(batches), DEV)
    got = list(loader)
    assert len(got) == len(batches)
    for (x, y), (a, b) in zip(got, batches, strict=True):
        assert x.device == DEV and x.dtype == "int64" and y.dtype == "float64"
        # A kernel on the consuming stream sees the copied data.
        np.testing.assert_array_equal(x.to("float64").numpy(), a)
        np.testing.assert_array_equal((y * 1.0).numpy(), b)


@needs_async
def test_device_loader_reuses_host_buffers_only_after_their_copies():
    """With the copy stream held up, the host runs ahead; the loader must not refill a pinned buffer whose
    copy has not run, or an earlier batch would arrive with later data."""
    batches = _batches(9, (8, 32), 2)
    loader = DeviceLoader(iter(batches), DEV, depth=2)
    keep = _busy(loader.copy_stream, n=192 if DEV.startswith("sim") else 2048, k=40)  # the copies queue behind
    got = [y for _, y in loader]
    for y, (_, b) in zip(got, batches, strict=True):
        np.testing.assert_array_equal((y * 1.0).numpy(), b)
    del keep


def test_device_loader_resumes_where_the_batches_handed_out_end(tmp_path):
    tokens = np.random.default_rng(3).integers(0, 50, 2000)
    a = DeviceLoader(DataLoader(tokens, 2, 8, shuffle=True, seed=5), DEV)
    for _ in range(3):
        next(a)
    state = a.state_dict()
    expected = [x.numpy() for x, _ in (next(a) for _ in range(2))]
    b = DeviceLoader(DataLoader(tokens, 2, 8, shuffle=True, seed=5), DEV)
    b.load_state_dict(state)
    got = [x.numpy() for x, _ in (next(b) for _ in range(2))]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)
