"""One runtime accessor for every device type: devices, synchronisation,
streams, events and memory statistics. Devices are strings: "cpu", "sim:1".

Kernels run on the calling thread's current stream of their device. Streams
come from a per-device pool (up to 32, handed out in turn) and live for the
process, like PyTorch's. Memory comes from the core's caching allocator: a
freed block is reused at once on its own stream, and waits for other streams
that used it (the dispatcher records such use).
"""

import contextlib

from infinitrain import _C

Stream = _C.Stream
Event = _C.Event
OutOfMemoryError = _C.OutOfMemoryError


class Device(str):
    """A device: its canonical name, a `str` ("cpu", "cuda:1"), with PyTorch's `type` and `index`."""

    __slots__ = ()

    @property
    def type(self):
        return self.partition(":")[0]

    @property
    def index(self):
        _, sep, i = self.partition(":")
        return int(i) if sep else None

    def __repr__(self):
        return f"device({str.__repr__(self)})"

    def __reduce__(self):
        return (Device, (str(self),))


_DEVICES = {}


def device_object(name):
    """The (interned) Device of a canonical device name."""
    d = _DEVICES.get(name)
    if d is None:
        d = _DEVICES[name] = Device(name)
    return d


def parse_device(device):
    """The canonical name of a device ("sim" -> "sim:0"); registers a provider on first use of its name."""
    if isinstance(device, int) and not isinstance(device, bool):
        raise ValueError(f"a device is a name such as 'cpu' or 'cuda:0', got the integer {device}")
    return device_object(_C.parse_device(device))


def device_count(device_type):
    """Devices of a type ("cpu" has one); initialises that type's runtime."""
    return _C.device_count(device_type)


def current_device(device_type):
    """The calling thread's current device of a type (kernels launch there)."""
    return _C.current_device(device_type)


def set_device(device):
    _C.set_device(device)


def synchronize(device="cpu"):
    """Waits for all work on the device (all its streams); raises the device's pending asynchronous error."""
    _C.synchronize(device)


def default_stream(device):
    return _C.default_stream(device)


def current_stream(device):
    return _C.current_stream(device)


@contextlib.contextmanager
def stream(s):
    """Runs the ops issued inside on stream `s` (for s's device, in this thread)."""
    prev = _C.current_stream(s.device)
    _C.set_current_stream(s)
    try:
        yield s
    finally:
        _C.set_current_stream(prev)


def memory_stats(device):
    """The device's caching allocator, in bytes: allocated, reserved (held from the device), cached (free
    blocks ready for reuse), pending (freed blocks waiting for other streams), peak_allocated,
    peak_reserved; and the counts num_allocs and num_ooms."""
    return _C.memory_stats(device)


def memory_allocated(device):
    return _C.memory_stats(device)["allocated"]


def max_memory_allocated(device):
    return _C.memory_stats(device)["peak_allocated"]


def reset_peak_memory_stats(device):
    _C.reset_peak_memory(device)


def empty_cache(device):
    """Returns the device's unused cached memory to the device."""
    _C.empty_cache(device)
