"""One runtime accessor for every device type: counts, synchronisation,
streams, events and memory statistics. Devices are strings: "cpu", "sim:1"."""

import contextlib

from infinitrain import _C

Stream = _C.Stream
Event = _C.Event


def device_count(device_type):
    """Devices of a type ("cpu" has one); initialises that type's runtime."""
    return _C.device_count(device_type)


def synchronize(device="cpu"):
    """Waits for all work on the device (all its streams)."""
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
    """{'allocated', 'reserved', 'peak_allocated', 'num_allocs'} in bytes (num_allocs: a count)."""
    return _C.memory_stats(device)


def memory_allocated(device):
    return _C.memory_stats(device)["allocated"]


def max_memory_allocated(device):
    return _C.memory_stats(device)["peak_allocated"]


def reset_peak_memory_stats(device):
    _C.reset_peak_memory(device)


def parse_device(device):
    """The canonical name of a device string ("sim" -> "sim:0"); registers its provider on first use.
    Raises ValueError for an unknown device type or index."""
    return _C.parse_device(device)
