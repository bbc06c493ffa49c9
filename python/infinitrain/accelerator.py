"""Device namespaces with PyTorch's names: `it.cuda`, `it.sim`, `it.maca`, ... one generic class for every
device type, so a provider gets its namespace without code of its own here.

`it.<name>` exists for every provider this build contains and for PyTorch's accelerator names (cuda, xpu,
mps, mtia), which report themselves unavailable when no provider of that name is built in: a script's
`torch.cuda.is_available()` then answers False on a cpu-only build instead of failing.

Differences from PyTorch: one counter-based generator serves every device (so `it.cuda.manual_seed` seeds the
same generator as `it.manual_seed`), and only one provider is active in a process.
"""

import contextlib

from infinitrain import _C, backends, runtime
from infinitrain import random as _random

# PyTorch's device-module names: present on every build, available only when a provider of the name is built in.
PYTORCH_DEVICE_MODULES = ("cuda", "xpu", "mps", "mtia")


def names():
    """The device-module names `it.<name>` answers to."""
    return tuple(sorted(set(PYTORCH_DEVICE_MODULES) | set(backends.available())))


class _Amp:
    """`it.<device>.amp`: autocast and GradScaler bound to the device type."""

    def __init__(self, device_type):
        self._type = device_type

    def autocast(self, enabled=True, dtype=None, cache_enabled=True):
        from infinitrain.amp import autocast

        return autocast(self._type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def GradScaler(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, enabled=True):  # noqa: N802
        from infinitrain.amp import GradScaler

        return GradScaler(self._type, init_scale, growth_factor, backoff_factor, growth_interval, enabled)


class DeviceModule:
    """The namespace of one device type (`it.cuda`): availability, devices, synchronisation, seeds, memory
    statistics, streams and events, as torch.cuda names them."""

    def __init__(self, name):
        self._name = name
        self.amp = _Amp(name)

    def __repr__(self):
        return f"<infinitrain device module '{self._name}'>"

    # ---- availability and devices ----
    def is_available(self):
        """Whether a provider of this name is built in, can be (or is) the process's provider, and has devices."""
        return self.device_count() > 0

    def is_initialized(self):
        info = _C.privateuse1()
        return info is not None and info["name"] == self._name

    def init(self):
        backends.register(self._name)

    def device_count(self):
        if self._name not in backends.available():
            return 0
        info = _C.privateuse1()
        if info is not None and info["name"] != self._name:
            return 0  # another provider holds the slot in this process
        try:
            return runtime.device_count(self._name)
        except (RuntimeError, ValueError):
            return 0  # built in, but its runtime finds no device (no driver, no GPU)

    def _device(self, device=None):
        """A device of this type as a string: None is the current one, an int an index."""
        if device is None:
            return runtime.current_device(self._name)
        if isinstance(device, int) and not isinstance(device, bool):
            return runtime.parse_device(f"{self._name}:{device}")
        d = runtime.parse_device(str(device))
        if d.split(":")[0] != self._name:
            raise ValueError(f"expected a {self._name} device, got {device!r}")
        return d

    def current_device(self):
        """The calling thread's current device index."""
        return int(runtime.current_device(self._name).split(":")[1])

    def set_device(self, device):
        runtime.set_device(self._device(device))

    @contextlib.contextmanager
    def device(self, device):
        """Makes `device` current inside the block (torch.cuda.device)."""
        prev = runtime.current_device(self._name)
        runtime.set_device(self._device(device))
        try:
            yield
        finally:
            runtime.set_device(prev)

    def get_device_name(self, device=None):
        return self._device(device)

    def synchronize(self, device=None):
        runtime.synchronize(self._device(device))

    def is_bf16_supported(self, including_emulation=True):
        """Every kernel of a provider has bfloat16 variants, so: whether the device type is available."""
        return self.is_available()

    # ---- seeds: one counter-based generator for every device ----
    def manual_seed(self, seed):
        _random.manual_seed(seed)

    def manual_seed_all(self, seed):
        _random.manual_seed(seed)

    def seed(self):
        return _random.seed()

    def seed_all(self):
        return _random.seed()

    def initial_seed(self):
        return _random.initial_seed()

    # ---- memory (the core's caching allocator) ----
    def memory_allocated(self, device=None):
        return runtime.memory_stats(self._device(device))["allocated"]

    def max_memory_allocated(self, device=None):
        return runtime.memory_stats(self._device(device))["peak_allocated"]

    def memory_reserved(self, device=None):
        return runtime.memory_stats(self._device(device))["reserved"]

    def max_memory_reserved(self, device=None):
        return runtime.memory_stats(self._device(device))["peak_reserved"]

    def reset_peak_memory_stats(self, device=None):
        runtime.reset_peak_memory_stats(self._device(device))

    def reset_max_memory_allocated(self, device=None):
        runtime.reset_peak_memory_stats(self._device(device))

    def memory_stats(self, device=None):
        return runtime.memory_stats(self._device(device))

    def empty_cache(self):
        if self.is_initialized():
            for i in range(self.device_count()):
                runtime.empty_cache(f"{self._name}:{i}")

    # ---- streams and events ----
    def Stream(self, device=None, priority=0):  # noqa: N802 (PyTorch's name)
        """A stream of the device from the pool (priority is accepted and not used)."""
        return runtime.Stream(self._device(device))

    def Event(self, enable_timing=False, blocking=False, interprocess=False):  # noqa: N802
        return Event(self._name, enable_timing)

    def current_stream(self, device=None):
        return runtime.current_stream(self._device(device))

    def default_stream(self, device=None):
        return runtime.default_stream(self._device(device))

    def stream(self, stream):
        """Runs the ops issued inside on `stream` (None: leave the current one)."""
        return runtime.stream(stream) if stream is not None else contextlib.nullcontext()

    def set_stream(self, stream):
        _C.set_current_stream(stream)


class Event:
    """torch.cuda.Event: record on a stream, wait, query, time. The native event is made on first record, on the
    device of the stream it records."""

    def __init__(self, device_type, enable_timing=False):
        self._type = device_type
        self._event = None
        self.enable_timing = enable_timing

    def record(self, stream=None):
        if stream is None:
            stream = runtime.current_stream(runtime.current_device(self._type))
        if self._event is None:
            self._event = runtime.Event(stream.device)
        self._event.record(stream)

    def wait(self, stream=None):
        if self._event is None:
            return
        if stream is None:
            stream = runtime.current_stream(self._event.device)
        stream.wait_event(self._event)

    def query(self):
        return True if self._event is None else self._event.query()

    def synchronize(self):
        if self._event is not None:
            self._event.synchronize()

    def elapsed_time(self, end_event):
        """Milliseconds from this event to end_event (both recorded and complete)."""
        if self._event is None or end_event._event is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return self._event.elapsed_ms(end_event._event)


_MODULES = {}


def module(name):
    """The (cached) namespace of device type `name`."""
    m = _MODULES.get(name)
    if m is None:
        m = _MODULES[name] = DeviceModule(name)
    return m
